"""In-flight weight updates: a running generate() call adopts new weights between two engine steps.

Claims, for every proposer, on the fast path and on eager:
    versions               each row's tokens carry 0 up to the update, 1 after it (non-decreasing, both present);
    logprobs per version   every token's logprob == transformers' log_softmax of the model of ITS version
                           over the same prefix (<= 1e-4): the cache was recomputed, nothing of the old
                           weights leaks into a later token;
    temperature 0          the output == greedy decoding of the old model up to the update, then of the
                           new model from there (speculation on == off across the update);
    a call without updates is unchanged (the hook runs, the version stays, nothing is recomputed).
The async pipeline's side (actors offered a version mid-request, the bound on every token) is in
test_async.py.
"""
from __future__ import annotations

import pytest
import torch

from helpers import save_random_checkpoint
from specrl.models.checkpoint import load_state_dict
from specrl.sampling import SamplingParams
from test_engine import PROMPTS, make_engine

PROPOSERS = ["none", "ngram", "suffix", "draft", "eagle3", "mtp", "hybrid"]
PATHS = pytest.mark.parametrize("fast", [True, False], ids=["fast", "eager"])


@pytest.fixture(scope="module")
def new_dir(tmp_path_factory):
    """Weights of the same shape as `target_dir`'s, different values: the 'next version'."""
    path = tmp_path_factory.mktemp("next_version")
    save_random_checkpoint(path, layers=2, hidden=64, seed=5)
    return path


def update_after(engine, steps: int, state: dict, version: int = 1):
    """A between-steps hook that loads `state` as `version` after the engine's `steps`-th step."""
    calls = []

    def hook():
        calls.append(None)
        if len(calls) == steps:
            engine.load_weights(state, version)
    return hook


def hf_logprobs(checkpoint, prompt, tokens, temperature=1.0):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    seq = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logprobs = (model(seq).logits[0, len(prompt) - 1:-1] / temperature).log_softmax(-1)
    return logprobs.gather(-1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)


@PATHS
@pytest.mark.parametrize("proposer", PROPOSERS)
def test_tokens_after_an_update_are_sampled_from_the_new_weights(target_dir, draft_dir, new_dir, proposer, fast):
    engine = make_engine(target_dir, proposer, draft_dir, k=3, fast=fast)
    hook = update_after(engine, 1, load_state_dict(new_dir))
    result = engine.generate(PROMPTS, SamplingParams(n=2, max_tokens=16, seed=3, ignore_eos=True), between_steps=hook)
    assert result.weight_updates == 1 and engine.version == 1
    for completion in result.completions:
        versions, prompt = completion.versions, completion.prompt_ids
        first_new = versions.index(1)  # after one step: between 1 and k + 1 tokens of version 0
        assert 1 <= first_new <= 4 and versions == [0] * first_new + [1] * (len(versions) - first_new)
        expected = torch.cat([hf_logprobs(target_dir, prompt, completion.token_ids)[:first_new],
                              hf_logprobs(new_dir, prompt, completion.token_ids)[first_new:]])
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4), proposer


@pytest.mark.parametrize("proposer", ["none", "eagle3", "draft", "hybrid"])
def test_greedy_output_across_an_update_is_old_greedy_then_new_greedy(target_dir, draft_dir, new_dir, proposer):
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    engine = make_engine(target_dir, proposer, draft_dir, k=3)
    result = engine.generate(PROMPTS, greedy, between_steps=update_after(engine, 2, load_state_dict(new_dir)))
    old, new = make_engine(target_dir), make_engine(new_dir)
    for completion in result.completions:
        split = completion.versions.index(1)
        head, tail = completion.token_ids[:split], completion.token_ids[split:]
        prompt = completion.prompt_ids
        assert head == old.generate([prompt], greedy).completions[0].token_ids[:split]
        continued = new.generate([prompt + head], SamplingParams(temperature=0, max_tokens=len(tail), ignore_eos=True))
        assert tail == continued.completions[0].token_ids


def test_a_hook_that_loads_nothing_changes_nothing(target_dir):
    params = SamplingParams(n=2, max_tokens=12, seed=4, ignore_eos=True)
    plain = make_engine(target_dir, "eagle3").generate(PROMPTS, params)
    calls = []
    hooked = make_engine(target_dir, "eagle3").generate(PROMPTS, params, between_steps=lambda: calls.append(None))
    assert [c.token_ids for c in hooked.completions] == [c.token_ids for c in plain.completions]
    assert hooked.weight_updates == 0 and len(calls) == hooked.steps - 1  # not after the last step


@pytest.mark.parametrize("how", ["engine", "model"])
def test_a_mid_call_load_that_keeps_the_version_is_refused(target_dir, new_dir, how):
    """A load between steps under the call's own version would make the later tokens indistinguishable from the
    earlier ones (and, unnoticed, scored over the old weights' K/V). Through `engine.load_weights` it is
    refused before anything is replaced; straight into the model it is caught by the layer list's identity."""
    engine = make_engine(target_dir, "eagle3", k=3)
    before = engine.model.layers
    state = load_state_dict(new_dir)

    def hook():
        if how == "engine":
            engine.load_weights(state, engine.version)
        else:
            engine.model.load_weights(state)

    with pytest.raises(ValueError, match="kept version 0" if how == "model" else "version 0, the version of the call"):
        engine.generate(PROMPTS, SamplingParams(max_tokens=8, seed=0, ignore_eos=True), between_steps=hook)
    assert (engine.model.layers is before) == (how == "engine") and not engine.generating
    engine.load_weights(state, 0)  # between calls the version is the caller's to keep
    assert len(engine.generate(PROMPTS, SamplingParams(max_tokens=4)).completions) == len(PROMPTS)

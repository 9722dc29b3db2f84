"""The vLLM backend without speculation: parity with the embedded engine and with the trainer.

Chain of invariants (the speculation modules build on 1):
  1. at temperature 0, vLLM == the embedded engine, token for token, on the same checkpoint;
  2. vLLM's logprob of each sampled token == transformers' (the trainer's) log-softmax under
     the same sampling distribution, within 1e-4 in fp32: greedy (unscaled distribution)
     and sampled at temperature 0.8 with top-k and top-p;
  3. after a policy refit the engine serves the new weights: 1 and 2 hold for them, and
     every token carries the new version; refitting the old weights brings the old tokens back.
One in-process engine serves the whole module.
"""
from __future__ import annotations

import pytest

pytest.importorskip("vllm.sampling_params", reason="needs the vllm extra: pip install -e '.[vllm]'")

from specrl.backends import BackendConfig, make_backend  # noqa: E402
from specrl.backends.vllm import VLLMOptions  # noqa: E402
from specrl.sampling import SamplingParams  # noqa: E402
from vllm_fixtures import (EOS, PROMPTS, embedded, reference_logprobs, save_checkpoint,  # noqa: E402
                           state_dict)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
GREEDY = SamplingParams(temperature=0, max_tokens=24)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = tmp_path_factory.mktemp("vllm_target")
    return path, save_checkpoint(path, seed=0)


@pytest.fixture(scope="module")
def new_policy(tmp_path_factory):
    """Different weights for the same architecture: what a trainer step would send (made large to be visible)."""
    path = tmp_path_factory.mktemp("vllm_new_policy")
    return path, save_checkpoint(path, seed=7)


@pytest.fixture(scope="module")
def backend(target):
    b = make_backend(BackendConfig(backend="vllm", model=str(target[0])), VLLMOptions.for_tests())
    yield b
    b.close()


def tokens_of(result):
    return [c.token_ids for c in result.completions]


def test_greedy_tokens_equal_the_embedded_engines(backend, target):
    ours = backend.generate(PROMPTS, GREEDY)
    theirs = embedded(target[0]).generate(PROMPTS, GREEDY)
    assert tokens_of(ours) == tokens_of(theirs)
    assert [c.finish_reason for c in ours.completions] == [c.finish_reason for c in theirs.completions]
    assert sum(len(t) for t in tokens_of(ours)) > 3 * len(PROMPTS)  # not a trivially short comparison


def test_every_exponential_race_draw_takes_float64_noise(backend):
    """vLLM samples (plainly, after a rejection, a probabilistic draft) by argmax p / E; with float32 noise an id
    of ~1e-8 the leader's mass is drawn far less often than its probability, so the backend turns on vLLM's
    float64 noise. The samples' law itself is the chi-square tests' (`test_cpu_sampling_plugin.py`)."""
    assert backend.llm.llm_engine.model_config.use_fp64_gumbel is True


def test_greedy_logprobs_equal_the_trainers_log_softmax(backend, target):
    result = backend.generate(PROMPTS, GREEDY)
    for prompt, c in zip(PROMPTS, result.completions):
        expected = reference_logprobs(target[1], prompt, c.token_ids, GREEDY)
        assert c.logprobs == pytest.approx(expected, abs=1e-4)


def test_sampled_logprobs_are_under_the_tempered_truncated_distribution(backend, target):
    params = SamplingParams(temperature=0.8, top_k=8, top_p=0.9, max_tokens=24, n=2, seed=11)
    result = backend.generate(PROMPTS, params)
    assert len(result.completions) == 2 * len(PROMPTS)
    for c in result.completions:
        expected = reference_logprobs(target[1], PROMPTS[c.prompt_index], c.token_ids, params)
        assert c.logprobs == pytest.approx(expected, abs=1e-4)


def test_samples_come_back_prompt_major_and_a_seed_repeats_them(backend):
    params = SamplingParams(temperature=1.0, max_tokens=12, n=3, seed=5)
    first, second = backend.generate(PROMPTS[:2], params), backend.generate(PROMPTS[:2], params)
    assert [(c.prompt_index, c.sample_index) for c in first.completions] == [(p, s) for p in range(2) for s in range(3)]
    assert tokens_of(first) == tokens_of(second)
    assert all(c.versions == [backend.version] * len(c.token_ids) for c in first.completions)


def test_text_prompts_stop_tokens_and_stop_strings_behave_like_the_embedded_engine(backend, target):
    text_prompts = ["12+34=", "abc abc a"]
    greedy = backend.generate(text_prompts, GREEDY)
    stop_at = greedy.completions[0].token_ids[2]  # a token the first response emits
    params = SamplingParams(temperature=0, max_tokens=24, stop_token_ids=(stop_at,))
    ours, theirs = backend.generate(text_prompts, params), embedded(target[0]).generate(text_prompts, params)
    assert tokens_of(ours) == tokens_of(theirs)
    assert ours.completions[0].finish_reason == "stop" and ours.completions[0].token_ids[-1] == stop_at
    assert [c.text for c in ours.completions] == [c.text for c in theirs.completions]
    stop_text = greedy.completions[1].text[3:5]  # a string the second response writes
    params = SamplingParams(temperature=0, max_tokens=24, stop=(stop_text,))
    ours, theirs = backend.generate(text_prompts, params), embedded(target[0]).generate(text_prompts, params)
    assert tokens_of(ours) == tokens_of(theirs)
    assert [c.text for c in ours.completions] == [c.text for c in theirs.completions]
    assert ours.completions[1].finish_reason == "stop" and stop_text not in ours.completions[1].text
    ignore = backend.generate(text_prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert all(len(c.token_ids) == 24 and c.finish_reason == "length" for c in ignore.completions)


def test_no_speculation_reports_zero_draft_counters_and_counts_steps(backend):
    result = backend.generate(PROMPTS, GREEDY)
    assert result.spec.num_drafts == 0 and result.spec.num_draft_tokens == 0
    longest = max(len(c.token_ids) for c in result.completions)
    assert result.steps >= longest  # one engine step per token of the longest response, plus prefill
    assert result.k_histogram == {0: result.steps}


def test_policy_refit_serves_the_new_weights_and_stamps_their_version(backend, target, new_policy):
    old = backend.generate(PROMPTS, GREEDY)
    backend.sync_weights(state_dict(new_policy[1]), version=5)
    try:
        new = backend.generate(PROMPTS, GREEDY)
        assert tokens_of(new) != tokens_of(old)
        assert tokens_of(new) == tokens_of(embedded(new_policy[0]).generate(PROMPTS, GREEDY))
        for prompt, c in zip(PROMPTS, new.completions):
            assert c.logprobs == pytest.approx(reference_logprobs(new_policy[1], prompt, c.token_ids, GREEDY), abs=1e-4)
            assert c.versions == [5] * len(c.token_ids)
    finally:
        backend.sync_weights(state_dict(target[1]), version=6)
    assert tokens_of(backend.generate(PROMPTS, GREEDY)) == tokens_of(old)


def test_a_refit_with_a_missing_or_misshapen_tensor_is_refused_and_the_engine_keeps_serving(backend, target):
    state = state_dict(target[1])
    version = backend.version
    missing = {k: v for k, v in state.items() if k != "model.norm.weight"}
    with pytest.raises(ValueError, match="missing model.norm.weight"):
        backend.sync_weights(missing, version=99)
    wrong = {**state, "model.norm.weight": state["model.norm.weight"][:10]}
    with pytest.raises(ValueError, match="model.norm.weight"):
        backend.sync_weights(wrong, version=99)
    with pytest.raises(ValueError, match="no draft model"):
        backend.sync_weights(state, version=99, draft=state)
    assert backend.version == version
    assert backend.generate(PROMPTS[:1], GREEDY).completions[0].token_ids


def test_a_refit_whose_prefix_cache_cannot_be_reset_raises_and_keeps_the_old_version(backend, target, monkeypatch):
    """vLLM answers False when KV blocks are still held (running requests): old-weight KV could then be
    served, so the refit must not be stamped with the new version."""
    version = backend.version
    monkeypatch.setattr(backend.llm, "reset_prefix_cache", lambda *args, **kwargs: False)
    with pytest.raises(RuntimeError, match="could not reset its prefix cache after the weight refit to version 99"):
        backend.sync_weights(state_dict(target[1]), version=99)
    assert backend.version == version
    monkeypatch.undo()
    backend.sync_weights(state_dict(target[1]), version=version + 1)  # the real reset succeeds when idle
    assert backend.version == version + 1
    assert backend.generate(PROMPTS[:1], GREEDY).completions[0].versions[0] == version + 1

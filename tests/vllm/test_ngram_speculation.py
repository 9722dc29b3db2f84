"""vLLM speculative decoding with the n-gram (prompt lookup) proposer: exactness.

N-gram drafts are deterministic (one-hot proposals), so exactness needs no draft model:
  1. at temperature 0, speculation on == off (the embedded engine without speculation,
     which test_parity.py shows equals vLLM without speculation), token for token;
  2. at temperature 1, the sampled tokens' logprobs match sampling without speculation
     within noise, while drafts are actually proposed and some accepted.
One in-process engine serves the module: the target with ngram, K = 3.
"""
from __future__ import annotations

import pytest

pytest.importorskip("vllm.sampling_params", reason="needs the vllm extra: pip install -e '.[vllm]'")

from specrl.backends import BackendConfig, make_backend  # noqa: E402
from specrl.backends.vllm import VLLMOptions  # noqa: E402
from specrl.sampling import SamplingParams  # noqa: E402
from vllm_fixtures import PROMPTS, completion_means, embedded, save_checkpoint, two_sample_z  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = tmp_path_factory.mktemp("ngram_target")
    save_checkpoint(path, seed=0)
    return path


@pytest.fixture(scope="module")
def backend(target):
    config = BackendConfig(backend="vllm", model=str(target), proposer="ngram", num_speculative_tokens=3)
    b = make_backend(config, VLLMOptions.for_tests())
    yield b
    b.close()


def test_greedy_ngram_speculation_emits_the_same_tokens_as_no_speculation(backend, target):
    params = SamplingParams(temperature=0, max_tokens=32)
    on = backend.generate(PROMPTS, params)
    off = embedded(target).generate(PROMPTS, params)
    assert [c.token_ids for c in on.completions] == [c.token_ids for c in off.completions]
    assert on.spec.num_accepted_tokens > 0  # the proposer took part


def test_ngram_sampled_logprobs_match_sampling_without_speculation_within_noise(backend, target):
    """Two-sample z-test of per-completion mean logprobs, 96 completions a side; |z| > 4.5 by
    chance has probability ~7e-6."""
    on = backend.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=24, n=16, seed=1))
    off = embedded(target).generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=24, n=16, seed=2))
    assert on.spec.num_drafts > 0 and on.spec.num_accepted_tokens > 0
    assert two_sample_z(completion_means(on), completion_means(off)) < 4.5

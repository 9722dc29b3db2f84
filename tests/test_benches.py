"""The benchmarks' inputs: defaults that fit the chosen model, and bad values refused before any engine starts."""
from __future__ import annotations

import pytest

from specrl.bench.rollout_bench import RolloutBenchConfig, bench_inputs, run_rollout_bench


def test_default_response_cap_fits_tinys_short_context():
    prompts, max_tokens = bench_inputs("tiny", 4, seed=0, max_tokens=None, k=3)
    assert len(prompts) == 4 and 1 <= max_tokens <= 64 - 3 - 6


def test_a_cap_that_does_not_fit_is_refused_before_any_engine_starts(monkeypatch):
    def no_engine(*args, **kwargs):
        raise AssertionError("an engine was started before the inputs were checked")

    monkeypatch.setattr("specrl.bench.rollout_bench.make_backend", no_engine)
    with pytest.raises(ValueError, match="--max-tokens 128 does not fit tiny's context"):
        run_rollout_bench(RolloutBenchConfig(model="tiny", backend="vllm", max_tokens=128))

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


def test_ignore_eos_times_the_same_token_count_in_both_variants():
    """At temperature 1 the variants sample different responses; with ignore_eos every row runs to
    max_tokens, so both time 16 tokens per row (tiny's answers end after ~9), and each round's ratio is
    reported. A round at batch 2 times the default 8 rows: 4 calls."""
    summary = run_rollout_bench(RolloutBenchConfig(model="tiny", proposer="ngram", batch=2, max_tokens=16, rounds=2,
                                                   hf=False, ignore_eos=True))
    assert summary["mean_response_tokens"] == summary["mean_response_tokens_spec"] == 16
    assert len(summary["speedup_per_round"]) == 2 and summary["greedy_match"]
    assert summary["calls_per_round"] == 4 and summary["rows_timed"] == 2 * 8

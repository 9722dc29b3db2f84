"""`specrl bench drafters`: every proposer against plain decoding, round by round."""
import statistics

from specrl.bench.drafters_bench import DraftersBenchConfig, run_drafters_bench
from specrl.models import registry


def test_the_speedup_is_the_median_of_each_rounds_paired_ratio():
    """Each round times plain decoding, each proposer, and plain decoding again on the same prompts and seeds; the
    speedup is the median over rounds of a round's rate over its plain calls' rate, so that the machine's speed
    drifting between rounds cancels out of it, and how far the two plain calls differ is reported as the noise."""
    config = DraftersBenchConfig(model="tiny", proposers=("ngram", "int8"), batches=(1, 4), max_tokens=8, rounds=3,
                                 plot=None, threads=1)
    summary = run_drafters_bench(config)
    assert [(row["proposer"], row["batch"]) for row in summary["rows"]] == \
        [("ngram", 1), ("int8", 1), ("ngram", 4), ("int8", 4)]
    for row in summary["rows"]:
        assert len(row["speedup_rounds"]) == config.rounds and min(row["speedup_rounds"]) > 0
        assert row["speedup"] == statistics.median(row["speedup_rounds"])
        assert row["acceptance_length"] >= 1.0 and row["tokens_per_s"] > 0
        assert sum(row["plan_reasons"].values()) == sum(row["k_histogram"].values())  # every step says why
    assert set(summary["plain_spread"]) == {1, 4} and all(spread >= 0 for spread in summary["plain_spread"].values())
    assert summary["best"]["speedup"] == max(row["speedup"] for row in summary["rows"])
    assert summary["fp32_kernel"] in ("avx512", "avx2", "eager") and summary["cpu_class"]



def test_a_proposer_whose_checkpoint_is_missing_is_skipped_and_named(monkeypatch, tmp_path):
    """A draft that was never made (here `tiny`'s MTP head, as if not shipped, with an empty cache) is skipped and
    named with the command that makes it; with no proposer left nothing is timed."""
    monkeypatch.setenv("SPECRL_CACHE", str(tmp_path))
    monkeypatch.setattr(registry, "SHIPPED", tuple(name for name in registry.SHIPPED if name != "tiny-mtp"))
    summary = run_drafters_bench(DraftersBenchConfig(model="tiny", proposers=("mtp",), batches=(1,), max_tokens=4,
                                                     rounds=1, plot=None, threads=1))
    assert summary["rows"] == [] and summary["plain_spread"] == {} and summary["best"] is None
    assert "specrl train-draft --target tiny --kind mtp" in summary["skipped"]["mtp"]

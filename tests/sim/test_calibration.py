"""Calibration errors stay under their bounds; the bench validator works on hand-made records."""
import json

import pytest

from specrl.sim.calibration import calibration_table, cpu_rows, validate_against_bench
from specrl.sim.fit import fit_cpu_efficiency
from specrl.sim.hardware import CPU_CALIBRATION_PATH


@pytest.fixture(scope="module")
def rows():
    return {r["name"]: r for r in calibration_table()}


@pytest.mark.parametrize("name", [
    "seed-8b generation speedup K=3", "seed-8b step speedup K=3", "vllm-h100 speedup batch 1",
])
def test_gpu_targets_stay_within_their_bounds(rows, name):
    assert rows[name]["ok"], rows[name]


def test_sglang_eagle3_batch_64_prediction_stays_within_fifteen_percent(rows):
    row = next(r for n, r in rows.items() if n.startswith("sglang-eagle3 speedup batch 64"))
    assert abs(row["error"]) <= 0.15


def test_vllm_batch_128_known_shortfall_does_not_grow(rows):
    """Documented miss: the max-roofline over-prices verification at batch 128 (about -16% vs 15% target)."""
    assert abs(rows["vllm-h100 speedup batch 128"]["error"]) <= 0.20


def test_every_row_reports_published_predicted_and_error(rows):
    for r in rows.values():
        assert r["error"] == pytest.approx(r["predicted"] / r["published"] - 1.0, abs=2e-3)


def test_cpu_fit_reproduces_its_own_fit_points_within_25_percent():
    data = json.loads(CPU_CALIBRATION_PATH.read_text())
    refit = fit_cpu_efficiency(data["records"], data["device"]["peak_flops"], data["device"]["mem_bw"])
    assert refit["mfu_table"] == [list(p) for p in data["efficiency"]["mfu_table"]] or refit["mfu_table"] == [
        tuple(p) for p in data["efficiency"]["mfu_table"]]
    assert refit["mbu"] == pytest.approx(data["efficiency"]["mbu"])


def test_cpu_rows_cover_every_holdout_and_the_reference_table():
    names = [r["name"] for r in cpu_rows()]
    data = json.loads(CPU_CALIBRATION_PATH.read_text())
    assert len(names) == len(data["holdout"]) + 6


def test_validate_against_bench_compares_hand_made_records():
    records = [
        {"model": "tiny", "proposer": "ngram", "batch": 1, "k": 3, "tokens_per_s_base": 1000.0,
         "tokens_per_s_spec": 2000.0, "speedup": 2.0, "acceptance_length": 2.5},
        {"model": "smollm2-135m", "proposer": "ngram", "batch": 8, "k": 3, "tokens_per_s_base": 40.0,
         "tokens_per_s_spec": 40.0, "speedup": 1.0, "acceptance_length": 2.0},
    ]
    out = validate_against_bench(records)
    assert [r["model"] for r in out] == ["tiny", "smollm2-135m"]
    for r in out:
        assert r["error"] == pytest.approx(r["predicted_speedup"] / r["speedup"] - 1.0, abs=1e-3)
        assert isinstance(r["ok"], bool)
    # Zero-cost n-gram drafts on an overhead-bound tiny model: the speedup approaches the acceptance length.
    assert out[0]["predicted_speedup"] > 1.5


def test_validate_against_bench_rejects_unknown_proposers():
    with pytest.raises(ValueError, match="proposer"):
        validate_against_bench([{"model": "tiny", "proposer": "oracle", "batch": 1, "k": 1, "speedup": 1.0,
                                 "acceptance_length": 1.5}])

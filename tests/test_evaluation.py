"""Held-out evaluation: the pass@k estimator, its interval, the held-out split, `specrl eval`."""
from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from specrl.pipeline.evaluation import pass_at_k, summarise
from specrl.tasks import TaskConfig, make_task


@pytest.mark.parametrize("n,c,k", [(4, 1, 2), (5, 2, 3), (8, 0, 4), (6, 6, 1), (7, 3, 7)])
def test_pass_at_k_is_the_chance_that_k_of_the_n_samples_drawn_without_replacement_hold_a_correct_one(n, c, k):
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    exact = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_summary_reports_the_mean_over_problems_with_a_normal_interval():
    out = summarise([1, 0, 1, 1], n=1)
    assert out["pass@1"] == 0.75
    half = 1.96 * (0.75 * 0.25) ** 0.5 / 2
    assert out["pass@1_ci95"] == [round(0.75 - half, 4), round(min(1.0, 0.75 + half), 4)]
    assert "pass@2" not in out
    assert set(summarise([2, 0], n=4)) >= {"pass@1", "pass@2", "pass@4"}


def test_the_held_out_set_is_the_tasks_tail_and_a_run_that_reaches_it_is_refused():
    task = make_task(TaskConfig(name="arithmetic", size=1000))
    assert task.held_out(3) == [task[999], task[998], task[997]]
    task.check_held_out(100, trained_positions=900)
    with pytest.raises(ValueError, match="overlaps the 901 problems this run trains on"):
        task.check_held_out(100, trained_positions=901)


def test_specrl_eval_prints_pass_at_k_for_a_model_and_for_a_run(tmp_path):
    out = subprocess.run([sys.executable, "-m", "specrl.cli", "eval", "tiny", "--prompts", "32", "--n", "2",
                          "--threads", "1"], check=True, capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["problems"] == 32 and 0.0 <= result["pass@1"] <= result["pass@2"] <= 1.0
    lo, hi = result["pass@1_ci95"]
    assert lo <= result["pass@1"] <= hi
    subprocess.run([sys.executable, "-m", "specrl.cli", "train", "--preset", "tiny", "run.steps=1",
                    f"run.run_dir={tmp_path}", "run.tensorboard=false", "rollout.prompts_per_step=4"],
                   check=True, capture_output=True)
    out = subprocess.run([sys.executable, "-m", "specrl.cli", "eval", str(tmp_path), "--prompts", "16",
                          "--threads", "1"], check=True, capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["evaluated"].endswith("step_000001") and result["task"] == "arithmetic"


def test_a_run_evaluates_held_out_pass_at_1_and_plots_it_with_the_drain(tmp_path):
    from specrl.pipeline.loop import Pipeline
    from specrl.telemetry.run_plots import plot_run
    from test_pipeline import small_config

    pipeline = Pipeline(small_config(tmp_path, "run.steps=3", "eval.every=2", "eval.prompts=16"))
    summary = pipeline.run()
    records = pipeline.history
    assert records[0]["eval_start"]["policy_version"] == 0
    assert [r["eval"]["policy_version"] for r in records if "eval" in r] == [2, 3]  # every 2nd step and the last
    assert summary["eval_versions"] == [0, 3]
    for r in records:
        assert r["step_seconds"] == pytest.approx(sum(v for s, v in r["timing"].items() if s != "eval"))
        live = [entry[1] for entry in r["drain"]]
        assert live[0] == 16 and live == sorted(live, reverse=True)  # 4 prompts x 4 samples, draining
    head = small_config(tmp_path / "head", "run.steps=2", "eval.every=2", "eval.prompts=16", "draft.enabled=true",
                        "backend.proposer=eagle3")
    adapting = Pipeline(head)
    adapting.run()
    start, end = adapting.history[0]["eval_start"], adapting.history[-1]["eval"]
    assert start["head_acceptance_adapted"] == start["head_acceptance_frozen"]  # nothing adapted yet
    assert len(end["head_acceptance_adapted"]) == 3 and end["head_acceptance_length_frozen"] > 1.0
    names = {p.name for p in plot_run(tmp_path)}
    assert {"reward.png", "acceptance.png", "stage_times.png", "eval.png", "drain.png"} <= names

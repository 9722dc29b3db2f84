"""The `simulate` command: flags, tables, and the last-line JSON contract."""
import argparse
import json

from specrl import cli
from specrl.commands import simulate as command


def _last_json(capsys):
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


def test_seed_scenario_prints_json_with_speedups_and_errors_last(capsys):
    assert cli.main(["simulate", "--scenario", "seed-8b-sync"]) == 0
    summary = _last_json(capsys)
    for key in ("scenario", "rollout_speedup", "step_speedup", "published", "error"):
        assert key in summary
    assert summary["rollout_speedup"] > 1.0
    assert {(r["prompt_tokens"], r["group_size"]) for r in summary["shared_prompt"]} >= {(256, 8), (8192, 16)}


def test_calibrate_reports_published_and_error_for_every_row(capsys):
    assert cli.main(["simulate", "--scenario", "calibrate"]) == 0
    summary = _last_json(capsys)
    assert summary["scenario"] == "calibrate"
    assert set(summary["published"]) == set(summary["error"])


def test_sweep_writes_a_speedup_plot(capsys, tmp_path):
    assert cli.main(["simulate", "--scenario", "cpu-tiny", "--sweep", "k=1,3", "batch=1,8", "--plot-dir", str(tmp_path)]) == 0
    summary = _last_json(capsys)
    assert len(summary["sweep"]) == 4
    assert (tmp_path / "speedup_vs_batch.png").stat().st_size > 1000


def test_register_adds_a_simulate_subcommand_with_help():
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["simulate", "--scenario", "cpu-tiny"])
    assert args.func is command.run and args.scenario == "cpu-tiny"


def test_bad_sweep_axis_is_an_error(capsys):
    assert cli.main(["simulate", "--scenario", "cpu-tiny", "--sweep", "depth=3"]) == 1

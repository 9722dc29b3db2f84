"""`specrl simulate`: project RL steps with speculative decoding, sweep them, plot them.

    specrl simulate --scenario seed-8b-sync
    specrl simulate --scenario seed-235b-async --async-style stream --plot-dir plots/
    specrl simulate --scenario calibrate
    specrl simulate --scenario seed-8b-sync --sweep k=1,2,3,5 batch=1,8,64,256

Prints tables on stderr; the CLI prints one JSON object as the last line of stdout.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specrl.commands.common import console as stderr_console
from specrl.sim import published

SCENARIO_CHOICES = ("seed-8b-sync", "seed-235b-async", "cpu-tiny", "calibrate")


def register(subparsers) -> argparse.ArgumentParser:
    """Add the `simulate` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "simulate", help="project RL rollout/step time with speculative decoding (performance simulator)",
        description="Analytical + discrete-event performance simulator for sync/async RL with lossless "
        "speculative decoding, calibrated on published GPU figures and on this CPU. "
        "The last printed line is one JSON object.",
    )
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", default="seed-8b-sync", choices=SCENARIO_CHOICES,
                   help="seed-8b-sync: Qwen3-8B sync on 32 GB200 (calibration target); seed-235b-async: "
                   "Qwen3-235B-A22B async on 2048 GB200 (projection); cpu-tiny: specrl's tiny model on this "
                   "CPU; calibrate: print every predicted-vs-published row with its error")
    p.add_argument("--sweep", nargs="+", metavar="AXIS=V1,V2",
                   help="iteration-level speedup grid on one replica, e.g. --sweep k=1,2,3,5 batch=1,8,64,256")
    p.add_argument("--k", type=int, help="drafts per iteration with speculation on, the most the planner may "
                   "choose (overrides the scenario)")
    p.add_argument("--controller", choices=("planned", "fixed", "oracle"), default="planned",
                   help="who picks K each iteration: planned = the embedded engine's planner, the controller users "
                   "get (explores, learns acceptance from what its steps accept, never-lose rule; default); "
                   "fixed = always --k (the seed's setting); oracle = the best K for the true acceptance and "
                   "costs (an upper bound)")
    p.add_argument("--acceptance-length", type=float, help="aggregate acceptance length at K (overrides)")
    p.add_argument("--gpus", type=int, help="cluster size (overrides)")
    p.add_argument("--async-style", choices=("drain", "stream"), default="drain",
                   help="async generation: drain each step's batch, or stream across steps (no drain)")
    p.add_argument("--trainer-gpus", metavar="N1,N2",
                   help="async trainer world-size scenario: the step with the trainer on each of these many GPUs "
                   "(FSDP, collectives over NVLink within 8 GPUs, the network past them) and the scenario's "
                   "rollout pool, speculation off and on, e.g. --trainer-gpus 8,64,256,1024")
    p.add_argument("--shared-prompt", action="store_true",
                   help="price the trainer with each prompt computed once per group, as specrl's packed trainer "
                   "does (the scenarios' own trainers compute it once per sequence); every run also prints what "
                   "that changes at group sizes 8 and 16 and longer prompts")
    p.add_argument("--sensitivity", action="store_true",
                   help="also vary acceptance, length tail and MoE layout one at a time (slower)")
    p.add_argument("--plot-dir", type=Path, help="write PNG plots into this folder (implies --sensitivity "
                   "for the 235B scenario)")


def _parse_sweep(items: list[str]) -> dict[str, list[int]]:
    axes = {}
    for item in items:
        key, _, values = item.partition("=")
        if key not in ("k", "batch") or not values:
            raise ValueError(f"--sweep takes k=... and batch=..., got {item!r}")
        axes[key] = [int(v) for v in values.split(",")]
    return axes


def _scenario(args):
    from specrl.sim.scenarios import get_scenario

    s = replace(get_scenario(args.scenario), controller=args.controller, shared_prompt=args.shared_prompt)
    if args.k is not None:
        s = replace(s, k=args.k)
    if args.acceptance_length is not None:
        s = replace(s, acceptance_length=args.acceptance_length)
    if args.gpus is not None:
        s = replace(s, gpus=args.gpus)
    return s


def _print_rows(console: Console, title: str, rows: list[dict], columns: list[str]) -> None:
    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*[str(r.get(c, "")) for c in columns])
    console.print(table)


def run_calibrate(console: Console) -> dict:
    from specrl.sim.calibration import calibration_table, summary

    rows = calibration_table()
    _print_rows(console, "calibration: predicted vs published (error = predicted/published - 1)", rows,
                ["name", "kind", "published", "predicted", "error", "bound", "ok", "source"])
    seed = {r["name"]: r for r in rows}
    return {
        "scenario": "calibrate",
        "rollout_speedup": seed["seed-8b generation speedup K=3"]["predicted"],
        "step_speedup": seed["seed-8b step speedup K=3"]["predicted"],
        "published": {r["name"]: r["published"] for r in rows},
        "predicted": {r["name"]: r["predicted"] for r in rows},
        "error": {r["name"]: r["error"] for r in rows},
        "summary": summary(rows),
    }


def run(args) -> dict:
    """Run the command; returns the summary dict (printed as the last JSON line by the caller)."""
    from specrl.sim import projection

    console = stderr_console
    if args.scenario == "calibrate":
        return run_calibrate(console)
    s = _scenario(args)
    if args.sweep:
        return run_sweep(s, _parse_sweep(args.sweep), args.plot_dir, console)
    if args.trainer_gpus:
        return run_trainer_scaling(s, args.trainer_gpus, console)
    result = projection.run_scenario(s, args.async_style)
    trajectories = result.pop("_trajectories")
    stage_rows = [{"case": "spec off", **result["spec_off"]}, {"case": f"spec on (K={s.k})", **result["spec_on"]}]
    if "sync_baseline" in result:
        stage_rows.insert(0, {"case": "sync, spec off", **result["sync_baseline"]})
    _print_rows(console, f"{s.name} ({s.mode}): seconds per RL step", stage_rows,
                ["case", "generation_s", "logprobs_s", "training_s", "weight_sync_s", "step_s"])
    console.print(f"rollout speedup {result['rollout_speedup']}x, step speedup {result['step_speedup']}x"
                  + (f", vs sync baseline {result['vs_sync_baseline']}x" if "vs_sync_baseline" in result else ""))
    shared = projection.shared_prompt_table(s)
    _print_rows(console, f"{s.name}: trainer tokens per step, each prompt once per sequence or once per group",
                shared, ["prompt_tokens", "group_size", "response_tokens", "mtokens_per_sequence", "mtokens_shared",
                         "trainer_speedup"])
    result["shared_prompt"] = shared
    result["batch_trajectory_on"] = [[round(t, 3), int(b), int(k)] for t, b, k in trajectories["on"][:: max(1, len(trajectories["on"]) // 20)]]
    result.update(published_figures(s, result, overridden=(args.k, args.acceptance_length, args.gpus) != (None,) * 3))
    if args.sensitivity or (args.plot_dir and s.mode == "async"):
        sens = projection.sensitivity(s, args.async_style)
        for name, rows in sens.items():
            _print_rows(console, f"sensitivity: {name}", [dict(zip(["setting", "rollout", "step", "vs_sync"], r)) for r in rows],
                        ["setting", "rollout", "step", "vs_sync"])
        result["sensitivity"] = sens
    if args.plot_dir:
        result["plots"] = scenario_plots(s, args.async_style, result.get("sensitivity"), args.plot_dir)
    return result


def run_sweep(s, axes: dict[str, list[int]], plot_dir: Path | None, console: Console) -> dict:
    """The iteration speedup over a grid of K and live batch sizes on one replica."""
    from specrl.sim import plots, projection

    rows = projection.sweep(s, axes.get("k", [s.k]), axes.get("batch", [1, 8, 64, 256]))
    _print_rows(console, f"{s.name}: iteration speedup vs live batch", rows, ["k", "batch", "acceptance_length", "speedup"])
    out = {"scenario": s.name, "sweep": rows}
    if plot_dir:
        plot_dir.mkdir(parents=True, exist_ok=True)
        out["plots"] = [str(plots.plot_speedup_vs_batch(rows, s.name, plot_dir / "speedup_vs_batch.png"))]
    best = max(rows, key=lambda r: r["speedup"])
    out.update(rollout_speedup=best["speedup"], step_speedup=None, best=best)
    return out


def run_trainer_scaling(s, trainer_gpus: str, console: Console) -> dict:
    """The async step with the trainer on each of these many GPUs, speculation off and on."""
    from specrl.sim import projection

    sizes = [int(v) for v in trainer_gpus.split(",")]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--trainer-gpus takes positive counts, got {trainer_gpus!r}")
    rows = projection.trainer_scaling(s, sizes)
    _print_rows(console, f"{s.name}: trainer world size (rollout pool {s.gpus} GPUs, async, staleness 1)", rows,
                ["trainer_gpus", "training_s", "fsdp_comm_s", "step_off_s", "step_on_s", "step_speedup", "bound_by"])
    return {"scenario": s.name, "trainer_scaling": rows, "rollout_speedup": None, "step_speedup": rows[-1]["step_speedup"]}


def published_figures(s, result: dict, overridden: bool) -> dict:
    """The published speedups of the seed scenarios, and the projection's relative error against them (the 8B
    scenario's only as published: without overrides of K, acceptance or GPUs)."""
    if s.name == "seed-8b-sync" and not overridden:
        pub = {"rollout_speedup": published.SEED_8B["generation_s"][0] / published.SEED_8B["generation_s"][1],
               "step_speedup": published.SEED_8B["step_s"][0] / published.SEED_8B["step_s"][1]}
    elif s.name == "seed-235b-async":
        pub = {"rollout_speedup": published.SEED_235B_PROJECTION["rollout_speedup"],
               "step_speedup": published.SEED_235B_PROJECTION["end_to_end_speedup"]}
    else:
        return {}
    return {"published": {k: round(v, 4) for k, v in pub.items()},
            "error": {k: round(result[k] / v - 1.0, 4) for k, v in pub.items()}}


def scenario_plots(s, async_style: str, sensitivity: dict | None, plot_dir: Path) -> list[str]:
    """Speedup against batch, the step's breakdown sync and async, and the sensitivity when it was run."""
    from specrl.sim import plots, projection

    plot_dir.mkdir(parents=True, exist_ok=True)
    paths = [plots.plot_speedup_vs_batch(projection.sweep(s, [1, 2, 3, 5, 7], [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]),
                                         s.name, plot_dir / "speedup_vs_batch.png")]
    cases = {"sync off": _sync(s, 0), f"sync K={s.k}": _sync(s, s.k)}
    a = projection.run_scenario(replace(s, mode="async"), async_style)
    cases[f"async off ({async_style})"], cases[f"async K={s.k}"] = a["spec_off"], a["spec_on"]
    paths.append(plots.plot_step_breakdown(cases, f"{s.name}: step time breakdown", plot_dir / "step_breakdown.png"))
    if sensitivity is not None:
        paths.append(plots.plot_sensitivity(sensitivity, published.SEED_235B_PROJECTION["end_to_end_speedup"],
                                            f"{s.name}: sensitivity ({async_style})", plot_dir / "sensitivity_235b.png"))
    return [str(p) for p in paths]


def _sync(s, k: int) -> dict:
    from specrl.sim.projection import _stages
    from specrl.sim.rl_loop import sync_step

    return _stages(sync_step(replace(s, mode="sync").setup(k=k)))

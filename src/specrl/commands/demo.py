"""`specrl demo` (what `make demo` runs): GRPO on the tiny model with exact speculative rollouts.

The main job, on the embedded default, sized for this CPU: the `tiny` preset (a
character-level Llama learning 2-digit addition; n-gram speculation, K <= 3), then
the run's plots. The reward rises from about 0.17 over the run.
"""
from __future__ import annotations

import argparse

from specrl.commands import train
from specrl.commands.common import console
from specrl.telemetry.run_plots import plot_run


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="the quick demo: GRPO on the tiny model with speculative rollouts",
                              description="Runs `specrl train --preset tiny` (a few minutes on 2 CPU cores) "
                                          "and draws its plots into RUN_DIR/plots.")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. run.steps=100")
    p.set_defaults(func=run)


def run(args) -> dict:
    # the demo is meant to be re-run: it replaces its own previous run in runs/tiny
    train_args = argparse.Namespace(overrides=["run.overwrite=true", *args.overrides], preset="tiny",
                                    config=None, proposer=None, backend=None, resume=None)
    summary = train.run(train_args)
    for path in plot_run(summary["run_dir"]):
        console.print(f"wrote {path}")
    console.print(f"reward: {summary['reward_first']:.3f} at step 1 -> {summary['reward_last_fifth_mean']:.3f} "
                  f"(mean of the last fifth of the run)")
    return summary

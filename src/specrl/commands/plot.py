"""`specrl plot RUN_DIR`: reward, acceptance and stage-time plots (PNG) of a training run."""
from __future__ import annotations

from specrl.commands.common import console
from specrl.telemetry.run_plots import plot_run


def register(subparsers) -> None:
    p = subparsers.add_parser("plot", help="draw a run's reward, acceptance and stage-time plots (PNG)",
                              description="Reads RUN_DIR/metrics.jsonl and writes PNGs to RUN_DIR/plots.")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--out", default=None, help="output folder (default: RUN_DIR/plots)")
    p.set_defaults(func=run)


def run(args) -> dict:
    written = plot_run(args.run_dir, args.out)
    for path in written:
        console.print(f"wrote {path}")
    return {"run_dir": args.run_dir, "plots": [str(p) for p in written]}

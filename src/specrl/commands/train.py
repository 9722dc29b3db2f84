"""`specrl train`: GRPO with speculative rollouts; ends with one JSON line."""
from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from specrl.backends.base import BackendConfig
from specrl.commands.common import console, set_threads
from specrl.pipeline.config import PRESETS, PipelineConfig, RunConfig, TrainConfig, load_config
from specrl.pipeline.config_reference import keys_help
from specrl.validation import choices


def describe_keys_on_help(parser: argparse.ArgumentParser) -> None:
    """Every config key goes into the help's epilog (`keys_help`) when help is shown: reading the config classes'
    source takes ~0.2 s, which every other command line would otherwise pay at start."""
    format_help = parser.format_help

    def with_keys() -> str:
        parser.epilog = parser.epilog or keys_help(TrainConfig)
        return format_help()

    parser.format_help = with_keys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="GRPO training with exact speculative rollouts",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Runs GRPO: generate (speculative, exact) -> reward -> train -> sync weights, one after another "
            "(--pipeline sync) or with Ray rollout actors generating while the trainer trains (--pipeline async). "
            "Config = --preset, then --config FILE (JSON), then key=value overrides with dotted keys, "
            "e.g. grpo.group_size=4 rollout.max_tokens=24 run.steps=10. Every key is listed below.", 100))
    describe_keys_on_help(p)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (dotted keys)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="a named starting config")
    p.add_argument("--config", default=None, help="JSON file of config values")
    p.add_argument("--proposer", choices=choices(BackendConfig, "proposer"), default=None,
                   help="shorthand for backend.proposer=... (eagle3/mtp use the model's registered head, or backend.draft=PATH)")
    p.add_argument("--backend", choices=choices(BackendConfig, "backend"), default=None,
                   help="shorthand for backend.backend=...")
    p.add_argument("--pipeline", choices=choices(PipelineConfig, "mode"), default=None, help="shorthand for pipeline.mode=...")
    p.add_argument("--ray-address", default=None,
                   help="async, or several trainer ranks: join this Ray cluster (default: a local Ray)")
    p.add_argument("--trainer-ranks", type=int, default=None, metavar="N",
                   help="shorthand for run.trainer_ranks=N: the policy trainer as N FSDP2 ranks on Ray "
                        "(gloo on CPU, NCCL on CUDA), each training on 1/N of the batch")
    p.add_argument("--device", choices=choices(RunConfig, "device"), default=None,
                   help="shorthand for run.device=...: where the policy trainer runs (cuda without CUDA is an error)")
    p.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue a killed run from its last checkpoint (uses the run's saved config)")
    p.set_defaults(func=run)


def build_config(args) -> TrainConfig:
    overrides = list(args.overrides)
    if args.proposer:
        overrides.append(f"backend.proposer={args.proposer}")
    if args.backend:
        overrides.append(f"backend.backend={args.backend}")
    if getattr(args, "pipeline", None):
        overrides.append(f"pipeline.mode={args.pipeline}")
    if getattr(args, "trainer_ranks", None) is not None:
        overrides.append(f"run.trainer_ranks={args.trainer_ranks}")
    if getattr(args, "device", None):
        overrides.append(f"run.device={args.device}")
    if getattr(args, "ray_address", None):
        overrides.append(f"pipeline.ray_address={args.ray_address}")
    if args.resume:
        saved = Path(args.resume) / "config.json"
        if not saved.is_file():
            raise FileNotFoundError(f"--resume {args.resume}: no config.json (not a specrl run folder)")
        # the folder named on the command line is the run, wherever it was started or moved from
        return load_config(file=str(saved), overrides=[*overrides, f"run.run_dir={args.resume}"])
    return load_config(args.preset or "tiny", args.config, overrides)


def run(args) -> dict:
    config = build_config(args)
    set_threads(config.run.threads)
    from specrl.pipeline.loop import Pipeline

    pipeline = Pipeline(config, resume=bool(args.resume))
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("[bold]train"), BarColumn(), TextColumn("step {task.completed}/{task.total}"),
                  TextColumn("{task.description}"), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=console) as progress:
        task = progress.add_task("", total=config.run.steps, completed=pipeline.learner.start_step)

        def update(step, total, record):
            spec = record["spec"]
            progress.update(task, completed=step, description=(
                f"reward {record['reward_mean']:.2f}  accept-len {spec['acceptance_length']:.2f}  "
                f"{record['rollout_tokens_per_s']:.0f} tok/s  {record['step_seconds']:.1f}s/step"))

        summary = pipeline.run(progress=update)
    console.print(f"run folder: {summary['run_dir']}  (plots: specrl plot {summary['run_dir']})")
    return summary

"""`specrl pretrain`: train the character-level `tiny` model and its draft `tiny-draft` from a fixed seed."""
from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "pretrain",
        help="train the character-level `tiny` arithmetic model and its draft `tiny-draft`",
        description="Train `tiny` (2 x 128 Llama, characters) on 2-digit addition in the "
        "'copy the problem, then answer' format, then distil `tiny-draft` (1 x 64) from its "
        "temperature-1 samples. Deterministic from --seed on --threads CPU threads: the defaults "
        "reproduce the checkpoints committed in src/specrl/assets (run with --out src/specrl/assets "
        "to overwrite them). Writes OUT/tiny and OUT/tiny-draft; ends with a JSON summary "
        "(final loss, held-out accuracy, draft acceptance, seconds, out).",
    )
    from specrl.training.pretraining import PretrainConfig

    d = PretrainConfig()
    p.add_argument("--out", type=Path, default=None, help="output folder (default: $SPECRL_CACHE/pretrain, else ~/.cache/specrl/pretrain)")
    p.add_argument("--steps", type=int, default=d.steps, help=f"optimiser steps for tiny (default {d.steps})")
    p.add_argument("--draft-steps", type=int, default=d.draft_steps, help=f"optimiser steps for tiny-draft (default {d.draft_steps})")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"sequences per step (default {d.batch_size})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"peak learning rate (default {d.lr})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"random seed (default {d.seed})")
    p.add_argument("--threads", type=int, default=d.threads, help=f"torch CPU threads (default {d.threads}; 1 is bit-reproducible)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from specrl.training.pretraining import PretrainConfig, pretrain
    from specrl.cache import cache_dir

    config = PretrainConfig(
        steps=args.steps, draft_steps=args.draft_steps, batch_size=args.batch_size,
        lr=args.lr, seed=args.seed, threads=args.threads,
    )
    return pretrain(config, args.out if args.out is not None else cache_dir() / "pretrain")

"""CLI commands that make the no-download models: `specrl pretrain` and `specrl train-draft`.

Each `run_*` builds a config from the flags, calls the library and returns the summary
dict; the main CLI prints it as the final JSON line.
"""
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
    from specrl.models.pretrain import PretrainConfig

    d = PretrainConfig()
    p.add_argument("--out", type=Path, default=None, help="output folder (default: $SPECRL_CACHE/pretrain, else ~/.cache/specrl/pretrain)")
    p.add_argument("--steps", type=int, default=d.steps, help=f"optimiser steps for tiny (default {d.steps})")
    p.add_argument("--draft-steps", type=int, default=d.draft_steps, help=f"optimiser steps for tiny-draft (default {d.draft_steps})")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"sequences per step (default {d.batch_size})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"peak learning rate (default {d.lr})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"random seed (default {d.seed})")
    p.add_argument("--threads", type=int, default=d.threads, help=f"torch CPU threads (default {d.threads}; 1 is bit-reproducible)")
    p.set_defaults(func=run_pretrain)

    from specrl.models.train_draft import TrainDraftConfig

    t = TrainDraftConfig()
    q = subparsers.add_parser(
        "train-draft",
        help="distil a small reduced-vocabulary draft for a target (smollm2-135m) on its own samples",
        description="Sample the target (temperature 1, HF generate) on reasoning-gym prompts in its chat "
        "template, pick the N tokens it emits most (expected counts), and distil a draft initialised from "
        "the target (embeddings + first layers + final norm, lm_head restricted to those N tokens) with "
        "soft cross-entropy against the target's distribution renormalised on the N tokens. Saves to "
        "$SPECRL_CACHE/<target>-draft (else ~/.cache/specrl/...) where resolve_checkpoint finds it. "
        "Ends with a JSON summary: held-out loss, top-1 agreement and expected acceptance "
        "sum_x min(p, q) before and after, token counts, seconds.",
    )
    q.add_argument("--target", default="smollm2-135m", help="target model name or path (default smollm2-135m)")
    q.add_argument("--out", type=Path, default=None, help="output folder (default: the cache folder of <target>-draft)")
    q.add_argument("--layers", type=int, default=t.layers, help=f"draft decoder layers (default {t.layers})")
    q.add_argument("--draft-vocab", type=int, default=t.draft_vocab, help=f"draft output vocabulary N (default {t.draft_vocab})")
    q.add_argument("--sample-seconds", type=float, default=t.sample_seconds, help=f"time budget for sampling the target (default {t.sample_seconds:g})")
    q.add_argument("--train-seconds", type=float, default=t.train_seconds, help=f"time budget for distillation (default {t.train_seconds:g})")
    q.add_argument("--sample-batch", type=int, default=t.sample_batch, help=f"prompts per generate call (default {t.sample_batch})")
    q.add_argument("--max-new-tokens", type=int, default=t.max_new_tokens, help=f"response cap when sampling (default {t.max_new_tokens})")
    q.add_argument("--max-batches", type=int, default=t.max_batches, help=f"at most this many sample batches (default {t.max_batches})")
    q.add_argument("--steps", type=int, default=t.steps, help=f"distillation optimiser steps (default {t.steps})")
    q.add_argument("--seed", type=int, default=t.seed, help=f"random seed (default {t.seed})")
    q.add_argument("--threads", type=int, default=t.threads, help=f"torch CPU threads (default {t.threads})")
    q.set_defaults(func=run_train_draft)


def run_pretrain(args: argparse.Namespace) -> dict:
    from specrl.models.pretrain import PretrainConfig, pretrain
    from specrl.models.registry import cache_dir

    config = PretrainConfig(
        steps=args.steps, draft_steps=args.draft_steps, batch_size=args.batch_size,
        lr=args.lr, seed=args.seed, threads=args.threads,
    )
    return pretrain(config, args.out if args.out is not None else cache_dir() / "pretrain")


def run_train_draft(args: argparse.Namespace) -> dict:
    from specrl.models.registry import BUILTIN, DRAFT_FOR, cache_dir, resolve_checkpoint
    from specrl.models.train_draft import TrainDraftConfig, train_draft

    config = TrainDraftConfig(
        layers=args.layers, draft_vocab=args.draft_vocab, sample_seconds=args.sample_seconds,
        train_seconds=args.train_seconds, sample_batch=args.sample_batch, max_new_tokens=args.max_new_tokens,
        max_batches=args.max_batches, steps=args.steps, seed=args.seed, threads=args.threads,
    )
    if args.out is not None:
        out = args.out
    elif args.target in DRAFT_FOR and DRAFT_FOR[args.target] not in ("tiny-draft",):
        out = cache_dir() / DRAFT_FOR[args.target]
    elif args.target in BUILTIN:
        raise ValueError(f"train-draft makes drafts for smollm2-135m or a path; {args.target!r} gets its draft from `specrl pretrain`")
    else:
        raise ValueError("--out is required when --target is a path")
    return train_draft(resolve_checkpoint(args.target), out, config)

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
    from specrl.models.train_head import TrainHeadConfig

    t, h = TrainDraftConfig(), TrainHeadConfig()
    q = subparsers.add_parser(
        "train-draft",
        help="train a draft for a target on its own samples: a small draft model, an EAGLE-3 head or an MTP head",
        description="--kind draft (default): sample the target (temperature 1, HF generate) on reasoning-gym prompts "
        "in its chat template, pick the N tokens it emits most (expected counts), and distil a draft initialised "
        "from the target (embeddings + first layers + final norm, lm_head restricted to those N tokens) with soft "
        "cross-entropy against the target's distribution renormalised on the N tokens. "
        "--kind eagle3 | mtp: sample the target's rollouts with the embedded engine, which hands over the hidden "
        "states it computes anyway, and train a one-layer head on them with a soft cross-entropy over a chain of "
        "--depth drafted tokens (EAGLE-3's training-time test); EAGLE-3 is saved in vLLM's eagle3 layout. "
        "Saves to the registered name (<target>-draft, <target>-eagle3, <target>-mtp: in $SPECRL_CACHE, else "
        "~/.cache/specrl; tiny's heads in src/specrl/assets) where resolve_checkpoint finds it. Ends with a JSON "
        "summary: held-out loss, top-1 agreement and expected acceptance sum_x min(p, q) (per depth for heads) "
        "before and after, token counts, seconds.",
    )
    q.add_argument("--kind", choices=["draft", "eagle3", "mtp"], default="draft", help="what to train (default draft)")
    q.add_argument("--target", default="smollm2-135m", help="target model name or path (default smollm2-135m)")
    q.add_argument("--out", type=Path, default=None, help="output folder (default: where the registered name lives)")
    q.add_argument("--layers", type=int, default=t.layers, help=f"draft: decoder layers (default {t.layers})")
    q.add_argument("--draft-vocab", type=int, default=None,
                   help=f"output vocabulary N; 0 = the target's, eagle3 only (default draft {t.draft_vocab}, "
                        f"eagle3 {h.draft_vocab}; mtp always uses the target's head)")
    q.add_argument("--sample-seconds", type=float, default=None,
                   help=f"time budget for sampling the target (default draft {t.sample_seconds:g}, heads {h.sample_seconds:g})")
    q.add_argument("--train-seconds", type=float, default=None,
                   help=f"time budget for training (default draft {t.train_seconds:g}, heads {h.train_seconds:g})")
    q.add_argument("--sample-batch", type=int, default=None, help=f"prompts per generate call (default {t.sample_batch})")
    q.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"response cap when sampling (default draft {t.max_new_tokens}, heads {h.max_new_tokens})")
    q.add_argument("--max-batches", type=int, default=t.max_batches, help=f"draft: at most this many sample batches (default {t.max_batches})")
    q.add_argument("--prompts", type=int, default=h.prompts, help=f"heads: rollouts to sample (default {h.prompts})")
    q.add_argument("--depth", type=int, default=h.depth, help=f"heads: chain elements trained per anchor (default {h.depth})")
    q.add_argument("--steps", type=int, default=None, help=f"optimiser steps (default draft {t.steps}, heads {h.steps})")
    q.add_argument("--lr", type=float, default=None, help=f"peak learning rate (default draft {t.lr}, heads {h.lr})")
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
    from specrl.models.registry import BUILTIN, builtin_path, draft_for, resolve_checkpoint

    name = draft_for(args.target, args.kind)
    if args.out is not None:
        out = args.out
    elif name is not None and name != "tiny-draft":
        out = builtin_path(name)
    elif args.target in BUILTIN:
        raise ValueError(f"{args.target!r} gets its draft from `specrl pretrain`; pass --out to train another")
    else:
        raise ValueError("--out is required when --target is a path")
    given = {field: getattr(args, option) for field, option in (
        ("draft_vocab", "draft_vocab"), ("sample_seconds", "sample_seconds"), ("train_seconds", "train_seconds"),
        ("sample_batch", "sample_batch"), ("max_new_tokens", "max_new_tokens"), ("steps", "steps"), ("lr", "lr"))
        if getattr(args, option) is not None}
    if args.kind == "draft":
        from specrl.models.train_draft import TrainDraftConfig, train_draft

        config = TrainDraftConfig(layers=args.layers, max_batches=args.max_batches, seed=args.seed,
                                  threads=args.threads, **given)
        return train_draft(resolve_checkpoint(args.target), out, config)
    from specrl.models.train_head import TrainHeadConfig, train_head

    config = TrainHeadConfig(kind=args.kind, prompts=args.prompts, depth=args.depth, seed=args.seed,
                             threads=args.threads, **given)
    return train_head(args.target, resolve_checkpoint(args.target), out, config)

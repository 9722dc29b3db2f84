"""`specrl train-draft`: a draft for a target, trained on the target's own samples of its RL prompts.

`--kind` is one of the proposer registry's checkpoint kinds: a small draft model, an EAGLE-3
head or an MTP head. `run` builds the config from the flags, calls the library and returns
the summary dict; the CLI prints it as the final JSON line.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    from specrl.speculation.proposer_registry import MODEL_DRAFTS
    from specrl.training.draft_distillation import TrainDraftConfig
    from specrl.training.head_training import TrainHeadConfig

    t, h = TrainDraftConfig(), TrainHeadConfig()
    q = subparsers.add_parser(
        "train-draft",
        help="train a draft for a target on its own samples: a small draft model, an EAGLE-3 head or an MTP head",
        description="--kind draft (default): sample the target (temperature 1, HF generate) on the prompts of its "
        "RL preset's task, rendered as RL renders them, pick the N tokens it emits most (expected counts), and distil a draft initialised "
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
    q.add_argument("--kind", choices=MODEL_DRAFTS, default="draft", help="what to train (default draft)")
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
    q.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
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
        from specrl.training.draft_distillation import TrainDraftConfig, train_draft

        config = TrainDraftConfig(layers=args.layers, max_batches=args.max_batches, seed=args.seed,
                                  threads=args.threads, **given)
        return train_draft(args.target, resolve_checkpoint(args.target), out, config)
    from specrl.training.head_training import TrainHeadConfig, train_head

    config = TrainHeadConfig(kind=args.kind, prompts=args.prompts, depth=args.depth, seed=args.seed,
                             threads=args.threads, **given)
    return train_head(args.target, resolve_checkpoint(args.target), out, config)

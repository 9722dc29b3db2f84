"""`specrl train-draft`: a draft for a target, trained on the target's own samples of its RL prompts.

`--kind` is one of the proposer registry's checkpoint kinds: a small draft model, an EAGLE-3
head or an MTP head. All three train on the same kind of data (`training.rollout_data`), and
`--rollouts DIR` keeps it: sampled once, it trains every kind. `run` builds the config from the
flags, calls the library and returns the summary dict; the CLI prints it as the final JSON line.
"""
from __future__ import annotations

import argparse
import shlex
from pathlib import Path


DESCRIPTION = (
    "Samples the target at temperature 1 on its RL preset's prompts (rendered as RL renders them) "
    "with the embedded engine, which hands over the hidden states it computes anyway, keeping the target's "
    "top-k distribution at every response position (or loads such rollouts from --rollouts DIR). "
    "--kind draft (default): pick the N tokens the target emits most (expected counts) and distil a draft "
    "initialised from the target (its embeddings, first layers, final norm, lm_head restricted to those N "
    "tokens) with soft cross-entropy against the target's distribution renormalised on the N tokens. "
    "--kind eagle3 | mtp: train a one-layer head on the hidden states with a soft cross-entropy over a chain "
    "of --depth drafted tokens (EAGLE-3's training-time test); EAGLE-3 is saved in vLLM's eagle3 layout. "
    "Weights are saved in fp16 to the registered name (<target>-draft, <target>-eagle3, <target>-mtp: in "
    "$SPECRL_CACHE, else ~/.cache/specrl) unless --out; the folder's specrl_train.json records the command. "
    "Ends with a JSON summary: held-out loss, top-1 agreement and expected acceptance sum_x min(p, q) (per "
    "depth for heads) before and after, token counts, seconds.")


def register(subparsers: argparse._SubParsersAction) -> None:
    from specrl.speculation.proposer_registry import MODEL_DRAFTS
    from specrl.training.draft_distillation import TrainDraftConfig
    from specrl.training.head_training import TrainHeadConfig

    t, h, d = TrainDraftConfig(), TrainHeadConfig(), TrainDraftConfig().data
    q = subparsers.add_parser(
        "train-draft",
        help="train a draft for a target on its own samples: a small draft model, an EAGLE-3 head or an MTP head",
        description=DESCRIPTION,
    )
    q.add_argument("--kind", choices=MODEL_DRAFTS, default="draft", help="what to train (default draft)")
    q.add_argument("--target", default="smollm2-135m", help="target model name or path (default smollm2-135m)")
    q.add_argument("--out", type=Path, default=None, help="output folder (default: where the registered name lives)")
    q.add_argument("--rollouts", type=Path, default=None,
                   help="folder of the target's rollouts: loaded when it holds a collection with these sampling "
                        "settings, else sampled and saved there (one collection trains every kind)")
    q.add_argument("--layers", type=int, default=t.layers, help=f"draft: decoder layers (default {t.layers})")
    q.add_argument("--draft-vocab", type=int, default=None,
                   help=f"output vocabulary N; 0 = the target's, eagle3 only (default draft {t.draft_vocab}, "
                        f"eagle3 {h.draft_vocab}; mtp always uses the target's head)")
    q.add_argument("--prompts", type=int, default=d.prompts, help=f"rollouts to sample (default {d.prompts})")
    q.add_argument("--sample-seconds", type=float, default=d.sample_seconds,
                   help=f"time budget for sampling the target (default {d.sample_seconds:g})")
    q.add_argument("--sample-batch", type=int, default=d.sample_batch, help=f"prompts per generate call (default {d.sample_batch})")
    q.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens,
                   help=f"response cap when sampling (default {d.max_new_tokens})")
    q.add_argument("--held-out-prompts", type=int, default=d.held_out_prompts,
                   help=f"held-out rollouts (default {d.held_out_prompts})")
    q.add_argument("--top-k", type=int, default=d.top_k, help=f"target probabilities kept per position (default {d.top_k})")
    q.add_argument("--depth", type=int, default=h.depth, help=f"heads: chain elements trained per anchor (default {h.depth})")
    q.add_argument("--init", default=None, metavar="HEAD",
                   help="heads: start from this saved head (a registered name or a folder; its vocabulary is kept) "
                        "instead of a fresh one")
    q.add_argument("--loss", choices=("ce", "ce+tv"), default=h.loss,
                   help="heads: soft cross-entropy against the target's p, or that plus the rejection probability "
                        f"TV(p, q) = 1 - sum min(p, q), balanced per step (default {h.loss})")
    q.add_argument("--train-seconds", type=float, default=None,
                   help=f"time budget for training (default draft {t.train_seconds:g}, heads {h.train_seconds:g})")
    q.add_argument("--steps", type=int, default=None, help=f"optimiser steps (default draft {t.steps}, heads {h.steps})")
    q.add_argument("--lr", type=float, default=None, help=f"peak learning rate (default draft {t.lr}, heads {h.lr})")
    q.add_argument("--micro-batch", type=int, default=None, help=f"sequences per optimiser step (default {t.micro_batch})")
    q.add_argument("--seed", type=int, default=t.seed, help=f"random seed (default {t.seed})")
    q.add_argument("--threads", type=int, default=t.threads, help=f"torch CPU threads (default {t.threads})")
    q.add_argument("--work-dir", type=Path, default=None,
                   help="keep the run resumable in this folder: the target's rollouts, appended batch by batch, and "
                        "the training state (weights, optimiser, data position, RNG), saved every "
                        "--save-every-minutes; continue a killed or chunked run with --resume DIR")
    q.add_argument("--resume", type=Path, default=None, metavar="DIR",
                   help="continue the run whose --work-dir is DIR, with the settings it was started with: the "
                        "rollouts sampled so far are loaded, training goes on bit for bit from its last save")
    q.add_argument("--sitting-minutes", type=float, default=40.0,
                   help="with --work-dir: stop training after this long, state saved, and say how to resume; a "
                        "longer recipe runs as chunks (default 40)")
    q.add_argument("--save-every-minutes", type=float, default=3.0,
                   help="with --work-dir: how often the training state is saved (default 3)")
    q.set_defaults(func=run)


# flags a resumed run takes from its work folder's command.json (the rest, and the sitting's, from the command line)
SESSION_FLAGS = ("resume", "work_dir", "sitting_minutes", "save_every_minutes", "func")
PATH_FLAGS = ("out", "rollouts")


def resumable(args: argparse.Namespace):
    """The run's `Work` folder (or None), after --resume restored the settings the run was started with;
    a fresh --work-dir records them (and refuses a folder that already holds a run)."""
    import json

    from specrl.atomic import write_text_atomically
    from specrl.training.loop import Work

    if args.resume is not None:
        recorded = args.resume / "command.json"
        if not recorded.is_file():
            raise ValueError(f"--resume {args.resume}: not a train-draft work folder (no command.json)")
        for key, value in json.loads(recorded.read_text()).items():
            setattr(args, key, Path(value) if key in PATH_FLAGS and value is not None else value)
        args.work_dir = args.resume
    elif args.work_dir is not None:
        if (args.work_dir / "command.json").is_file():
            raise ValueError(f"--work-dir {args.work_dir} already holds a run: continue it with --resume "
                             f"{args.work_dir}, or pick another folder")
        settings = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()
                    if key not in SESSION_FLAGS}
        write_text_atomically(args.work_dir / "command.json", json.dumps(settings, indent=2))
    if args.work_dir is None:
        return None
    return Work(args.work_dir, every_seconds=60 * args.save_every_minutes, sitting_seconds=60 * args.sitting_minutes)


def run(args: argparse.Namespace) -> dict:
    import sys

    from specrl.models.registry import TARGETS, builtin_path, draft_for, resolve_checkpoint
    from specrl.training.rollout_data import RolloutDataConfig

    work = resumable(args)
    name = draft_for(args.target, args.kind)
    if args.out is not None:
        out = args.out
    elif name is not None and name != "tiny-draft":
        out = builtin_path(name)
    elif args.target in TARGETS:
        raise ValueError(f"{args.target!r} gets its draft from `specrl pretrain`; pass --out to train another")
    else:
        raise ValueError("--out is required when --target is a path")
    data = RolloutDataConfig(prompts=args.prompts, sample_batch=args.sample_batch, max_new_tokens=args.max_new_tokens,
                             sample_seconds=args.sample_seconds, held_out_prompts=args.held_out_prompts, top_k=args.top_k)
    given = {field: getattr(args, option) for field, option in (
        ("draft_vocab", "draft_vocab"), ("train_seconds", "train_seconds"), ("steps", "steps"), ("lr", "lr"),
        ("micro_batch", "micro_batch")) if getattr(args, option) is not None}
    command = shlex.join(["specrl", *sys.argv[1:]]) if sys.argv and sys.argv[0].endswith(("specrl", "specrl/cli.py")) else ""
    if work is not None:  # the saved draft's specrl_train.json records every sitting's command, in order
        command = "; ".join(work.record_sitting(command))
    common = dict(seed=args.seed, threads=args.threads, data=data, **given)
    from specrl.speculation.proposer_registry import KINDS

    if KINDS[args.kind].training == "draft_model":  # the kind's recipe (`ProposerKind.training`): distillation
        from specrl.training.draft_distillation import TrainDraftConfig, train_draft

        return train_draft(args.target, resolve_checkpoint(args.target), out, TrainDraftConfig(layers=args.layers, **common),
                           args.rollouts, command, work)
    from specrl.training.head_training import TrainHeadConfig, train_head

    return train_head(args.target, resolve_checkpoint(args.target), out,
                      TrainHeadConfig(kind=args.kind, depth=args.depth, loss=args.loss,
                                      init=str(resolve_checkpoint(args.init)) if args.init else None, **common),
                      args.rollouts, command, work)

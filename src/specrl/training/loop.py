"""The optimisation loop every non-RL training in specrl uses: tiny pretraining, draft
distillation, head training.

AdamW (betas 0.9, 0.95), linear warm-up over `warmup` steps then cosine decay to lr / 10,
gradient norm clipped at 1. It stops after `steps` optimiser steps or `seconds` of wall
time, whichever comes first, and the cosine follows the same budget: its progress is the
larger of the step and the time fraction, so a run whose time runs out first still anneals to
lr / 10 instead of stopping near the peak. It shows a progress bar with the recent mean loss.
A step whose loss or gradient is not finite is skipped with a warning (`finite_step`); after
`MAX_SKIPPED_STEPS` of them the run stops with an error instead of spinning on bad data.
`shuffled_batches` feeds it shuffled passes over a dataset in micro-batches.
"""
from __future__ import annotations

import math
import time
from typing import Callable, Iterator

import torch
from tqdm import tqdm

from specrl.finite_step import finite_step

MAX_SKIPPED_STEPS = 10


def learning_rate(step: int, lr: float, warmup: int, steps: int, time_fraction: float = 0.0) -> float:
    """Linear warm-up to `lr` over `warmup` steps, then cosine to lr / 10 at step `steps` or when
    `time_fraction` (elapsed / time budget) reaches 1, whichever comes first."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = max((step - warmup) / max(steps - warmup, 1), time_fraction)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def shuffled_batches(size: int, micro_batch: int, seed: int, lengths: list[int] | None = None,
                     pool: int = 64) -> Iterator[list[int]]:
    """Endless shuffled passes over range(size), `micro_batch` indices at a time (the last of a pass may be short).

    Given the sequences' `lengths`, each pass is cut into pools of `pool` micro-batches, each pool
    sorted by length before it is split, and the pass's micro-batches shuffled: a micro-batch holds
    sequences of about one length, so little of it is padding (on SmolLM2's rollouts, 1.6 padded
    positions per real one at random, 1.01 in pools of 64), and every sequence is still seen once a pass.
    """
    order = torch.Generator().manual_seed(seed)
    while True:
        perm = torch.randperm(size, generator=order).tolist()
        if lengths is None:
            batches = [perm[s:s + micro_batch] for s in range(0, size, micro_batch)]
        else:
            batches = []
            for s in range(0, size, pool * micro_batch):
                chunk = sorted(perm[s:s + pool * micro_batch], key=lambda i: lengths[i])
                batches += [chunk[c:c + micro_batch] for c in range(0, len(chunk), micro_batch)]
            batches = [batches[i] for i in torch.randperm(len(batches), generator=order).tolist()]
        yield from batches


def fit(params: list[torch.Tensor], loss_fn: Callable[[int], torch.Tensor], steps: int, lr: float, warmup: int,
        desc: str, weight_decay: float = 0.0, seconds: float = math.inf, window: int = 20) -> tuple[float, int]:
    """Minimise `loss_fn(step)`; returns (mean loss of the last `window` steps, steps taken)."""
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    start, recent, step, skips = time.perf_counter(), [], 0, 0
    bar = tqdm(total=steps, desc=desc, unit="step", dynamic_ncols=True)
    while step < steps and (elapsed := time.perf_counter() - start) < seconds:
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, lr, warmup, steps, elapsed / seconds)
        loss = loss_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        _, skipped = finite_step(opt, params, loss.item(), 1.0, f"{desc} step {step}")
        skips += skipped
        if skips > MAX_SKIPPED_STEPS:
            raise FloatingPointError(f"{desc}: {skips} optimiser steps had a non-finite loss or gradient; stopping "
                                     "(the weights hold the last finite step's values)")
        recent = recent if skipped else (recent + [loss.item()])[-window:]
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{sum(recent) / max(len(recent), 1):.4f}")
    bar.close()
    return sum(recent) / max(len(recent), 1), step

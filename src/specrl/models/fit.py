"""The optimisation loop shared by draft distillation and head training.

AdamW (betas 0.9, 0.95, no weight decay), linear warm-up over 10 steps then cosine to
lr / 10, gradient norm clipped at 1, shuffled passes over `size` examples in micro-batches;
it stops after `steps` optimiser steps or `seconds` of wall time, whichever comes first.
"""
from __future__ import annotations

import math
import time
from typing import Callable

import torch
from tqdm import tqdm


def fit(params: list[torch.Tensor], loss_of: Callable[[list[int]], torch.Tensor], size: int, micro_batch: int,
        steps: int, seconds: float, lr: float, seed: int, desc: str) -> tuple[float, int]:
    """Minimise `loss_of(example indices)`; returns (mean loss of the last 20 steps, steps taken)."""
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    order = torch.Generator().manual_seed(seed)
    start, recent, step = time.perf_counter(), [], 0
    bar = tqdm(total=steps, desc=desc, unit="step", dynamic_ncols=True)
    while step < steps and time.perf_counter() - start < seconds:
        perm = torch.randperm(size, generator=order).tolist()
        for s in range(0, len(perm), micro_batch):
            if step >= steps or time.perf_counter() - start > seconds:
                break
            loss = loss_of(perm[s:s + micro_batch])
            warm = min(1.0, (step + 1) / 10)
            cosine = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step / steps, 1.0)))
            for group in opt.param_groups:
                group["lr"] = lr * warm * cosine
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            recent = (recent + [loss.item()])[-20:]
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{sum(recent) / len(recent):.3f}")
    bar.close()
    return sum(recent) / max(len(recent), 1), step

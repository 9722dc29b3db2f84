"""The optimisation loop every non-RL training in specrl uses: tiny pretraining, draft
distillation, head training.

AdamW (betas 0.9, 0.95), linear warm-up over `warmup` steps then cosine decay to lr / 10,
gradient norm clipped at 1. It stops after `steps` optimiser steps or `seconds` of wall
time, whichever comes first, and the cosine follows the same budget: its progress is the
larger of the step and the time fraction, so a run whose time runs out first still anneals to
lr / 10 instead of stopping near the peak. It shows a progress bar with the recent mean loss.
A step whose loss or gradient is not finite is skipped with a warning (`finite_step`); after
`MAX_SKIPPED_STEPS` of them the run stops with an error instead of spinning on bad data.
`shuffled_batches` feeds it shuffled passes over a dataset in micro-batches; `indexed` turns them into
a function of the step, so the data position is the step number.

Resume (`Saving`): every `every_seconds`, and when it stops, `fit` writes the trained weights, the
optimiser's state, the step, the wall time used, its loss window, skip count and torch's RNG into
`folder` (safetensors and JSON, swapped in atomically: a kill never leaves half a state). Started again
with the same folder, it loads them and continues: with a step budget (no `seconds`), bit for bit the
run that was never stopped. `sitting_seconds` ends a sitting early, state saved, so a long recipe runs
in chunks of at most that long.
"""
from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from specrl.atomic import recover_folder, replace_folder, write_text_atomically
from specrl.finite_step import finite_step
from specrl.models.checkpoint import optimizer_state, optimizer_tensors

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


def indexed(batches: Iterator[list[int]]) -> Callable[[int], list[int]]:
    """The batch of each step: step -> the step-th item of `batches`. Steps must not go back; a resumed
    run's first step skips the items before it, so the data position is the step."""
    position, current = -1, None

    def at(step: int) -> list[int]:
        nonlocal position, current
        if step < position:
            raise ValueError(f"indexed batches: step {step} is behind the data position {position}")
        while position < step:
            current, position = next(batches), position + 1
        return current
    return at


@dataclass(frozen=True)
class Saving:
    """Where `fit` keeps its state so a killed run continues (see the module docstring)."""

    folder: Path
    module: torch.nn.Module  # whose state dict holds the trained weights
    every_seconds: float = 180.0
    sitting_seconds: float = math.inf  # stop this sitting (state saved) after this long; a later one resumes


@dataclass(frozen=True)
class Work:
    """A resumable draft training's folder: the target's rollouts (`rollouts/`, appended batch by batch), the
    fit's state (`fit/`), and how the run was started (`command.json`, which `--resume` reads back)."""

    folder: Path
    every_seconds: float = 180.0  # the fit's state is saved this often
    sitting_seconds: float = math.inf  # a sitting trains at most this long; resume for the rest

    @property
    def rollouts(self) -> Path:
        return self.folder / "rollouts"

    def saving(self, module: torch.nn.Module) -> Saving:
        return Saving(self.folder / "fit", module, self.every_seconds, self.sitting_seconds)

    def record_sitting(self, command: str) -> list[str]:
        """Append this sitting's command to `sittings.json`; returns every sitting's so far."""
        path = self.folder / "sittings.json"
        sittings = json.loads(path.read_text()) if path.is_file() else []
        sittings.append(command)
        write_text_atomically(path, json.dumps(sittings, indent=2))
        return sittings

    def unfinished(self, result: "FitResult") -> dict:
        """The summary of a sitting that ended before the training budget: nothing saved but the state."""
        return {"finished": False, "train_steps": result.steps, "work_dir": str(self.folder),
                "resume": f"specrl train-draft --resume {self.folder}"}


@dataclass(frozen=True)
class FitResult:
    loss: float  # mean loss of the last `window` steps
    steps: int  # optimiser steps taken, over every sitting
    finished: bool  # the step or time budget is spent (False: a sitting ended first; resume to go on)

    def __iter__(self):
        """Unpacks as (loss, steps)."""
        return iter((self.loss, self.steps))


@dataclass
class FitProgress:
    step: int = 0
    elapsed: float = 0.0  # wall seconds trained, over every sitting
    recent: list[float] | None = None
    skips: int = 0


def save_fit_state(saving: Saving, opt: torch.optim.Optimizer, progress: FitProgress) -> None:
    """Write weights, optimiser, progress and torch's RNG to `saving.folder`, replacing the previous state."""
    final = Path(saving.folder)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        save_file({name: t.detach().contiguous() for name, t in saving.module.state_dict().items()},
                  str(tmp / "model.safetensors"))
        tensors, groups = optimizer_tensors(opt.state_dict())
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        (tmp / "state.json").write_text(json.dumps({"step": progress.step, "elapsed": progress.elapsed,
                                                    "recent": progress.recent, "skips": progress.skips,
                                                    "param_groups": groups}))
        replace_folder(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_fit_state(saving: Saving, opt: torch.optim.Optimizer) -> FitProgress | None:
    """Restore a state `save_fit_state` wrote (weights, optimiser, RNG) -> its progress; None when there is none."""
    folder = Path(saving.folder)
    recover_folder(folder)
    if not (folder / "state.json").is_file():
        return None
    state = json.loads((folder / "state.json").read_text())
    saving.module.load_state_dict(load_file(str(folder / "model.safetensors")))
    opt.load_state_dict(optimizer_state(load_file(str(folder / "optimizer.safetensors")), state["param_groups"]))
    torch.set_rng_state(load_file(str(folder / "rng.safetensors"))["torch"])
    return FitProgress(state["step"], state["elapsed"], state["recent"], state["skips"])


def fit(params: list[torch.Tensor], loss_fn: Callable[[int], torch.Tensor], steps: int, lr: float, warmup: int,
        desc: str, weight_decay: float = 0.0, seconds: float = math.inf, window: int = 20,
        saving: Saving | None = None) -> FitResult:
    """Minimise `loss_fn(step)`. With `saving`, resume from its folder's state when there is one, and keep it
    there."""
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    progress = (load_fit_state(saving, opt) if saving is not None else None) or FitProgress(recent=[])
    step, skips, recent = progress.step, progress.skips, progress.recent
    sitting = time.perf_counter()
    start, saved = sitting - progress.elapsed, sitting
    bar = tqdm(total=steps, initial=step, desc=desc, unit="step", dynamic_ncols=True)
    while step < steps and (elapsed := time.perf_counter() - start) < seconds:
        if saving is not None and time.perf_counter() - sitting >= saving.sitting_seconds:
            break
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
        if saving is not None and time.perf_counter() - saved >= saving.every_seconds:
            save_fit_state(saving, opt, FitProgress(step, time.perf_counter() - start, recent, skips))
            saved = time.perf_counter()
    bar.close()
    elapsed = time.perf_counter() - start
    if saving is not None:
        save_fit_state(saving, opt, FitProgress(step, elapsed, recent, skips))
    return FitResult(sum(recent) / max(len(recent), 1), step, step >= steps or elapsed >= seconds)

"""An optimiser step that refuses non-finite numbers, so no NaN or infinity reaches the weights.

    finite_step(optimizer, parameters, loss, max_grad_norm, what) -> (grad_norm, skipped)

It measures the gradient's global norm (and clips it to `max_grad_norm` when that is > 0), then
steps only when the loss and the norm are both finite. Otherwise it drops the gradient, leaves the
weights and the optimiser's state as they were, and warns, naming `what`. The caller records the skip
in the step's metrics (`policy_step_skipped`, `draft_step_skipped`), so metrics.jsonl counts them.
Under torch.distributed every rank takes the same decision: the norm is already global, and the
loss's verdict is all-reduced.

A skipped step publishes and checkpoints the unchanged (finite) weights; `checkpoint.check_finite`
guards the writes themselves.
"""
from __future__ import annotations

import math
import warnings

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def finite_step(optimizer: torch.optim.Optimizer, parameters: list[torch.Tensor], loss: float,
                max_grad_norm: float, what: str) -> tuple[float, bool]:
    """Clip, check, then step or skip (module docstring). `loss` is this rank's share of the step's loss."""
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm if max_grad_norm > 0 else math.inf)
    norm = float((norm.full_tensor() if isinstance(norm, DTensor) else norm).detach().cpu())
    finite = math.isfinite(loss) and math.isfinite(norm)
    if dist.is_initialized() and dist.get_world_size() > 1:
        verdict = torch.tensor([float(finite)], device=parameters[0].device)  # NCCL reduces on the GPU
        dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
        finite = bool(verdict.item())
    if finite:
        optimizer.step()
    else:
        warnings.warn(f"{what}: the loss ({loss}) or the gradient norm ({norm}) is not finite; "
                      "skipping this optimiser step (weights and optimiser state unchanged)", RuntimeWarning,
                      stacklevel=2)
    optimizer.zero_grad(set_to_none=True)
    return norm, not finite

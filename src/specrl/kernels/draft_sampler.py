"""One draft token per row and its distribution q in one call (`draft_sampler.cpp`, built into the small-row
kernels' library).

A draft token needs q, the distribution the verifier reads, and one draw from it. In PyTorch that is ~10
operations over the vocabulary (SmolLM2's 49,152 ids), each allocating its output, for every draft token;
here it is one call (docs/fast_path.md has the measured times). The draw is the inverse of q's cumulative
distribution at one uniform from the call's generator, as `sampling.draw`, so each id is drawn with its
probability under q to ~1e-16.

    token, q = sample(logits, temperature, generator)   logits [B, V] -> token [B] long, q [B, V] fp32

It covers untruncated sampling at a temperature above 0 (`proposer.sample_draft_token` sends the rest, greedy,
top-k and top-p, through `sampling`), on fp32 rows on the CPU (`takes`).

    token = draw(probs, u)   the same inverse-CDF draw from given probabilities (what `sampling.draw` runs on
                             fp32 rows on the CPU: one pass over the row, where PyTorch's path makes a
                             float64 copy and its cumsum; docs/fast_path.md)
    token = race(probs, keys, group)   drafter-invariant sampling's race (`speculation.drafter_invariant.race`
                             on fp32 rows on the CPU: one pass over the row and ~2 sqrt(V) hashes, where
                             PyTorch's path makes ~50 calls)
"""
from __future__ import annotations

import ctypes

import torch

from specrl.kernels import small_gemm


def takes(x: torch.Tensor) -> bool:
    """Whether `sample` and `draw` run on x: fp32 [B, V] on the CPU, and the kernels' library built here."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2 and not small_gemm.unavailable()


def draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One id per row of probs [B, V] (non-negative, rows need not sum to 1) at the float64 uniforms u [B]: the
    inverse of the row's float64 cumulative distribution at u * its total, as `sampling.draw` computes it."""
    probs, u = probs.contiguous(), u.contiguous()
    rows, vocab = probs.shape
    token = torch.empty(rows, dtype=torch.long)
    if small_gemm._library()[0].specrl_draw(probs.data_ptr(), rows, vocab, u.data_ptr(), token.data_ptr()):
        raise ValueError("cannot draw from a row with no probability mass (all zero), or with a negative, NaN or "
                         "infinite entry")
    return token


def race(probs: torch.Tensor, keys: torch.Tensor, group: int) -> torch.Tensor:
    """One id per row of probs [B, V] by drafter-invariant sampling's race on the noise of keys [B] int64, over
    groups of `group` ids (a multiple of 8), as `speculation.drafter_invariant.race` computes it."""
    probs, keys = probs.contiguous(), keys.contiguous()
    rows, vocab = probs.shape
    token = torch.empty(rows, dtype=torch.long)
    if small_gemm._library()[0].specrl_race(probs.data_ptr(), rows, vocab, group, keys.data_ptr(), token.data_ptr()):
        raise ValueError("cannot draw from a row with no probability mass (all zero), or with a negative, NaN or "
                         "infinite entry")
    return token


def sample(logits: torch.Tensor, temperature: float,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One id per row of softmax(logits / temperature) [B, V], and that distribution."""
    logits = logits.contiguous()
    rows, vocab = logits.shape
    u = torch.rand(rows, dtype=torch.float64, generator=generator)
    q = torch.empty_like(logits)
    token = torch.empty(rows, dtype=torch.long)
    if small_gemm._library()[0].specrl_sample_softmax(logits.data_ptr(), rows, vocab, ctypes.c_float(1 / temperature),
                                                      u.data_ptr(), q.data_ptr(), token.data_ptr()):
        raise ValueError(f"cannot draw from softmax(logits / {temperature:g}): a row has no probability mass (its "
                         "logits all -inf, or one NaN or +inf), or 1 / temperature is not finite in float32")
    return token, q

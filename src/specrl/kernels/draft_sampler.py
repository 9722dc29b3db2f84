"""One draft token per row and its distribution q in one call (`draft_sampler.cpp`, built into the small-row
kernels' library).

A draft token needs q, the distribution the verifier reads, and one draw from it. In PyTorch that is ~10
operations over the vocabulary, each allocating its output (~0.4 ms a draft token on SmolLM2's 49,152 ids
in the engine); here it is one call. The draw is the inverse of q's cumulative distribution at one uniform
from the call's generator, as `sampling.draw`, so each id is drawn with its probability under q to ~1e-16.

    token, q = sample(logits, temperature, generator)   logits [B, V] -> token [B] long, q [B, V] fp32

It covers untruncated sampling at a temperature above 0 (`applies`); `proposer.sample_draft_token` sends
the rest (greedy, top-k, top-p) through `sampling`.
"""
from __future__ import annotations

import ctypes

import torch

from specrl.kernels import small_gemm
from specrl.sampling import SamplingParams


def applies(logits: torch.Tensor, params: SamplingParams) -> bool:
    """Whether `sample` draws for these logits and params: fp32 on the CPU, a temperature above 0, no top-k or
    top-p, and the kernels' library built for this CPU."""
    return (not params.greedy and not params.top_k and params.top_p >= 1.0 and logits.dtype == torch.float32
            and logits.device.type == "cpu" and logits.dim() == 2 and not small_gemm.unavailable())


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
        raise ValueError("cannot draw from a row with no probability mass (its logits all -inf, or one NaN or +inf)")
    return token, q

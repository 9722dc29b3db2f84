"""Sampling parameters and the target's final sampling distribution.

`SamplingParams` mirrors vLLM's names. `sampling_distribution` turns logits into the
distribution tokens are actually drawn from (temperature, then top-k, then top-p);
speculative verification compares drafts against exactly this distribution, and the
logprob recorded for a token is its log-probability under it.

Temperature 0 is greedy: a one-hot distribution on the argmax. Its reported logprob
is taken under the unscaled model distribution (softmax of the raw logits), as vLLM
does, since under the one-hot it would always be 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from specrl.validation import check_fields, within


@dataclass(frozen=True)
class SamplingParams:
    """How to sample; every field validated at construction."""

    SECTION: ClassVar[str] = "SamplingParams"

    n: int = within(1, "[1, inf)")  # samples per prompt (the GRPO group size)
    temperature: float = within(1.0, "[0, inf)")  # 0 = greedy
    top_p: float = within(1.0, "(0, 1]")  # nucleus mass kept
    top_k: int = within(0, "[0, inf)")  # keep the k most likely tokens; 0 = all
    max_tokens: int = within(64, "[1, inf)")  # generated tokens per sample, at most
    stop_token_ids: tuple[int, ...] = ()  # finish after any of these (the model's EOS is added by the engine)
    stop: tuple[str, ...] = ()  # finish when the text contains any of these; the text is cut before it
    seed: int | None = None  # seeds the call's generator; None = nondeterministic
    ignore_eos: bool = False  # keep generating past EOS (benchmarks)

    def __post_init__(self):
        check_fields(self)
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / top-p nucleus to -inf. logits [..., V] (already scaled)."""
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cumulative - sorted_logits.softmax(-1) >= top_p  # mass before this token already >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sampling_distribution(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (probs, logprobs), both [..., V]: the distribution sampled from, and the
    log-probabilities recorded for sampled tokens (see the module docstring for greedy)."""
    if params.greedy:
        logprobs = logits.log_softmax(-1)
        probs = torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return probs, logprobs
    scaled = _filter_top_k_top_p(logits / params.temperature, params.top_k, params.top_p)
    logprobs = scaled.log_softmax(-1)
    return logprobs.exp(), logprobs

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

from specrl.kernels import draft_sampler
from specrl.validation import check_fields, within

FLOAT32_MAX = torch.finfo(torch.float32).max


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
    # draw each token from noise keyed by (seed, sample, position), so a seeded call returns the same tokens with
    # any proposer or none (`speculation.drafter_invariant`; the embedded engine only)
    drafter_invariant: bool = False

    def __post_init__(self):
        check_fields(self)
        if self.temperature > 0 and not 1 / self.temperature <= FLOAT32_MAX:
            raise ValueError(f"SamplingParams.temperature {self.temperature:g} is too small to sample at: logits are "
                             f"scaled by 1 / temperature in float32, whose largest value is {FLOAT32_MAX:.4g}; use "
                             "temperature=0 for greedy decoding, or a temperature of at least "
                             f"{1 / FLOAT32_MAX:.3g}")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def truncation_mask(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """[..., V] bool: the tokens top-k, then top-p, drop from temperature-scaled logits (a constant:
    no gradient flows through which tokens are kept)."""
    with torch.no_grad():
        drop = torch.zeros_like(scaled, dtype=torch.bool)
        if top_k and top_k < scaled.shape[-1]:
            kth = scaled.topk(top_k, dim=-1).values[..., -1:]
            drop = scaled < kth
        if top_p < 1.0:
            kept = scaled.masked_fill(drop, float("-inf"))
            sorted_logits, order = kept.sort(dim=-1, descending=True)
            mass = sorted_logits.softmax(-1)
            drop_sorted = mass.cumsum(-1) - mass >= top_p  # mass before this token already >= top_p
            drop = drop | torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        return drop


def sampling_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..., V] log-probabilities of the (non-greedy) sampling distribution: logits / temperature,
    top-k and top-p truncation, renormalised. The engine samples from it and the trainer scores the
    same tokens under it, so their logprobs agree whatever the truncation."""
    scaled = logits / params.temperature
    if params.top_k or params.top_p < 1.0:
        scaled = scaled.masked_fill(truncation_mask(scaled, params.top_k, params.top_p), float("-inf"))
    return scaled.log_softmax(-1)


def sampling_distribution(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (probs, logprobs), both [..., V]: the distribution sampled from, and the
    log-probabilities recorded for sampled tokens (see the module docstring for greedy)."""
    if params.greedy:
        logprobs = logits.log_softmax(-1)
        probs = torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return probs, logprobs
    logprobs = sampling_logprobs(logits, params)
    return logprobs.exp(), logprobs


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One id per row of probs [B, V] (non-negative, each row with positive mass; rows need not sum to 1),
    drawn with probability proportional to its entry: the inverse of each row's cumulative distribution at
    one uniform. The cumulative sums are in float64, so each id's chance matches its entry to ~1e-16 of the
    row's mass, and an id of probability 0 is never drawn. The same law as `torch.multinomial(probs, 1)`;
    fp32 rows on the CPU run in one kernel call (`kernels.draft_sampler.draw`, the same float64 sums)."""
    u = torch.rand(probs.shape[0], dtype=torch.float64, generator=generator, device=probs.device)
    if draft_sampler.takes(probs):
        return draft_sampler.draw(probs, u)
    cdf = probs.double().cumsum(-1)  # [B, V]
    if not bool((cdf[:, -1] > 0).all()):  # NaN fails this too
        raise ValueError("cannot draw from a row with no probability mass (all zero, or NaN)")
    return torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1).clamp_max(probs.shape[-1] - 1)


def draw_without_replacement(probs: torch.Tensor, count: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """`count` distinct ids per row of probs [B, V] -> [B, count], in draw order: each drawn by `draw` from the
    row with the ids before it removed (renormalised), so the j-th id's law is exactly that of the j-th of
    sequential draws without replacement, to `draw`'s float64 resolution. A row whose mass is used up (fewer
    than `count` ids of positive probability) is padded with distinct ids of probability 0, the lowest ones left;
    tree verification accepts such an id with probability 0 (`speculation.tree`).

    (Gumbel top-w keys, log q - log(-log u), have the same law only for uniforms of unlimited resolution: with
    float32 uniforms the noise is capped near 16.6, so an id of 1e-8 the leader's mass is almost never first.)
    """
    if count > probs.shape[-1]:
        raise ValueError(f"cannot draw {count} distinct ids from a vocabulary of {probs.shape[-1]}")
    rest = probs.clone(memory_format=torch.contiguous_format)  # what is left to draw from
    drawn = torch.empty(probs.shape[0], count, dtype=torch.long, device=probs.device)
    for j in range(count):
        live = rest.sum(-1) > 0 if j else None  # [B]: mass left (a sum of non-negative entries is 0 only if all are)
        if live is None or bool(live.all()):  # (a row without mass at the first draw is refused by `draw`)
            drawn[:, j] = draw(rest, generator)
        else:  # rows whose mass is used up: the lowest id not yet drawn (argmax: the first maximum)
            drawn[:, j] = torch.ones_like(rest).scatter_(-1, drawn[:, :j], 0.0).argmax(-1)
            if bool(live.any()):
                drawn[live, j] = draw(rest[live], generator)
        rest.scatter_(-1, drawn[:, j:j + 1], 0.0)
    return drawn

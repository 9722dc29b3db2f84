"""The GRPO policy loss, exactly as implemented here.

Variant: PPO-style clipped surrogate on tokens, group-normalised advantages (see
`advantages.py`), optional KL penalty to a frozen reference, token-mean over the
whole batch (every response token of every sequence weighs the same, the DAPO
normalisation; long responses are not down-weighted per sequence).

For token t of response i, with behaviour logprob b (the rollout engine's, under
the distribution it sampled from) and current logprob l:
    ratio      rho = exp(l - b)
    surrogate  s   = min(rho * A_i, clip(rho, 1 - eps_low, 1 + eps_high) * A_i)
    KL (k3)    k   = exp(ref - l) - (ref - l) - 1        (only when beta > 0)
    loss       = -sum_t (s - beta * k) * mask / sum_t mask
When the engine's logprobs equal the trainer's (the parity specrl tests), rho = 1 on
the first micro-step, so the surrogate's gradient is the plain policy gradient.
Async rollouts made by an older policy version are corrected by the same ratio:
b is the logprob under the version that actually sampled the token.

Deliberately left out: value function (GRPO has none), entropy bonus, per-sequence
length normalisation, dual-clip.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GRPOConfig:
    """GRPO objective settings."""

    group_size: int = 8  # G, samples per prompt
    clip_low: float = 0.2  # eps_low: ratio floor 1 - eps_low
    clip_high: float = 0.2  # eps_high: ratio ceiling 1 + eps_high (raise it for DAPO's clip-higher)
    kl_coef: float = 0.0  # beta; 0 = no reference model kept
    scale_advantages: bool = True  # divide by the group std (False = Dr. GRPO)

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError(f"grpo.group_size must be >= 2 (advantages compare siblings), got {self.group_size}")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(f"grpo.clip_low must be in [0, 1) and clip_high >= 0, got {self.clip_low}, {self.clip_high}")
        if self.kl_coef < 0:
            raise ValueError(f"grpo.kl_coef must be >= 0, got {self.kl_coef}")


def grpo_loss(
    logprobs: torch.Tensor,  # [N, T] current policy, per response token
    behaviour_logprobs: torch.Tensor,  # [N, T] from the rollout engine
    advantages: torch.Tensor,  # [N]
    mask: torch.Tensor,  # [N, T] 1 on response tokens
    config: GRPOConfig,
    num_tokens: int | None = None,  # denominator: response tokens in the whole batch (for micro-batching)
    ref_logprobs: torch.Tensor | None = None,  # [N, T] frozen reference, when kl_coef > 0
) -> tuple[torch.Tensor, dict[str, float]]:
    """-> (loss, stats). With micro-batches, pass the whole batch's token count so the
    summed micro-batch losses equal the full-batch token mean."""
    mask = mask.to(logprobs.dtype)
    denominator = num_tokens if num_tokens is not None else mask.sum().clamp_min(1)
    ratio = torch.exp(logprobs - behaviour_logprobs)
    adv = advantages.unsqueeze(1)
    clipped = ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
    surrogate = torch.minimum(ratio * adv, clipped * adv)
    objective = surrogate
    kl = torch.zeros((), dtype=logprobs.dtype)
    if config.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("grpo.kl_coef > 0 needs reference logprobs")
        delta = ref_logprobs - logprobs
        per_token_kl = torch.exp(delta) - delta - 1
        objective = surrogate - config.kl_coef * per_token_kl
        kl = (per_token_kl * mask).sum() / denominator
    loss = -(objective * mask).sum() / denominator
    with torch.no_grad():
        clip_frac = (((ratio < 1 - config.clip_low) | (ratio > 1 + config.clip_high)).to(mask.dtype) * mask).sum() / denominator
    return loss, {"kl": float(kl), "clip_fraction": float(clip_frac)}

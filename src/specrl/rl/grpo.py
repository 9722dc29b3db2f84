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

Version lag (async rollouts, `proximal_logprobs` given): the decoupled PPO objective
of AReaL (Fu et al. 2025), with a truncated importance weight. With proximal
logprob x (the policy the trainer holds before this update; one optimiser step per
batch makes it the current weights, detached):
    IS weight  w   = min(exp(x - b), is_cap)           behaviour -> proximal, no gradient
    ratio      rho = exp(l - x)                        clipped against the proximal policy
    surrogate  s   = w * min(rho * A_i, clip(rho, 1 - eps_low, 1 + eps_high) * A_i)
so a token sampled by a stale version is re-weighted by how much more (or less) likely
the proximal policy makes it, instead of being clipped away for being stale. With one
optimiser step per batch rho == 1 in value, the clip never binds, and the gradient is
w * A_i * grad l (truncated-IS policy gradient). Without lag b == x to fp32 rounding,
w == 1, and the two objectives agree; the pipelines pass `proximal_logprobs` only
for batches that hold a stale token, so a lag-free batch takes the path above unchanged.

Deliberately left out: value function (GRPO has none), entropy bonus, per-sequence
length normalisation, dual-clip.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from specrl.validation import check_fields, within


@dataclass(frozen=True)
class GRPOConfig:
    """GRPO objective settings."""

    SECTION: ClassVar[str] = "grpo"

    group_size: int = within(8, "[2, inf)", alias="G")  # samples per prompt; advantages compare siblings
    clip_low: float = within(0.2, "[0, 1)")  # eps_low: ratio floor 1 - eps_low
    clip_high: float = within(0.2, "[0, inf)")  # eps_high: ratio ceiling 1 + eps_high (raise it for DAPO's clip-higher)
    kl_coef: float = within(0.0, "[0, inf)")  # beta; 0 = no reference model kept
    is_cap: float = within(2.0, "[1, inf)")  # truncates the behaviour -> proximal IS weight on stale tokens (async)
    scale_advantages: bool = True  # divide by the group std (False = Dr. GRPO)

    def __post_init__(self):
        check_fields(self)


def grpo_loss(
    logprobs: torch.Tensor,  # [N, T] current policy, per response token
    behaviour_logprobs: torch.Tensor,  # [N, T] from the rollout engine
    advantages: torch.Tensor,  # [N]
    mask: torch.Tensor,  # [N, T] 1 on response tokens
    config: GRPOConfig,
    num_tokens: int | None = None,  # denominator: response tokens in the whole batch (for micro-batching)
    ref_logprobs: torch.Tensor | None = None,  # [N, T] frozen reference, when kl_coef > 0
    proximal_logprobs: torch.Tensor | None = None,  # [N, T] pre-update policy, detached; only for stale batches
) -> tuple[torch.Tensor, dict[str, float]]:
    """-> (loss, stats). With micro-batches, pass the whole batch's token count so the
    summed micro-batch losses equal the full-batch token mean. Stats gain `is_weight`
    (token mean of w) and `is_truncated_fraction` when `proximal_logprobs` is given."""
    mask = mask.to(logprobs.dtype)
    denominator = num_tokens if num_tokens is not None else mask.sum().clamp_min(1)
    anchor = behaviour_logprobs if proximal_logprobs is None else proximal_logprobs
    ratio = torch.exp(logprobs - anchor)
    adv = advantages.unsqueeze(1)
    clipped = ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
    surrogate = torch.minimum(ratio * adv, clipped * adv)
    extra = {}
    if proximal_logprobs is not None:
        raw = torch.exp(proximal_logprobs - behaviour_logprobs).detach()
        weight = raw.clamp(max=config.is_cap)
        surrogate = weight * surrogate
        extra = {"is_weight": float((weight * mask).sum() / denominator),
                 "is_truncated_fraction": float(((raw > config.is_cap).to(mask.dtype) * mask).sum() / denominator)}
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
    return loss, {"kl": float(kl), "clip_fraction": float(clip_frac), **extra}

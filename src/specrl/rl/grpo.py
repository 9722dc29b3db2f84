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

Masking comes before arithmetic. Under top-k / top-p the trainer scores tokens under the truncated
distribution, so a position can carry logprob -inf: prompt and padding positions, and, rarely, a
sampled response token that the trainer's own cut excludes (in bf16 a tie can fall on the other side
of the cut: about 6e-4 of tokens). -inf - (-inf) is NaN, and NaN * 0 is NaN, so no position outside
the tokens that count ever enters an exp, a subtraction or a product: every operand is replaced by 0
there first (`torch.where`, whose gradient at the replaced positions is 0, not NaN).
The rule for a response token whose current, proximal or reference logprob is -inf (or whose
behaviour logprob is not finite): it is left out of the loss, as if its mask were 0, and stays in
the denominator (the batch's response-token count, which the micro-batches share); `excluded_tokens`
counts them in the step's stats. Its gradient would be 0 anyway (rho = 0 has no gradient, and the
truncation mask is a constant), and its KL to a reference that excludes it is infinite.

Variants, one config key each:

| key | what it changes | paper |
|---|---|---|
| `grpo.clip_high` > `clip_low` | clip-higher: a looser ceiling keeps low-probability tokens exploring | DAPO (Yu et al. 2025, arXiv:2503.14476) |
| `grpo.scale_advantages=false` | A_i = r_i - mean(r), no std division | Dr. GRPO (Liu et al. 2025, arXiv:2503.20783) |
| token-mean (always) | every response token weighs the same | DAPO |
| `grpo.ratio_level=sequence` | one ratio per sequence, clipped per sequence, sequence-mean loss | GSPO (Zheng et al. 2025, arXiv:2507.18071) |
| `grpo.dynamic_sampling=true` | groups whose rewards are all equal are dropped and replaced | DAPO |
| `grpo.overlong=filter` | responses cut at rollout.max_tokens are left out of the loss | DAPO |
| `grpo.overlong=penalty` | soft length penalty added to the reward (`overlong_penalty`) | DAPO |

The last three act on the batch, not on this loss: dynamic sampling in the pipeline's buffer
(`pipeline.buffer`), the overlong handling where the learner builds the batch (`pipeline.learner`).

Sequence level (GSPO). With L_i = response i's length and x the anchor (behaviour b, or the
proximal policy when given),
    ratio      s_i = exp( (1/n_i) sum_t (l_t - x_t) )     n_i = tokens of i that count
    surrogate  S_i = min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i)
    loss       = -(1/N) sum_i (n_i / L_i) * S_i            N = sequences in the whole batch
so every sequence weighs the same, whatever its length (with no excluded token n_i = L_i).
The KL term is averaged the same way (each sequence's token mean, then over sequences), and
under version lag the IS weight is per sequence, w_i = min(exp(mean_t(x_t - b_t)), is_cap).
GSPO's paper clips far tighter than token-level GRPO (eps of 3e-4 and 4e-4): set clip_low
and clip_high to match.

Deliberately left out: value function (GRPO has none), entropy bonus, dual-clip.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

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
    ratio_level: Literal["token", "sequence"] = "token"  # sequence = GSPO's sequence-level ratio and clipping
    # DAPO's dynamic sampling: drop groups whose rewards are all equal and generate fresh prompts until the batch is full
    dynamic_sampling: bool = False
    # dynamic sampling stops the run when one step drops more than this many batches' worth of groups
    dynamic_sampling_budget: int = within(8, "[1, inf)")
    # responses cut at rollout.max_tokens: keep | filter (out of the loss) | penalty (DAPO's soft length penalty)
    overlong: Literal["keep", "filter", "penalty"] = "keep"
    overlong_buffer: int = within(16, "[1, inf)")  # penalty: the last this many tokens before max_tokens ramp to -1

    def __post_init__(self):
        check_fields(self)


def overlong_penalty(length: int, max_tokens: int, buffer: int) -> float:
    """DAPO's soft overlong punishment, added to the reward: 0 up to max_tokens - buffer tokens, then falling
    linearly to -1 at max_tokens. Example (max 32, buffer 8): 24 tokens -> 0, 28 -> -0.5, 32 -> -1."""
    return min(0.0, (max_tokens - buffer - length) / buffer)


def grpo_loss(
    logprobs: torch.Tensor,  # [N, T] current policy, per response token
    behaviour_logprobs: torch.Tensor,  # [N, T] from the rollout engine
    advantages: torch.Tensor,  # [N]
    mask: torch.Tensor,  # [N, T] 1 on response tokens
    config: GRPOConfig,
    num_tokens: int | None = None,  # denominator: response tokens in the whole batch (for micro-batching)
    ref_logprobs: torch.Tensor | None = None,  # [N, T] frozen reference, when kl_coef > 0
    proximal_logprobs: torch.Tensor | None = None,  # [N, T] pre-update policy, detached; only for stale batches
    num_sequences: int | None = None,  # sequence level: sequences in the whole batch (for micro-batching)
) -> tuple[torch.Tensor, dict[str, float]]:
    """-> (loss, stats). With micro-batches, pass the whole batch's token count (and, at sequence level, its
    sequence count) so the summed micro-batch losses equal the full batch's. Stats: `kl`, `clip_fraction`
    (means weighted as the loss weighs tokens) and `excluded_tokens` (a count: see the module docstring's rule);
    they gain `is_weight` (mean w) and `is_truncated_fraction` when `proximal_logprobs` is given."""
    response = mask > 0
    terms = [logprobs, behaviour_logprobs]
    terms += [proximal_logprobs] if proximal_logprobs is not None else []
    terms += [ref_logprobs] if config.kl_coef > 0 and ref_logprobs is not None else []
    counts = response & torch.stack([torch.isfinite(t) for t in terms]).all(0)  # [N, T] the tokens that count
    weight = counts.to(logprobs.dtype)
    sequence = config.ratio_level == "sequence"
    if sequence:  # each sequence's tokens share 1 / (L_i N)
        lengths = mask.sum(1, keepdim=True).clamp_min(1)
        token_weight = weight / (lengths * (num_sequences if num_sequences is not None else mask.shape[0]))
    else:
        token_weight = weight / (num_tokens if num_tokens is not None else mask.sum().clamp_min(1))

    def masked(values: torch.Tensor) -> torch.Tensor:  # 0 wherever a token does not count, before any arithmetic
        return torch.where(counts, values, torch.zeros((), dtype=values.dtype))

    def per_sequence_mean(values: torch.Tensor) -> torch.Tensor:  # [N, T] -> [N, 1], over the tokens that count
        return (values * weight).sum(1, keepdim=True) / weight.sum(1, keepdim=True).clamp_min(1)

    current, behaviour = masked(logprobs), masked(behaviour_logprobs)
    proximal = None if proximal_logprobs is None else masked(proximal_logprobs)
    anchor = behaviour if proximal is None else proximal
    log_ratio = current - anchor
    ratio = torch.exp(per_sequence_mean(log_ratio) if sequence else log_ratio)  # [N, 1] or [N, T]
    adv = advantages.unsqueeze(1)
    clipped = ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
    surrogate = torch.minimum(ratio * adv, clipped * adv)
    extra = {}
    if proximal is not None:
        lag = proximal - behaviour
        raw = torch.exp(per_sequence_mean(lag) if sequence else lag).detach()
        is_weight = raw.clamp(max=config.is_cap)
        surrogate = is_weight * surrogate
        extra = {"is_weight": float((is_weight * token_weight).sum()),
                 "is_truncated_fraction": float(((raw > config.is_cap).to(weight.dtype) * token_weight).sum())}
    objective = surrogate
    kl = torch.zeros((), dtype=logprobs.dtype)
    if config.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("grpo.kl_coef > 0 needs reference logprobs")
        delta = masked(ref_logprobs) - current
        per_token_kl = torch.exp(delta) - delta - 1
        objective = surrogate - config.kl_coef * per_token_kl
        kl = (per_token_kl * token_weight).sum()
    loss = -(objective * token_weight).sum()
    with torch.no_grad():
        outside = (ratio < 1 - config.clip_low) | (ratio > 1 + config.clip_high)
        clip_frac = (outside.to(weight.dtype) * token_weight).sum()
    return loss, {"kl": float(kl.detach()), "clip_fraction": float(clip_frac),
                  "excluded_tokens": int((response & ~counts).sum()), **extra}

"""Distillation losses and agreement metrics between a target p and a draft q.

Notation: p = target, q = draft, both at temperature 1, at the same positions.
The draft may have a reduced output vocabulary: its N logits score the target ids
`d2t` [N] (draft-to-target id map), and q is zero on every other target id.

- loss: soft cross-entropy  -sum_x p~(x) log q(x), where p~ is p restricted to the
  draft's support and renormalised. With a full-vocabulary draft p~ = p and this is
  KL(p || q) + H(p). The out-of-support mass of p is not in the loss (the draft can
  do nothing about it); it caps the acceptance below, which reports the truth.
- acceptance: sum_x min(p(x), q(x)), the probability that speculative sampling
  accepts one draft token drawn from q (Leviathan et al. 2023). Uses p unrenormalised.
- top1: how often argmax q (mapped to target ids) equals argmax p.
- rejection: 1 - sum_x min(p~(x), q(x)) = TV(p~, q), the probability that one draft token is rejected
  (against p~). Acceptance is 1 - TV, so this is the loss that targets it directly; its gradient
  reaches only the ids where q exceeds p~ (pushing them down) and, through the softmax, the rest.
"""
from __future__ import annotations

import torch


def _restrict(target_logits: torch.Tensor, d2t: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Target log-probs over the full vocabulary and over the draft's support."""
    logp = torch.log_softmax(target_logits.float(), dim=-1)  # [..., V]
    logp_support = logp if d2t is None else logp.index_select(-1, d2t)  # [..., N]
    return logp, logp_support


def soft_cross_entropy(logq: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """-sum_x p~(x) log q(x) per row, p~ = p [.., N] renormalised (p may hold only the mass on
    q's support, or only its top entries); logq [.., N] -> [..]."""
    return -(p / p.sum(-1, keepdim=True).clamp_min(1e-12) * logq).sum(-1)


def rejection(logq: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """TV(p~, q) = 1 - sum_x min(p~(x), q(x)) per row, p~ = p [.., N] renormalised; logq [.., N] -> [..]."""
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
    return 1.0 - torch.minimum(p, logq.exp()).sum(-1)


def distill_loss(
    target_logits: torch.Tensor,  # [B, T, V]
    draft_logits: torch.Tensor,  # [B, T, N]
    mask: torch.Tensor,  # [B, T] float, 1 on positions that count
    d2t: torch.Tensor | None = None,  # [N] long, None when N == V
) -> torch.Tensor:
    """Masked mean soft cross-entropy of q against p renormalised on q's support."""
    _, logp_support = _restrict(target_logits, d2t)
    p_support = torch.softmax(logp_support, dim=-1)  # renormalised
    logq = torch.log_softmax(draft_logits.float(), dim=-1)
    ce = -(p_support * logq).sum(-1)  # [B, T]
    return (ce * mask).sum() / mask.sum().clamp_min(1.0)


@torch.no_grad()
def agreement(
    target_logits: torch.Tensor,  # [B, T, V]
    draft_logits: torch.Tensor,  # [B, T, N]
    mask: torch.Tensor,  # [B, T]
    d2t: torch.Tensor | None = None,  # [N]
) -> dict[str, float]:
    """Sums (not means) over masked positions: loss, acceptance, top1, and the position count.

    Sums let callers accumulate over batches and divide once by `positions`.
    """
    logp, logp_support = _restrict(target_logits, d2t)
    p_support = torch.softmax(logp_support, dim=-1)
    logq = torch.log_softmax(draft_logits.float(), dim=-1)
    ce = -(p_support * logq).sum(-1)
    accept = torch.minimum(logp_support.exp(), logq.exp()).sum(-1)
    draft_top = logq.argmax(-1)
    if d2t is not None:
        draft_top = d2t[draft_top]
    top1 = (draft_top == logp.argmax(-1)).float()
    m = mask.float()
    return {
        "loss": float((ce * m).sum()),
        "acceptance": float((accept * m).sum()),
        "top1": float((top1 * m).sum()),
        "positions": float(m.sum()),
    }


def mean_agreement(totals: dict[str, float]) -> dict[str, float]:
    """Per-position means of the sums `agreement` returns."""
    n = max(totals["positions"], 1.0)
    return {k: totals[k] / n for k in ("loss", "acceptance", "top1")}


def add_totals(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0.0) + b[k] for k in b}

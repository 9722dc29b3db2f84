"""Exact speculative sampling: verify a chain of K draft tokens against the target.

Notation (fixed throughout specrl):
    p      the target's final sampling distribution (after temperature / top-k / top-p)
    q      the draft's distribution the draft tokens were sampled from
    x_i    the i-th draft token, i = 0..K-1, sampled from q_i(. | prefix, x_<i)

Theorem (Leviathan et al. 2023; Chen et al. 2023). Accept x_i with probability
min(1, p_i(x_i) / q_i(x_i)), walking left to right. At the first rejection i, emit
one token from the *residual* r_i = norm(max(0, p_i - q_i)) and stop. If all K are
accepted, emit one *bonus* token from p_K. Then every emitted token, given the tokens
before it, is distributed exactly as p. Speculation changes the speed, never the
distribution.

Terms:
    accepted   draft tokens kept (a prefix of the draft)
    recovered  the token drawn from the residual at the first rejection
    bonus      the token drawn from p_K when every draft was accepted
Special cases are the same path: a deterministic proposal (n-gram, suffix) is a
one-hot q (pass `draft_probs=None`); greedy decoding is a one-hot p, and then the
output equals plain greedy decoding token for token.
"""
from __future__ import annotations

import torch

from specrl.sampling import draw

PAD = -1


def draft_token_probs(draft_tokens: torch.Tensor, probs: torch.Tensor | None) -> torch.Tensor:
    """probs[b, i, draft_tokens[b, i]] -> [B, K]; ones for a one-hot (None) draft."""
    if probs is None:
        return torch.ones(draft_tokens.shape, dtype=torch.float32, device=draft_tokens.device)
    return probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)


def acceptance_probs(
    draft_tokens: torch.Tensor,  # [B, K] long
    draft_probs: torch.Tensor | None,  # [B, K, V] or None (one-hot)
    target_probs: torch.Tensor,  # [B, K+1, V]
) -> torch.Tensor:
    """min(1, p_i(x_i) / q_i(x_i)) for each draft token -> [B, K].

    A token with q_i(x_i) = 0 cannot have been drawn from q: it is accepted with
    probability 0, so a residual never vouches for a token the draft did not propose.
    (A chain never holds one; a tree pads its candidates with such tokens once the draft's
    support is exhausted, and `tree` needs them rejected: see its theorem.)
    One-hot proposals (`draft_probs=None`) have q_i(x_i) = 1.
    """
    K = draft_tokens.shape[1]
    p = draft_token_probs(draft_tokens, target_probs[:, :K])
    q = draft_token_probs(draft_tokens, draft_probs)
    ratio = torch.where(q > 0, p / q.clamp_min(torch.finfo(q.dtype).tiny), 0.0)
    return ratio.clamp(max=1.0)


def recovery_probs(
    draft_tokens: torch.Tensor,  # [B, K] long
    draft_probs: torch.Tensor | None,  # [B, K, V] or None
    target_probs: torch.Tensor,  # [B, K+1, V]
) -> torch.Tensor:
    """The distribution of the one extra token emitted after i accepted drafts -> [B, K+1, V].

    Row i < K is the normalised residual max(0, p_i - q_i); row K is p_K (bonus).
    A residual with no mass (p_i == q_i up to rounding, where rejection has
    probability zero) falls back to p_i, its limit.
    """
    B, K = draft_tokens.shape
    if draft_probs is None:
        draft_probs = torch.zeros_like(target_probs[:, :K]).scatter_(-1, draft_tokens.unsqueeze(-1), 1.0)
    residual = (target_probs[:, :K] - draft_probs).clamp_min(0.0)  # [B, K, V]
    mass = residual.sum(-1, keepdim=True)  # [B, K, 1]
    residual = torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(mass.dtype).tiny), target_probs[:, :K])
    return torch.cat([residual, target_probs[:, K:]], dim=1)


def verify(
    draft_tokens: torch.Tensor,  # [B, K] long
    draft_probs: torch.Tensor | None,  # [B, K, V] or None
    target_probs: torch.Tensor,  # [B, K+1, V]
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact speculative sampling for a batch of draft chains.

    Returns:
        tokens       [B, K+1] long: the accepted drafts, then one recovered or bonus
                     token, then PAD (-1).
        num_emitted  [B] long in 1..K+1: accepted drafts + 1.

    Example (K = 3): drafts [5, 7, 2], first rejection at i = 1, recovered token 4
        -> tokens [5, 4, -1, -1], num_emitted 2.
    """
    check_chain(draft_tokens, draft_probs, target_probs)
    B, K = draft_tokens.shape
    device = target_probs.device

    accept_p = acceptance_probs(draft_tokens, draft_probs, target_probs)  # [B, K]
    # float64: a float32 uniform is exactly 0 with probability 2^-24, which would accept any draft of positive
    # acceptance chance at least that often
    u = torch.rand((B, K), generator=generator, device=device, dtype=torch.float64)
    accepted = (u < accept_p).long().cumprod(dim=1)  # [B, K], 1 until the first rejection
    num_accepted = accepted.sum(dim=1)  # [B]

    recover = recovery_probs(draft_tokens, draft_probs, target_probs)  # [B, K+1, V]
    rows = recover[torch.arange(B, device=device), num_accepted]  # [B, V]
    extra = draw(rows, generator)  # [B]

    return emitted_tokens(draft_tokens, num_accepted, extra), num_accepted + 1


def check_chain(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor) -> None:
    """Raise ValueError naming the argument whose shape does not fit a batch of K-draft chains."""
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [B, K], got shape {tuple(draft_tokens.shape)}")
    B, K = draft_tokens.shape
    if target_probs.shape[:2] != (B, K + 1):
        raise ValueError(f"target_probs must be [B, K+1, V] = [{B}, {K + 1}, V], got {tuple(target_probs.shape)}")
    if draft_probs is not None and draft_probs.shape != (B, K, target_probs.shape[-1]):
        raise ValueError(f"draft_probs must be [B, K, V] matching target_probs, got {tuple(draft_probs.shape)}")


def emitted_tokens(draft_tokens: torch.Tensor, num_accepted: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    """[B, K+1]: each row's first num_accepted drafts, then its extra (recovered or bonus) token, then PAD."""
    B, K = draft_tokens.shape
    positions = torch.arange(K + 1, device=draft_tokens.device).unsqueeze(0)  # [1, K+1]
    padded = torch.cat([draft_tokens, torch.full((B, 1), PAD, dtype=torch.long, device=draft_tokens.device)], dim=1)
    tokens = torch.where(positions < num_accepted.unsqueeze(1), padded, PAD)
    tokens.scatter_(1, num_accepted.unsqueeze(1), extra.unsqueeze(1))
    return tokens

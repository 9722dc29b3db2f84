"""Block verification: accept a chain of K drafts jointly, exactly, and at least as often.

Notation as in `verify`: p_i the target's sampling distribution and q_i the draft's, after the
first i drafts x_0..x_{i-1}; x_i ~ q_i.

Theorem (Sun, Mendlovic, Leviathan, Aharoni, Beirami, Ro, Suresh 2024, "Block Verification
Accelerates Speculative Decoding", Algorithm 2 and Theorems 1-2). Let

    w_0 = 1,  w_i = min(1, w_{i-1} p_{i-1}(x_{i-1}) / q_{i-1}(x_{i-1}))       i = 1..K
    r_i(x) = max(0, w_i p_i(x) - q_i(x)),  R_i = sum_x r_i(x)                 i = 0..K-1
    h_i = R_i / (R_i + 1 - w_i)  for 1 <= i < K,  h_K = w_K

Draw eta_1..eta_K uniform on [0, 1) and let tau be the largest i with eta_i < h_i (0 if none).
Emit x_0..x_{tau-1}, then one token from norm(r_tau) if tau < K, or the bonus from p_K if
tau = K. Then every emitted token, given the tokens before it, is distributed exactly as p, and
E[tau] is at least token verification's expected accepted count, for every p and q: block
verification is the optimal valid verifier of a draft block (Theorem 2).

w_i is how much of the block's first i drafts the target still vouches for jointly, so a draft
that token verification would reject can be kept when the drafts after it make up for it:
decisions are made on the block, and tau is the last stop that passes, not the first failure.
With K = 1 it is token verification. Edge cases take their limits: h_i = 1 where w_i = 1 (then
R_i = 0 means p_i = q_i, and no later position can end the walk there), and a residual with no
mass falls back to p_i. A one-hot draft (`draft_probs=None`) has q_i(x_i) = 1; greedy decoding
(one-hot p) accepts exactly the matching prefix, as token verification does.
"""
from __future__ import annotations

import torch

from specrl.sampling import draw
from specrl.speculation.verify import check_chain, draft_token_probs, emitted_tokens


def block_rule(
    draft_tokens: torch.Tensor,  # [B, K] long
    draft_probs: torch.Tensor | None,  # [B, K, V] or None (one-hot)
    target_probs: torch.Tensor,  # [B, K+1, V]
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (h [B, K], extra [B, K+1, V]): h[:, i-1] is the stop probability h_i of the theorem, and
    extra[:, j] the (unnormalised) distribution of the token emitted after j accepted drafts:
    r_j for j < K, p_K for j = K."""
    B, K = draft_tokens.shape
    ratio_p = draft_token_probs(draft_tokens, target_probs[:, :K]).double()
    ratio_q = draft_token_probs(draft_tokens, draft_probs).double()
    ratio = torch.where(ratio_q > 0, ratio_p / ratio_q.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    weights = [torch.ones(B, dtype=torch.float64, device=target_probs.device)]  # w_0..w_K
    for i in range(K):
        weights.append((weights[-1] * ratio[:, i]).clamp(max=1.0))
    w = torch.stack(weights, dim=1)  # [B, K+1]
    if draft_probs is None:
        draft_probs = torch.zeros_like(target_probs[:, :K]).scatter_(-1, draft_tokens.unsqueeze(-1), 1.0)
    residual = (w[:, :K, None].to(target_probs.dtype) * target_probs[:, :K] - draft_probs).clamp_min(0.0)
    mass = residual.sum(-1)  # [B, K]
    residual = torch.where(mass.unsqueeze(-1) > 0, residual, target_probs[:, :K])
    stop = mass[:, 1:].double() / (mass[:, 1:].double() + 1 - w[:, 1:K])
    stop = torch.where(w[:, 1:K] >= 1, 1.0, stop)
    h = torch.cat([stop, w[:, K:]], dim=1) if K else w[:, :0]  # [B, K]
    return h, torch.cat([residual, target_probs[:, K:]], dim=1)


def block_verify(
    draft_tokens: torch.Tensor,  # [B, K] long
    draft_probs: torch.Tensor | None,  # [B, K, V] or None
    target_probs: torch.Tensor,  # [B, K+1, V]
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification of a batch of draft chains; returns (tokens [B, K+1], num_emitted [B])
    exactly as `verify` does: the accepted drafts, one recovered or bonus token, then PAD."""
    check_chain(draft_tokens, draft_probs, target_probs)
    B, K = draft_tokens.shape
    device = target_probs.device
    h, extra_rows = block_rule(draft_tokens, draft_probs, target_probs)
    eta = torch.rand((B, K), generator=generator, device=device, dtype=torch.float64)
    depth = torch.arange(1, K + 1, device=device)
    num_accepted = torch.where(eta < h, depth, 0).amax(dim=1) if K else torch.zeros(B, dtype=torch.long,
                                                                                      device=device)
    extra = draw(extra_rows[torch.arange(B, device=device), num_accepted], generator)
    return emitted_tokens(draft_tokens, num_accepted, extra), num_accepted + 1

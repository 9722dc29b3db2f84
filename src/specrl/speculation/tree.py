"""Exact tree speculation: w candidate first tokens, each followed by its own chain of drafts.

Notation as in `verify`: p = the target's sampling distribution, q = a draft's.

The tree (`TreeShape`, the same for every row of a step) has a root, the row's last token, and w
branches of depth k: branch j is a candidate first token c_j followed by k - 1 drafts drafted
after c_j. The target scores all 1 + w*k nodes in one forward pass; a node attends to the row's
past, the root, and its own branch up to itself (`TreeShape.ancestors`).

Verification, per row:
    first token (multi-draft, recursive rejection sampling; Jeon et al. 2024, "Recursive
    Speculative Decoding", with candidates drawn without replacement):
        r_1 = p_root, s_1 = q_1 (the distribution c_1 was drawn from)
        for j = 1..w:  accept c_j with probability min(1, r_j(c_j) / s_j(c_j)); if accepted,
                       continue down branch j; else
                       r_{j+1} = norm(max(0, r_j - s_j))   the residual
                       s_{j+1} = s_j without c_j, renormalised (c_{j+1} was drawn from it)
        if every candidate is rejected, emit one token from r_{w+1} and stop.
    below the accepted c_j: exactly the chain verification of `verify` on branch j's drafts, with
    p at branch j's nodes (a recovered token from the residual, or the bonus after the last draft).

Theorem. Every emitted token, given the tokens before it, is distributed as p. For the first token,
by induction from stage w + 1 down: stage j's output is c_j with probability
s_j(c_j) min(1, r_j(c_j) / s_j(c_j)) = min(r_j, s_j)(c_j), and otherwise the next stage's output,
which is r_{j+1} whatever c_j was (the next stage is exact for any proposal); since
min(r_j, s_j) + (1 - sum min(r_j, s_j)) r_{j+1} = r_j, stage j outputs r_j, and stage 1 outputs p.
Deterministic candidates (top-w of a draft, n-gram, greedy heads) are the same path with s_j
one-hot on c_j: c_j is accepted with probability r_j(c_j).

Truncated drafts (top-k / top-p, or a reduced vocabulary) may give q_1 fewer than w tokens of mass.
Then the draws without replacement exhaust it, s_j = 0 for every later stage, and the proposer
pads the tree with tokens of zero draft mass, which were not drawn from s_j. Such a candidate is
accepted with probability 0 (`acceptance_probs` at s_j(c_j) = 0), and r_{j+1} = norm(max(0, r_j - 0))
= r_j, so stage j outputs r_{j+1} = r_j: the induction holds, and padding only costs width.
(Accepting it when r_j(c_j) > 0, the limit of the ratio, would emit c_j with probability 1 in
place of r_j: every sample would be the padded token.) While s_j has mass, the candidate has
s_j(c_j) > 0, because `draw_without_replacement` draws every token of positive mass before any
other. The tokens after c_j are exact by the chain theorem, the branch's drafts having been drawn
given c_j. At temperature 0 (p one-hot) the output is plain greedy decoding.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from specrl.sampling import draw
from specrl.speculation.verify import PAD, acceptance_probs, recovery_probs, verify


@dataclass(frozen=True)
class TreeShape:
    """w branches of depth k under a root. Node 0 is the root; branch j's node at depth d (1..k) is
    1 + j * k + (d - 1).

    Example, w = 2, k = 2: nodes [root, c_0, d_0, c_1, d_1], depths [0, 1, 2, 1, 2];
    node 4 (d_1) attends to nodes 0, 3, 4.
    """

    width: int
    depth: int

    @property
    def size(self) -> int:
        return 1 + self.width * self.depth

    @cached_property
    def depths(self) -> torch.Tensor:
        """[size] long: each node's depth (its position offset from the root)."""
        return torch.cat([torch.zeros(1, dtype=torch.long),
                          torch.arange(1, self.depth + 1).repeat(self.width)])

    @cached_property
    def ancestors(self) -> torch.Tensor:
        """[size, size] bool: node t attends to node s (the root, and its branch up to itself)."""
        mask = torch.zeros(self.size, self.size, dtype=torch.bool)
        mask[:, 0] = True
        for j in range(self.width):
            first = 1 + j * self.depth
            for d in range(self.depth):
                mask[first + d, first:first + d + 1] = True
        return mask

    def path(self, branch: torch.Tensor) -> torch.Tensor:
        """[B] branch per row -> [B, depth + 1] node indices along it (root first); a row with no
        accepted branch (-1) gets branch 0's nodes, which only its root is read from."""
        j = branch.clamp_min(0).unsqueeze(1)
        return torch.cat([torch.zeros_like(j), 1 + j * self.depth + torch.arange(self.depth).unsqueeze(0)], dim=1)


def without_replacement(q: torch.Tensor, drawn: torch.Tensor) -> torch.Tensor:
    """q [B, V] with the tokens `drawn` [B] removed and renormalised (the law of the next draw)."""
    rest = q.scatter(-1, drawn.unsqueeze(-1), 0.0)
    mass = rest.sum(-1, keepdim=True)
    return torch.where(mass > 0, rest / mass.clamp_min(torch.finfo(q.dtype).tiny), rest)


def first_token_stages(candidates: torch.Tensor, q_first: torch.Tensor | None, p_root: torch.Tensor):
    """The recursive rejection sampling of the first token, stage by stage.

    candidates [B, w]; q_first [B, V] the draft's distribution they were drawn from without replacement
    (None: deterministic candidates); p_root [B, V]. Returns (accept [B, w]: P(accept c_j | stage j
    reached), final [B, V]: r_{w+1}, the distribution a row that rejects every candidate samples from).
    """
    B, w = candidates.shape
    r = p_root
    s = q_first
    accept = []
    for j in range(w):
        c = candidates[:, j]
        s_j = torch.zeros_like(p_root).scatter_(-1, c.unsqueeze(-1), 1.0) if q_first is None else s
        accept.append(acceptance_probs(c.unsqueeze(1), s_j.unsqueeze(1), r.unsqueeze(1))[:, 0])
        r = recovery_probs(c.unsqueeze(1), s_j.unsqueeze(1), torch.stack([r, r], dim=1))[:, 0]
        if q_first is not None:
            s = without_replacement(s, c)
    return torch.stack(accept, dim=1), r


def verify_tree(
    candidates: torch.Tensor,  # [B, w] long: the first tokens
    q_first: torch.Tensor | None,  # [B, V] the distribution they were drawn from without replacement, or None
    drafts: torch.Tensor,  # [B, w, k-1] long: each branch's drafts after its candidate
    q_drafts: torch.Tensor | None,  # [B, w, k-1, V] their distributions, or None (one-hot)
    p_root: torch.Tensor,  # [B, V] the target at the root (predicting the first token)
    p_nodes: torch.Tensor,  # [B, w, k, V] the target at branch j's depth-d node (predicting depth d + 1)
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact verification of a tree (module docstring). Returns tokens [B, k+1] (emitted tokens then PAD),
    num_emitted [B] in 1..k+1, and branch [B]: the accepted branch, -1 when every candidate was rejected."""
    B, w = candidates.shape
    k = drafts.shape[2] + 1
    device = p_root.device
    accept, final = first_token_stages(candidates, q_first, p_root)
    u = torch.rand((B, w), generator=generator, device=device, dtype=torch.float64)  # float64: as in `verify`
    passed = u < accept  # [B, w]
    branch = torch.where(passed.any(1), passed.long().argmax(1), torch.full((B,), -1, device=device))
    rows = torch.arange(B, device=device)
    j = branch.clamp_min(0)
    # below the accepted candidate: the chain theorem on its branch
    chain_tokens, chain_emitted = verify(drafts[rows, j], None if q_drafts is None else q_drafts[rows, j],
                                         p_nodes[rows, j], generator)
    rejected = draw(final, generator)  # [B]
    tokens = torch.full((B, k + 1), PAD, dtype=torch.long, device=device)
    tokens[:, 0] = torch.where(branch >= 0, candidates[rows, j], rejected)
    tokens[:, 1:] = torch.where((branch >= 0).unsqueeze(1), chain_tokens, PAD)
    num_emitted = torch.where(branch >= 0, 1 + chain_emitted, 1)
    return tokens, num_emitted, branch


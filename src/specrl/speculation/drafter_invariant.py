"""Drafter-invariant sampling: a seeded call returns the same tokens with any proposer, or none.

Notation as in `verify`: p = the target's sampling distribution, q = a draft's.

Every token is drawn by an exponential race on noise keyed by the token's place, not by the order of
the draws: the call's key (its seed), the sample (the row's output index) and the token's position in its
response (`position_keys`). For a key, id i gets w_i = hash(key, i) uniform in (0, 1) and E_i = -log(1 - w_i),
an Exp(1) variable, and

    race(p, key) = argmin over ids with p(i) > 0 of E_i / p(i)

is id i with probability p(i): the Gumbel-max trick, log p(i) - log E_i being log p(i) plus a standard
Gumbel. Verification (`verify_chain`, `verify_tree`), per row: the target's token at each position is the
race on p there; a draft is kept while it equals that token, and the first position with no equal draft
emits the target's token and stops.

Theorem. The emitted tokens are those plain decoding emits from the same key. At each position the
emitted token is the race on p given the tokens before it, whatever was drafted; the noise of a position
depends on the key, the sample and the position only, never on the tokens before it, so each token given
the tokens before it is distributed as p. A draft changes how many positions one target pass settles,
never what they hold.

Drafts (`race` on q with the same position's key) are accepted with probability P(race on q = race on p),
at least (1 - TV) / (1 + TV) for TV the total variation between p and q (the Gumbel coupling; Daliri et
al. 2024, "Coupling without communication and drafter-invariant speculative decoding"), against 1 - TV
for `verify`'s rejection rule: invariance costs some acceptance where q is far from p, little where it is
close. A deterministic draft (n-gram, suffix) is accepted with probability p(draft), as under `verify`.

Resolution: w_i is an odd multiple of 2^-54, so E_i >= 2^-54 and never 0; an id whose mass is below
about 1e-16 of the leading id's is drawn less often than its mass says, the same float64 resolution as
`sampling.draw`.
"""
from __future__ import annotations

import numpy as np
import torch

from specrl.kernels import draft_sampler
from specrl.speculation.verify import PAD, emitted_tokens

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment
_MASK64 = (1 << 64) - 1
_GROUP_SALT = np.uint64(0x5DEECE66DA3B9F01)  # the groups' race draws from the key's stream under this salt
GROUP = 256  # ids per group of `race`'s first race (a multiple of 8: the kernel sums blocks of 8 ids)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (numpy's uint64 arithmetic wraps modulo 2^64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def call_key(seed: int | None) -> int:
    """A call's key: its seed (modulo 2^64), or a fresh random one for an unseeded call."""
    if seed is None:
        return int(torch.randint(0, 2 ** 62, ()).item())
    return seed & _MASK64


def position_keys(key: int, samples: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The noise keys of tokens: samples [B] (each row's output index in its call), positions [B, T] (each
    token's place in its response, 0 for the first) -> [B, T] int64 (the key's 64 bits).

    Example: key 7, samples [0, 1], positions [[3, 4], [3, 4]] -> four distinct keys; the same arguments in
    any other call give the same four."""
    with np.errstate(over="ignore"):
        row = _mix(np.uint64(key) + _GOLDEN * (samples.numpy().astype(np.uint64) + np.uint64(1)))
        keys = _mix(row[:, None] + _GOLDEN * (positions.numpy().astype(np.uint64) + np.uint64(1)))
    return torch.from_numpy(keys.view(np.int64))


def exponentials(keys: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """E [R, N] float64 Exp(1) variables, one per key [R] and id ids [R, N] (non-negative): E = -log(1 - w),
    w = (2 j + 1) 2^-54 for j the top 53 bits of splitmix64's (id + 1)-th output from the key (0 < w < 1, so
    E >= 2^-54)."""
    with np.errstate(over="ignore"):
        state = keys.numpy().view(np.uint64)[:, None] + (ids.numpy().astype(np.uint64) + np.uint64(1)) * _GOLDEN
        bits = _mix(state)
    w = ((bits >> np.uint64(10)) | np.uint64(1)).astype(np.float64) * 2.0 ** -54
    return torch.from_numpy(-np.log1p(-w))


def race(probs: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """probs [R, V] (non-negative, each row with positive mass; rows need not sum to 1), keys [R] -> [R] long:
    id i of each row, drawn with probability proportional to p(i).

    Two races, so a draw hashes ~2 sqrt(V) ids, not V: the ids fall in groups of `GROUP` consecutive ids, a
    race over the groups' masses picks one (group g with probability P_g / sum P), and a race inside it picks
    an id (i with probability p(i) / P_g); their noise comes from independent streams of the key. fp32 rows on
    the CPU run in one kernel call (`kernels.draft_sampler.race`, the same noise; masses summed in another
    order, so the two agree but for float64 rounding)."""
    if draft_sampler.takes(probs):
        return draft_sampler.race(probs, keys, GROUP)
    return race_in_torch(probs, keys)


def race_in_torch(probs: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """`race` in PyTorch and numpy, for any float dtype on the CPU: the kernel's reference."""
    R, V = probs.shape
    if R == 0:
        return torch.zeros(0, dtype=torch.long)
    G = -(-V // GROUP)
    padded = torch.nn.functional.pad(probs, (0, G * GROUP - V)) if G > 1 and G * GROUP > V else probs
    grouped = padded.reshape(R, G, -1)  # [R, G, GROUP] (one group of V ids where V <= GROUP)
    masses = grouped.sum(-1, dtype=torch.float64)  # [R, G]
    if not bool((masses.sum(-1) > 0).all()) or not bool(torch.isfinite(masses).all()):  # NaN fails the first
        raise ValueError("cannot draw from a row with no probability mass (all zero), or with a NaN or infinite "
                         "entry")
    g = torch.zeros(R, dtype=torch.long)
    if G > 1:
        with np.errstate(over="ignore"):
            group_keys = torch.from_numpy(_mix(keys.numpy().view(np.uint64) ^ _GROUP_SALT).view(np.int64))
        g = (masses.log() - exponentials(group_keys, torch.arange(G).expand(R, G)).log()).argmax(-1)
    members = g.unsqueeze(1) * GROUP + torch.arange(grouped.shape[-1])  # [R, GROUP] the ids of each row's group
    inside = grouped[torch.arange(R), g].double()
    return members.gather(1, (inside.log() - exponentials(keys, members).log()).argmax(-1, keepdim=True)).squeeze(1)


def verify_chain(
    draft_tokens: torch.Tensor,  # [B, K] long
    target_probs: torch.Tensor,  # [B, K+1, V]
    keys: torch.Tensor,  # [B, K+1] the noise keys of the K+1 positions
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafter-invariant verification of a batch of chains (module docstring). Returns tokens [B, K+1] (the
    accepted drafts, then the target's token where no draft matched, or the bonus, then PAD) and num_emitted [B]
    in 1..K+1, as `verify.verify` does. The race runs at every position in one call (the ones past a row's
    first mismatch are not read)."""
    B, K = draft_tokens.shape
    target = race(target_probs.reshape(B * (K + 1), -1), keys.reshape(-1)).view(B, K + 1)
    num_accepted = (draft_tokens == target[:, :K]).long().cumprod(1).sum(1)  # [B]
    extra = target.gather(1, num_accepted.unsqueeze(1)).squeeze(1)
    return emitted_tokens(draft_tokens, num_accepted, extra), num_accepted + 1


def verify_tree(
    candidates: torch.Tensor,  # [B, w] long: the first tokens
    drafts: torch.Tensor,  # [B, w, k-1] long: each branch's drafts after its candidate
    p_root: torch.Tensor,  # [B, V] the target at the root
    p_nodes: torch.Tensor,  # [B, w, k, V] the target at branch j's depth-d node (predicting depth d + 1)
    keys: torch.Tensor,  # [B, k+1] the noise keys of the root's position and the k after it
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drafter-invariant verification of a tree: the target's first token, then `verify_chain` down the branch
    whose candidate equals it. Returns tokens [B, k+1], num_emitted [B] and branch [B] (-1: no candidate
    matched), as `tree.verify_tree` does."""
    B, k = candidates.shape[0], drafts.shape[2] + 1
    first = race(p_root, keys[:, 0])
    hit = candidates == first.unsqueeze(1)  # [B, w]
    branch = torch.where(hit.any(1), hit.long().argmax(1), -1)
    tokens = torch.full((B, k + 1), PAD, dtype=torch.long)
    tokens[:, 0] = first
    num_emitted = torch.ones(B, dtype=torch.long)
    rows = (branch >= 0).nonzero().flatten()
    if rows.numel():
        j = branch[rows]
        chain, emitted = verify_chain(drafts[rows, j], p_nodes[rows, j], keys[rows, 1:])
        tokens[rows, 1:] = chain
        num_emitted[rows] += emitted
    return tokens, num_emitted, branch

"""The verifier as a theorem: speculative sampling preserves the target distribution.

Chain of checks:
    exact       the output distribution, computed in closed form from the verifier's own
                acceptance and recovery probabilities, equals the target's to 1e-6;
    sampled     `verify` itself, run many times, passes a chi-square test against p;
    greedy      with one-hot p the output is the target's argmax path, token for token;
    edges       q = 0 where p > 0, p == q, one-hot drafts (None), K = 0.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

from specrl.speculation import verify
from specrl.speculation.verify import acceptance_probs, recovery_probs

V = 5


def random_dist(gen: torch.Generator, sharp: float = 1.5, zero_some: bool = True) -> torch.Tensor:
    logits = torch.randn(V, generator=gen, dtype=torch.float64) * sharp
    if zero_some:  # zero probabilities exercise q = 0 where p > 0 and the reverse
        logits[torch.randint(0, V, (1,), generator=gen)] = float("-inf")
    return logits.softmax(-1)


class PrefixTables:
    """An autoregressive distribution over V tokens given as a table keyed by prefix."""

    def __init__(self, seed: int, zero_some: bool = True):
        self.gen = torch.Generator().manual_seed(seed)
        self.table: dict[tuple, torch.Tensor] = {}
        self.zero_some = zero_some

    def __call__(self, prefix: tuple) -> torch.Tensor:
        if prefix not in self.table:
            self.table[prefix] = random_dist(self.gen, zero_some=self.zero_some)
        return self.table[prefix]


def completed_distribution(p: PrefixTables, q: PrefixTables | None, k: int, greedy_draft=None) -> dict:
    """Exact P(x_0..x_k) when one verify step's output is completed to k+1 tokens by the target.

    Enumerates every draft chain d (probability prod q), applies the verifier's own
    acceptance and recovery probabilities, and completes short outputs with p.
    """
    result = {seq: 0.0 for seq in itertools.product(range(V), repeat=k + 1)}
    chains = itertools.product(range(V), repeat=k) if q is not None else [greedy_draft]
    for d in chains:
        q_rows = [q(tuple(d[:i])) for i in range(k)] if q is not None else None
        chain_prob = float(torch.prod(torch.stack([q_rows[i][d[i]] for i in range(k)]))) if q is not None and k else 1.0
        if chain_prob == 0:
            continue
        tokens = torch.tensor([d], dtype=torch.long)
        p_rows = torch.stack([p(tuple(d[:i])) for i in range(k + 1)]).unsqueeze(0)  # [1, k+1, V]
        q_t = torch.stack(q_rows).unsqueeze(0) if q_rows else None
        accept = acceptance_probs(tokens, q_t, p_rows)[0]  # [k]
        recover = recovery_probs(tokens, q_t, p_rows)[0]  # [k+1, V]
        for m in range(k + 1):  # m drafts accepted, then one recovered / bonus token
            reach = float(torch.prod(accept[:m])) * (float(1 - accept[m]) if m < k else 1.0)
            for x in range(V):
                head = tuple(d[:m]) + (x,)
                mass = chain_prob * reach * float(recover[m, x])
                if mass == 0:
                    continue
                for tail in itertools.product(range(V), repeat=k - m):
                    seq, prob = head, mass
                    for t in tail:
                        prob *= float(p(seq)[t])
                        seq = seq + (t,)
                    result[seq] += prob
    return result


def target_joint(p: PrefixTables, k: int) -> dict:
    out = {}
    for seq in itertools.product(range(V), repeat=k + 1):
        prob = 1.0
        for i, t in enumerate(seq):
            prob *= float(p(seq[:i])[t])
        out[seq] = prob
    return out


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_output_distribution_equals_target_for_sampled_drafts(k, seed):
    p, q = PrefixTables(100 + seed), PrefixTables(200 + seed)
    got, want = completed_distribution(p, q, k), target_joint(p, k)
    assert max(abs(got[s] - want[s]) for s in want) < 1e-6


@pytest.mark.parametrize("k", [1, 3])
def test_exact_output_distribution_equals_target_for_one_hot_drafts(k):
    p = PrefixTables(7)
    got, want = completed_distribution(p, None, k, greedy_draft=(2, 0, 4)[:k]), target_joint(p, k)
    assert max(abs(got[s] - want[s]) for s in want) < 1e-6


def test_monte_carlo_output_passes_chi_square_against_target(device):
    """Seeded; a correct sampler fails with probability 1e-4 (the p-value threshold) per cell set."""
    gen = torch.Generator().manual_seed(0)
    k, n = 2, 40_000
    p_rows = torch.stack([random_dist(gen) for _ in range(k + 1)]).float()  # position-wise, prefix-free
    q_rows = torch.stack([random_dist(gen) for _ in range(k)]).float()
    drafts = torch.stack([torch.multinomial(q_rows[i], n, replacement=True, generator=gen) for i in range(k)], 1)
    on = torch.Generator(device).manual_seed(0)  # verify samples on `device`
    tokens, emitted = (t.cpu() for t in verify(drafts.to(device), q_rows.expand(n, k, V).to(device),
                                               p_rows.expand(n, k + 1, V).to(device), generator=on))
    # complete every output to k+1 tokens from p, then test the joint of the first two tokens
    fill = torch.stack([torch.multinomial(p_rows[i], n, replacement=True, generator=gen) for i in range(k + 1)], 1)
    full = torch.where(tokens >= 0, tokens, fill)
    observed = torch.bincount(full[:, 0] * V + full[:, 1], minlength=V * V).double()
    expected = (p_rows[0].double().unsqueeze(1) * p_rows[1].double().unsqueeze(0)).flatten() * n
    keep = expected > 0
    assert observed[~keep].sum() == 0, "sampled a token the target gives probability 0"
    assert chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum()).pvalue > 1e-4
    assert int(emitted.min()) >= 1 and int(emitted.max()) <= k + 1


def one_hot(indices: list[list[int]]) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(indices), V).float()


def test_greedy_accepts_matching_prefix_then_emits_target_argmax():
    p = one_hot([[1, 2, 3, 4], [1, 2, 3, 4]])  # target's greedy path per position
    drafts = torch.tensor([[1, 2, 0], [1, 2, 3]])
    tokens, emitted = verify(drafts, None, p)
    assert tokens.tolist() == [[1, 2, 3, -1], [1, 2, 3, 4]]
    assert emitted.tolist() == [3, 4]


def test_greedy_first_draft_wrong_emits_only_the_target_token():
    tokens, emitted = verify(torch.tensor([[0, 2]]), None, one_hot([[3, 2, 1]]))
    assert tokens.tolist() == [[3, -1, -1]] and emitted.tolist() == [1]


def test_rejected_position_samples_from_residual_where_draft_has_no_mass():
    # q puts all mass on token 0, p has mass on 0 and 1: a rejection must recover token 1.
    p = torch.tensor([[[0.5, 0.5, 0, 0, 0], [0.2] * 5]])
    q = torch.tensor([[[1.0, 0, 0, 0, 0]]])
    gen = torch.Generator().manual_seed(0)
    results = [verify(torch.tensor([[0]]), q, p, generator=gen) for _ in range(400)]
    rejected = [t[0, 0].item() for t, m in results if m.item() == 1]
    assert rejected and set(rejected) == {1}
    assert 0.4 < len(rejected) / len(results) < 0.6  # rejection probability 1 - p/q = 0.5


def test_equal_draft_and_target_accept_everything():
    gen = torch.Generator().manual_seed(3)
    dist = torch.stack([random_dist(gen) for _ in range(4)]).float().unsqueeze(0).expand(64, 4, V)
    drafts = torch.multinomial(dist[:, :3].reshape(-1, V), 1, generator=gen).view(64, 3)
    _, emitted = verify(drafts, dist[:, :3], dist, generator=gen)
    assert emitted.tolist() == [4] * 64


def test_k_zero_is_plain_sampling_from_position_zero():
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.1, 0.0, 0.9, 0.0, 0.0]]).expand(20_000, 1, V)
    tokens, emitted = verify(torch.zeros(20_000, 0, dtype=torch.long), None, p, generator=gen)
    assert tokens.shape == (20_000, 1) and emitted.eq(1).all()
    assert set(tokens[:, 0].tolist()) == {0, 2}
    assert abs(tokens[:, 0].eq(2).float().mean().item() - 0.9) < 0.01  # 5 standard deviations


def test_draft_token_outside_target_support_is_always_rejected():
    p = one_hot([[4, 4]]) * 0 + torch.tensor([[[0, 0, 0, 0.5, 0.5], [0.2] * 5]])
    q = torch.tensor([[[0.5, 0, 0, 0.5, 0]]])
    tokens, emitted = verify(torch.tensor([[0]]), q, p, generator=torch.Generator().manual_seed(1))
    assert emitted.item() == 1 and tokens[0, 0].item() in (3, 4)


def test_shape_mismatch_names_the_argument():
    with pytest.raises(ValueError, match="target_probs"):
        verify(torch.zeros(2, 3, dtype=torch.long), None, torch.rand(2, 3, V))


# torch.Generator().manual_seed(ZERO_UNIFORM_SEED) makes torch.rand's first float32 uniform exactly 0 (the low 24
# bits of the Mersenne twister's first output are 0; found by search over seeds), and its first float64 uniform
# 2.26e-7. Float32 uniforms are 0 with probability 2^-24, and `u < a` then accepts a draft of any acceptance
# chance a > 0.
ZERO_UNIFORM_SEED = 5528393


def test_the_seed_gives_a_zero_float32_uniform():
    assert torch.rand(1, generator=torch.Generator().manual_seed(ZERO_UNIFORM_SEED)).item() == 0.0


def test_a_draft_of_tiny_acceptance_chance_is_not_accepted_by_a_zero_float32_uniform():
    """Acceptance 1e-9: with a float64 uniform (2.26e-7 at this seed) the draft is rejected, as it is but for
    1e-9 of draws; with the float32 uniform (0.0) it would be accepted."""
    p = torch.tensor([[[1e-9, 1 - 1e-9], [0.5, 0.5]]], dtype=torch.float64)
    tokens, emitted = verify(torch.tensor([[0]]), None, p, generator=torch.Generator().manual_seed(ZERO_UNIFORM_SEED))
    assert emitted.item() == 1 and tokens[0, 0].item() == 1

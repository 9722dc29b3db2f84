"""Drafter-invariant sampling (`speculation.drafter_invariant`): the race's law, and the verification theorem.

Chain of invariants:
    noise        E ~ Exp(1) (Kolmogorov-Smirnov), never 0, and as often below 1e-3 as Exp(1) says;
    keys         a token's key is a function of (key, sample, position) alone, distinct across them;
    race         id i drawn with probability p(i) (chi-square, over both the groups' race and the ids' race);
                 the kernel's race draws the reference's ids;
    drafts       a draft drawn by the race on q is distributed as the q `sample_draft_token` reports;
    verification a chain's or a tree's emitted tokens are the target's races at their positions, whatever the
                 drafts: the theorem, checked token for token on random cases;
    coupling     drafts raced on q with the target's keys are accepted about as often as P(race q = race p).
The engine end to end (speculation on == off at temperature 1, every proposer) is `test_engine`'s; its samples
against the exact joint, `test_engine_exactness_matrix`'s.
Each chi-square or KS test fails a correct sampler with probability 1e-4 (its p-value threshold); seeded.
"""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare, kstest

from specrl.backends.vllm.convert import to_vllm_sampling
from specrl.kernels import draft_sampler, small_gemm
from specrl.pipeline.config import load_config
from specrl.sampling import SamplingParams
from specrl.speculation import drafter_invariant
from specrl.speculation.drafter_invariant import (GROUP, exponentials, position_keys, race, race_in_torch, verify_chain,
                                                 verify_tree)
from specrl.speculation.proposer import sample_draft_token

P_VALUE = 1e-4


def keys_for(count: int, key: int = 3, position: int = 0) -> torch.Tensor:
    """[count] keys: samples 0..count-1 at one position."""
    return position_keys(key, torch.arange(count), torch.full((count, 1), position))[:, 0]


def chi_square_pvalue(draws: torch.Tensor, probs: torch.Tensor) -> float:
    """Draws [n] against probabilities [V]: none may land where p = 0; chi-square over the ids of positive mass."""
    counts = torch.bincount(draws, minlength=probs.numel()).double()
    assert counts[probs == 0].sum() == 0
    kept = probs > 0
    expected = probs[kept].double()
    return chisquare(counts[kept], expected / expected.sum() * counts.sum()).pvalue


def test_the_noise_is_exponential_never_zero_and_right_down_to_small_values():
    E = exponentials(keys_for(250), torch.arange(4000).expand(250, -1)).flatten()  # 1e6 variables
    assert kstest(E.numpy(), "expon").pvalue > P_VALUE
    assert float(E.min()) > 0
    small = int((E < 1e-3).sum())  # Poisson, mean 1e6 (1 - e^-0.001) = 999.5: 5 sigma is 158
    assert abs(small - 999.5) < 158


def test_a_tokens_key_depends_on_the_key_the_sample_and_the_position_alone():
    keys = position_keys(7, torch.tensor([0, 1, 2]), torch.tensor([[0, 1, 2, 3]] * 3))  # [3, 4]
    assert keys.unique().numel() == 12
    again = position_keys(7, torch.tensor([2, 0]), torch.tensor([[3, 0], [1, 2]]))
    assert again.tolist() == [[keys[2, 3], keys[2, 0]], [keys[0, 1], keys[0, 2]]]
    assert not torch.equal(position_keys(8, torch.tensor([0]), torch.tensor([[0]])), keys[:1, :1])
    assert drafter_invariant.call_key(-1) == 2 ** 64 - 1  # any int seed is a 64-bit key


@pytest.mark.parametrize("vocab", [5, 3 * GROUP + 17], ids=["one-group", "four-groups"])
def test_the_race_draws_each_id_with_its_probability(vocab):
    """100,000 draws from one p with zeros (a truncation) in every group; chi-square, false failure odds 1e-4."""
    g = torch.Generator().manual_seed(vocab)
    p = torch.rand(vocab, generator=g) ** 3
    p[torch.randperm(vocab, generator=g)[:vocab // 3]] = 0.0
    n = 100_000
    draws = race(p.expand(n, -1), keys_for(n, key=vocab))
    assert chi_square_pvalue(draws, p) > P_VALUE


@pytest.mark.skipif(bool(small_gemm.unavailable()), reason="the kernels' library does not run here")
@pytest.mark.parametrize("vocab", [5, GROUP, 3 * GROUP + 17, 49_152])
def test_the_kernels_race_draws_the_ids_the_reference_draws(vocab):
    """`kernels.draft_sampler.race` (what fp32 rows on the CPU take) against `race_in_torch`, on 300 rows of
    random masses with truncated ids, some rows a single id: the same id in every row."""
    g = torch.Generator().manual_seed(vocab)
    p = torch.rand(300, vocab, generator=g) ** 4 * (torch.rand(300, vocab, generator=g) > 0.5)
    p[:, 0] += 1e-3
    p[::50] = torch.nn.functional.one_hot(torch.randint(0, vocab, (6,), generator=g), vocab).float()
    keys = keys_for(300, key=vocab)
    assert draft_sampler.takes(p)
    assert torch.equal(race(p, keys), race_in_torch(p, keys))


def test_the_race_refuses_a_row_without_mass_naming_the_problem():
    for run in (race, race_in_torch):  # the kernel's, for fp32 rows on the CPU, and the reference
        with pytest.raises(ValueError, match="no probability mass"):
            run(torch.tensor([[0.5, 0.5], [0.0, 0.0]]), keys_for(2))
        with pytest.raises(ValueError, match="NaN"):
            run(torch.tensor([[0.5, float("nan")]]), keys_for(1))


@pytest.mark.parametrize("top_k, reduced", [(0, False), (3, True)], ids=["full", "top_k-reduced-vocab"])
def test_a_raced_draft_follows_the_q_the_draft_sampler_reports(top_k, reduced):
    """`sample_draft_token` with keys on 100,000 rows of one draft's logits (a reduced vocabulary mapped by d2t,
    top-k): the tokens ~ the q it returns (chi-square, false failure odds 1e-4)."""
    n, V = 100_000, 12
    d2t = torch.tensor([1, 4, 5, 8, 11, 2]) if reduced else None  # not sorted: the race runs over target ids
    logits = torch.randn(6 if reduced else V, generator=torch.Generator().manual_seed(1)).expand(n, -1)
    params = SamplingParams(temperature=0.8, top_k=top_k, drafter_invariant=True)
    token, q = sample_draft_token(logits, d2t, V, params, None, keys_for(n))
    assert torch.equal(q, q[:1].expand_as(q))
    assert chi_square_pvalue(token, q[0]) > P_VALUE


def random_case(seed: int, B: int, T: int, V: int, match: float):
    """Target probabilities [B, T, V] (a third of ids truncated per position), keys [B, T], and drafts [B, T-1]:
    each the target's own race with probability `match`, else a random id."""
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(B, T, V, generator=g) ** 2
    p = p * (torch.rand(B, T, V, generator=g) > 0.33)
    p[..., 0] += 0.01  # every position keeps some mass
    keys = position_keys(seed, torch.arange(B), torch.arange(T).expand(B, T))
    target = race(p.flatten(0, 1), keys.flatten()).view(B, T)
    drafts = torch.where(torch.rand(B, T - 1, generator=g) < match, target[:, :-1],
                         torch.randint(0, V, (B, T - 1), generator=g))
    return p, keys, target, drafts


@pytest.mark.parametrize("K", [0, 1, 4])
def test_a_verified_chain_emits_the_targets_race_at_every_position_whatever_the_drafts(K):
    """The theorem, token for token: emitted[j] = race(p_j, key_j) for j < num_emitted, and num_emitted - 1 is the
    number of leading drafts equal to those races (K = 0 is plain decoding)."""
    p, keys, target, drafts = random_case(K, B=400, T=K + 1, V=9, match=0.7)
    tokens, num_emitted = verify_chain(drafts, p, keys)
    leading = (drafts == target[:, :K]).long().cumprod(1).sum(1)
    assert torch.equal(num_emitted, leading + 1)
    positions = torch.arange(K + 1).expand_as(tokens)
    assert torch.equal(tokens, torch.where(positions < num_emitted.unsqueeze(1), target, -1))
    assert K == 0 or 0 < int(leading.sum()) < 400 * K  # both outcomes occurred


def test_a_verified_tree_emits_the_targets_race_down_the_branch_whose_candidate_matched():
    B, w, k, V = 400, 3, 3, 9
    p, keys, target, drafts = random_case(5, B=B, T=k + 1, V=V, match=0.7)
    g = torch.Generator().manual_seed(6)
    candidates = torch.stack([torch.randperm(V, generator=g)[:w] for _ in range(B)])  # distinct ids per row
    branch_drafts = torch.randint(0, V, (B, w, k - 1), generator=g)
    hit = candidates == target[:, :1]
    branch = torch.where(hit.any(1), hit.long().argmax(1), -1)
    branch_drafts[branch >= 0, branch[branch >= 0]] = drafts[branch >= 0, 1:]  # the matching branch's drafts
    p_nodes = p[:, 1:].unsqueeze(1).expand(B, w, k, V)  # every branch sees the same target (the theorem's p)
    tokens, num_emitted, got_branch = verify_tree(candidates, branch_drafts, p[:, 0], p_nodes, keys)
    assert torch.equal(got_branch, branch)
    leading = torch.where(branch >= 0, 1 + (drafts[:, 1:] == target[:, 1:k]).long().cumprod(1).sum(1), 0)
    assert torch.equal(num_emitted, leading + 1)
    positions = torch.arange(k + 1).expand_as(tokens)
    assert torch.equal(tokens, torch.where(positions < num_emitted.unsqueeze(1), target, -1))
    assert 0 < int((branch >= 0).sum()) < B


def test_raced_drafts_are_accepted_as_often_as_the_races_agree():
    """Drafts raced on q with the target's keys: the first is accepted exactly where race(q) = race(p), which
    happens at least (1 - TV) / (1 + TV) of the time (the Gumbel coupling's bound, less 5 sigma of the count)."""
    n, V = 20_000, 50
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(V, generator=g) * 2
    p, q = logits.softmax(-1), (logits + 0.5 * torch.randn(V, generator=g)).softmax(-1)
    keys = position_keys(9, torch.arange(n), torch.arange(2).expand(n, 2))
    drafts = race(q.expand(n, -1), keys[:, 0]).unsqueeze(1)
    tokens, num_emitted = verify_chain(drafts, p.expand(n, 2, V), keys)
    accepted = (num_emitted == 2).double().mean().item()
    tv = 0.5 * float((p - q).abs().sum())
    assert accepted == (drafts[:, 0] == race(p.expand(n, -1), keys[:, 0])).double().mean().item()
    assert accepted >= (1 - tv) / (1 + tv) - 5 * (0.25 / n) ** 0.5


def test_drafter_invariant_rollouts_need_the_embedded_backend():
    with pytest.raises(ValueError, match="drafter_invariant is the embedded engine's"):
        to_vllm_sampling(SamplingParams(seed=1, drafter_invariant=True))
    with pytest.raises(ValueError, match="rollout.drafter_invariant needs backend.backend=embedded"):
        load_config("tiny", overrides=["rollout.drafter_invariant=true", "backend.backend=vllm"])
    config = load_config("tiny", overrides=["rollout.drafter_invariant=true"])
    assert config.rollout.sampling(4, seed=1).drafter_invariant

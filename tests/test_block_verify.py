"""Block verification (`block_verify`) on its own; its closed-form exactness and its "never fewer accepted on
average" theorem are properties in `test_exactness_properties.py`, and the engine's samples are chi-square
tested in `test_engine_exactness_matrix.py`.

Chain of checks:
    sampled     `block_verify` itself, run many times, passes a chi-square test against p;
    better      on a case where a rejected first draft is made up for by the second, block verification keeps
                the block (closed form) where token verification cannot, and the sampled mean agrees;
    K = 1       the same law as token verification;
    greedy      one-hot p accepts exactly the matching prefix, then the target's argmax;
    edges       K = 0 is plain sampling; shapes that do not fit are refused by name.
"""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from specrl.speculation.block_verify import block_rule, block_verify
from specrl.speculation.verify import acceptance_probs, recovery_probs, verify

V = 5


def dist(gen: torch.Generator) -> torch.Tensor:
    logits = torch.randn(V, generator=gen) * 1.5
    logits[torch.randint(0, V, (1,), generator=gen)] = float("-inf")
    return logits.softmax(-1)


def test_monte_carlo_output_passes_chi_square_against_target(device):
    """Position-wise p and q (prefix-free), K = 3; the joint of the first three tokens completed by p.
    Seeded; a correct sampler fails with probability 1e-4."""
    gen = torch.Generator().manual_seed(1)
    k, n = 3, 60_000
    p_rows = torch.stack([dist(gen) for _ in range(k + 1)])
    q_rows = torch.stack([dist(gen) for _ in range(k)])
    drafts = torch.stack([torch.multinomial(q_rows[i], n, replacement=True, generator=gen) for i in range(k)], 1)
    on = torch.Generator(device).manual_seed(0)  # block_verify samples on `device`
    tokens, emitted = (t.cpu() for t in block_verify(drafts.to(device), q_rows.expand(n, k, V).to(device),
                                                     p_rows.expand(n, k + 1, V).to(device), generator=on))
    fill = torch.stack([torch.multinomial(p_rows[i], n, replacement=True, generator=gen) for i in range(k + 1)], 1)
    full = torch.where(tokens >= 0, tokens, fill)
    observed = torch.bincount((full[:, 0] * V + full[:, 1]) * V + full[:, 2], minlength=V ** 3).double()
    expected = (p_rows[0].double()[:, None, None] * p_rows[1].double()[None, :, None]
                * p_rows[2].double()[None, None, :]).flatten() * n
    assert observed[expected == 0].sum() == 0, "sampled a token the target gives probability 0"
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    assert chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-4
    assert int(emitted.min()) >= 1 and int(emitted.max()) <= k + 1


# Two tokens {0, 1}. q always drafts 0 first, then 0 or 1 evenly; p gives the first 0 only 0.5, then 0 for sure.
# Given the draft [0, 0], token verification keeps it with probability 0.5 (the first draft's p / q), block
# verification always (w_2 = min(1, 0.5 * 1 / 0.5) = 1); the draft [0, 1] then keeps nothing under block
# verification, so the first token is still 0 exactly half the time. E[accepted]: token 0.75, block 1.
P_ROWS = torch.tensor([[[0.5, 0.5], [1.0, 0.0], [0.5, 0.5]]], dtype=torch.float64)  # p_0, p_1 (after 0), p_2
Q_ROWS = torch.tensor([[[1.0, 0.0], [0.5, 0.5]]], dtype=torch.float64)  # q_0, q_1 (after 0)


def test_a_block_that_token_verification_splits_is_kept_whole():
    gen = torch.Generator().manual_seed(0)
    n = 8000
    drafts = torch.stack([torch.zeros(n, dtype=torch.long), torch.randint(0, 2, (n,), generator=gen)], 1)
    q, p = Q_ROWS.expand(n, 2, 2), P_ROWS.expand(n, 3, 2)
    block_tokens, block = block_verify(drafts, q, p, gen)
    _, token = verify(drafts, q, p, gen)
    h, _ = block_rule(torch.tensor([[0, 0], [0, 1]]), q[:2], p[:2])
    assert h.tolist() == [[0.0, 1.0], [0.0, 0.0]]  # (h_1, h_2) for the drafts [0, 0] and [0, 1]
    assert (block[drafts[:, 1] == 0] == 3).all() and (block[drafts[:, 1] == 1] == 1).all()
    assert abs((block - 1).double().mean().item() - 1.0) < 0.03 and abs((token - 1).double().mean().item() - 0.75) < 0.03
    assert abs((block_tokens[:, 0] == 0).double().mean().item() - 0.5) < 0.03  # still p's first token


def test_one_draft_is_token_verification():
    gen = torch.Generator().manual_seed(3)
    p_rows = torch.stack([dist(gen), dist(gen)]).double().unsqueeze(0)
    q_rows = dist(gen).double().view(1, 1, V)
    for x in range(V):
        if q_rows[0, 0, x] == 0:
            continue
        draft = torch.tensor([[x]])
        h, extra = block_rule(draft, q_rows, p_rows)
        torch.testing.assert_close(h[:, 0], acceptance_probs(draft, q_rows, p_rows)[:, 0])
        torch.testing.assert_close(extra / extra.sum(-1, keepdim=True), recovery_probs(draft, q_rows, p_rows))


def test_greedy_accepts_the_matching_prefix_then_emits_the_target_argmax():
    p = torch.nn.functional.one_hot(torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]]), V).float()
    drafts = torch.tensor([[1, 2, 0], [1, 2, 3], [0, 2, 3]])
    tokens, emitted = block_verify(drafts, None, p)
    assert tokens.tolist() == [[1, 2, 3, -1], [1, 2, 3, 4], [1, -1, -1, -1]]
    assert emitted.tolist() == [3, 4, 1]


def test_no_drafts_is_plain_sampling_and_bad_shapes_are_refused():
    p = torch.tensor([[[0.0, 1.0, 0.0, 0.0, 0.0]]])
    tokens, emitted = block_verify(torch.zeros(1, 0, dtype=torch.long), None, p)
    assert tokens.tolist() == [[1]] and emitted.tolist() == [1]
    with pytest.raises(ValueError, match="target_probs must be"):
        block_verify(torch.zeros(1, 2, dtype=torch.long), None, p)
    with pytest.raises(ValueError, match="draft_probs must be"):
        block_verify(torch.zeros(1, 0, dtype=torch.long), torch.ones(1, 1, V), p)


def test_the_verification_benchs_closed_forms_are_each_rules_mean_accepted_count():
    """`bench verification` prices each rule on a chain in closed form; the verifiers' sampled means agree."""
    from specrl.bench.verification_bench import expected_accepted_block, expected_accepted_token

    gen = torch.Generator().manual_seed(5)
    k, n = 3, 40_000
    p_rows = torch.stack([dist(gen) for _ in range(k + 1)]).unsqueeze(0)
    q_rows = torch.stack([dist(gen) for _ in range(k)]).unsqueeze(0)
    drafts = torch.stack([torch.multinomial(q_rows[0, i], 1, generator=gen) for i in range(k)], 1)  # one chain
    for closed, verifier in ((expected_accepted_token, verify), (expected_accepted_block, block_verify)):
        want = float(closed(drafts, q_rows, p_rows)[0])
        _, emitted = verifier(drafts.expand(n, k), q_rows.expand(n, k, V), p_rows.expand(n, k + 1, V), gen)
        got = (emitted - 1).double()
        assert abs(float(got.mean()) - want) < 4 * float(got.std()) / n ** 0.5 + 1e-9, (verifier.__name__, want)

"""Exact tree speculation (`speculation/tree.py`), as a theorem.

Chain of invariants:
    the output distribution of the first two tokens, computed in closed form from the verifier's own
    stage acceptance and residuals over every candidate draw (V = 5 and 6, w = 2 and 3), == p(x) p(y | x)
    to 1e-6, for sampled (without replacement) and deterministic candidates;
    a seeded Monte-Carlo run of `verify_tree` passes a chi-square test against that joint;
    at temperature 0 (p one-hot) the tree emits plain greedy decoding.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

from specrl.speculation.tree import TreeShape, first_token_stages, verify_tree, without_replacement
from specrl.speculation.verify import acceptance_probs, recovery_probs


def random_dist(generator, *shape, sharp=2.0):
    return (sharp * torch.randn(*shape, generator=generator, dtype=torch.float64)).softmax(-1)


def case(V, w, seed, zero_some=True):
    g = torch.Generator().manual_seed(seed)
    p_root = random_dist(g, V)
    p_next = random_dist(g, V, V)  # target after first token x: p_next[x]
    q_first = random_dist(g, V)
    q_second = random_dist(g, V, V)  # draft after candidate c: q_second[c]
    if zero_some:  # a token the target never emits, another the draft never proposes
        p_root[0], q_first[1] = 0.0, 0.0
        p_root, q_first = p_root / p_root.sum(), q_first / q_first.sum()
    return p_root, p_next, q_first, q_second


def ordered_draws(q, w):
    """Every ordered w-tuple of distinct tokens with its probability under drawing without replacement."""
    V = q.shape[0]
    for combo in itertools.permutations(range(V), w):
        prob, rest = 1.0, q.clone()
        for c in combo:
            if rest.sum() <= 0:
                prob = 0.0
                break
            prob *= float(rest[c] / rest.sum())
            rest[c] = 0.0
        if prob > 0:
            yield combo, prob


def closed_form_joint(p_root, p_next, q_first, q_second, w, deterministic=False):
    """P(first token x, second token y) of a tree with k = 2, from the verifier's own probabilities."""
    V = p_root.shape[0]
    joint = torch.zeros(V, V, dtype=torch.float64)
    draws = [(tuple(range(w)), 1.0)] if deterministic else list(ordered_draws(q_first, w))
    for combo, prob in draws:
        c = torch.tensor([combo])
        accept, final = first_token_stages(c, None if deterministic else q_first.unsqueeze(0), p_root.unsqueeze(0))
        reach = 1.0
        for j, token in enumerate(combo):
            a = float(accept[0, j])
            taken = reach * a
            reach *= 1 - a
            # below c_j: the branch's draft d ~ q_second[c_j], verified against p_next[c_j]
            for d in range(V):
                qd = float(q_second[token, d])
                if qd == 0:
                    continue
                draft = torch.tensor([[d]])
                acc = float(acceptance_probs(draft, q_second[token].view(1, 1, V), p_next[token].view(1, 1, V).repeat(1, 2, 1))[0, 0])
                rec = recovery_probs(draft, q_second[token].view(1, 1, V), p_next[token].view(1, 1, V).repeat(1, 2, 1))[0, 0]
                second = acc * torch.nn.functional.one_hot(torch.tensor(d), V).double() + (1 - acc) * rec
                joint[token] += prob * taken * qd * second
        # every candidate rejected: one token from the final residual; the next step samples the second from p
        joint += prob * reach * final[0].unsqueeze(1) * p_next
    return joint


@pytest.mark.parametrize("V, w, seed", [(5, 2, 0), (5, 3, 1), (6, 2, 2), (6, 3, 3)])
@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled", "deterministic"])
def test_the_first_two_tokens_follow_the_target_exactly(V, w, seed, deterministic):
    p_root, p_next, q_first, q_second = case(V, w, seed)
    joint = closed_form_joint(p_root, p_next, q_first, q_second, w, deterministic)
    exact = p_root.unsqueeze(1) * p_next
    torch.testing.assert_close(joint, exact, atol=1e-6, rtol=0)


def test_without_replacement_removes_the_drawn_token_and_renormalises():
    q = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    torch.testing.assert_close(without_replacement(q, torch.tensor([0])), torch.tensor([[0.0, 0.6, 0.4]], dtype=torch.float64))


def draw_without_replacement(q, w, generator):
    """Candidates drawn without replacement from q [B, V] by sequential sampling."""
    picks, rest = [], q.clone()
    for _ in range(w):
        c = torch.multinomial(rest, 1, generator=generator).squeeze(1)
        picks.append(c)
        rest = without_replacement(rest, c)
    return torch.stack(picks, 1)


def test_verify_tree_samples_pass_a_chi_square_against_the_exact_joint(device):
    """60000 seeded trees (V = 5, w = 2, k = 2); pooled chi-square, false failure odds 1e-4."""
    V, w, n = 5, 2, 60000
    p_root, p_next, q_first, q_second = (t.float() for t in case(V, w, 7))
    g = torch.Generator().manual_seed(11)
    cands = draw_without_replacement(q_first.expand(n, V), w, g)  # [n, w]
    q_drafts = q_second[cands].unsqueeze(2)  # [n, w, 1, V]
    drafts = torch.multinomial(q_drafts.view(-1, V), 1, generator=g).view(n, w, 1)
    p_nodes = torch.stack([p_next[cands], p_next[cands]], dim=2)  # [n, w, 2, V] (bonus row unused here)
    on = [t.to(device) for t in (cands, q_first.expand(n, V), drafts, q_drafts, p_root.expand(n, V), p_nodes)]
    tokens, emitted, branch = (t.cpu() for t in verify_tree(*on, torch.Generator(device).manual_seed(12)))
    second = torch.where(emitted >= 2, tokens[:, 1], torch.multinomial(p_next[tokens[:, 0]], 1, generator=g).squeeze(1))
    observed = torch.bincount(tokens[:, 0] * V + second, minlength=V * V).double()
    expected = (p_root.double().unsqueeze(1) * p_next.double()).flatten() * n
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    assert chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-4
    assert (branch == -1).any() and (branch == 1).any()  # every stage of the recursion was exercised


def test_at_temperature_zero_the_tree_emits_greedy_decoding():
    V = 6
    argmax_root, argmax_next = 3, torch.tensor([2, 5, 0, 1, 4, 3])
    p_root = torch.nn.functional.one_hot(torch.tensor([argmax_root]), V).float()
    one_hot_next = torch.nn.functional.one_hot(argmax_next, V).float()
    cands = torch.tensor([[1, 3]])  # the second candidate is the greedy token
    drafts = torch.tensor([[[0], [argmax_next[3].item()]]])  # and its branch's draft is right too
    p_nodes = torch.stack([one_hot_next[cands], one_hot_next[cands]], 2)
    tokens, emitted, branch = verify_tree(cands, None, drafts, None, p_root, p_nodes)
    assert branch.tolist() == [1] and tokens[0, :3].tolist() == [3, 1, 1] and emitted.tolist() == [3]
    tokens, emitted, branch = verify_tree(torch.tensor([[0, 2]]), None, drafts, None, p_root, p_nodes)
    assert branch.tolist() == [-1] and tokens[0, 0].item() == 3 and emitted.tolist() == [1]


def test_tree_shape_masks_and_paths():
    shape = TreeShape(width=2, depth=2)
    assert shape.depths.tolist() == [0, 1, 2, 1, 2]
    assert shape.ancestors[4].tolist() == [True, False, False, True, True]
    assert shape.path(torch.tensor([1, -1])).tolist() == [[0, 3, 4], [0, 1, 2]]


def test_a_candidate_of_tiny_acceptance_chance_is_not_accepted_by_a_zero_float32_uniform():
    """As `test_verify`'s: the stage uniforms are float64, so at this seed (first float32 uniform 0.0, first
    float64 uniform 2.26e-7) a candidate accepted with probability 1e-9 is rejected."""
    from test_verify import ZERO_UNIFORM_SEED

    p_root = torch.tensor([[1e-9, 1 - 1e-9]], dtype=torch.float64)
    tokens, emitted, branch = verify_tree(torch.tensor([[0]]), None, torch.zeros(1, 1, 0, dtype=torch.long), None,
                                          p_root, torch.full((1, 1, 1, 2), 0.5, dtype=torch.float64),
                                          generator=torch.Generator().manual_seed(ZERO_UNIFORM_SEED))
    assert branch.item() == -1 and tokens[0, 0].item() == 1 and emitted.item() == 1

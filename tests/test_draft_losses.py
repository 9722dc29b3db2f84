"""Distillation loss and agreement metrics, by hand, and the alignment of sampled targets."""
import math

import torch

from specrl.speculation.draft_losses import agreement, distill_loss, mean_agreement


def _logits(probs):
    return torch.tensor(probs).log().view(1, 1, -1)


def test_identical_distributions_accept_always_and_agree_on_top1():
    p = _logits([0.5, 0.3, 0.2])
    stats = mean_agreement(agreement(p, p, torch.ones(1, 1)))
    assert math.isclose(stats["acceptance"], 1.0, rel_tol=1e-6)
    assert stats["top1"] == 1.0
    entropy = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.2 * math.log(0.2))
    assert math.isclose(stats["loss"], entropy, rel_tol=1e-5)


def test_acceptance_is_the_overlap_of_p_and_q_by_hand():
    p, q = _logits([0.7, 0.2, 0.1]), _logits([0.1, 0.2, 0.7])
    stats = mean_agreement(agreement(p, q, torch.ones(1, 1)))
    assert math.isclose(stats["acceptance"], 0.1 + 0.2 + 0.1, rel_tol=1e-5)
    assert stats["top1"] == 0.0


def test_reduced_support_renormalises_p_for_the_loss_but_not_for_acceptance():
    p = _logits([0.4, 0.4, 0.2])  # target vocabulary of 3
    q = _logits([0.5, 0.5])  # draft scores target ids 0 and 1 only
    d2t = torch.tensor([0, 1])
    stats = mean_agreement(agreement(p, q, torch.ones(1, 1), d2t))
    assert math.isclose(stats["acceptance"], 0.8, rel_tol=1e-5)  # p's mass on id 2 is never accepted
    assert math.isclose(stats["loss"], math.log(2), rel_tol=1e-5)  # p~ = (0.5, 0.5)
    assert math.isclose(float(distill_loss(p, q, torch.ones(1, 1), d2t)), math.log(2), rel_tol=1e-5)


def test_masked_positions_do_not_count():
    p = torch.randn(1, 2, 5)
    q = p.clone()
    q[0, 1] = torch.randn(5)
    only_first = mean_agreement(agreement(p, q, torch.tensor([[1.0, 0.0]])))
    assert math.isclose(only_first["acceptance"], 1.0, rel_tol=1e-6)


def test_rejection_is_one_minus_acceptance_and_training_on_it_raises_acceptance():
    from specrl.speculation.draft_losses import rejection

    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 10, generator=gen), -1)
    logits = torch.randn(4, 10, generator=gen, requires_grad=True)
    before = rejection(torch.log_softmax(logits, -1), p)
    assert torch.allclose(before, 1 - torch.minimum(p, torch.softmax(logits, -1)).sum(-1))
    assert torch.allclose(rejection(p.log(), p), torch.zeros(4), atol=1e-6)  # q = p: nothing is rejected
    before.sum().backward()
    with torch.no_grad():
        after = rejection(torch.log_softmax(logits - 0.5 * logits.grad, -1), p)
    assert (after < before).all()

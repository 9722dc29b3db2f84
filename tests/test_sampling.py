"""The target's final sampling distribution: temperature, top-k, top-p, greedy."""
import pytest
import torch

from specrl.sampling import SamplingParams, sampling_distribution

LOGITS = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))


def test_temperature_one_is_the_softmax():
    probs, logprobs = sampling_distribution(LOGITS, SamplingParams(temperature=1.0))
    assert torch.allclose(probs, torch.tensor([0.5, 0.25, 0.15, 0.1]))
    assert torch.allclose(logprobs, LOGITS)


def test_top_k_keeps_the_k_most_likely_renormalised():
    probs, _ = sampling_distribution(LOGITS, SamplingParams(top_k=2))
    assert torch.allclose(probs, torch.tensor([2 / 3, 1 / 3, 0, 0]))


@pytest.mark.parametrize("top_p,kept", [(0.5, 1), (0.6, 2), (0.75, 2), (0.8, 3), (1.0, 4)])
def test_top_p_keeps_the_smallest_prefix_reaching_the_mass(top_p, kept):
    probs, _ = sampling_distribution(LOGITS, SamplingParams(top_p=top_p))
    assert int((probs > 0).sum()) == kept
    assert abs(float(probs.sum()) - 1) < 1e-6


def test_greedy_is_one_hot_with_model_logprobs():
    probs, logprobs = sampling_distribution(LOGITS, SamplingParams(temperature=0))
    assert probs.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert torch.allclose(logprobs, LOGITS)


def test_draw_follows_each_rows_law_and_never_draws_a_zero(device):
    from scipy.stats import chisquare

    from specrl.sampling import draw

    law = torch.tensor([[0.5, 0.0, 0.2, 0.3, 0.0], [0.0, 0.0, 0.0, 0.1, 0.9]])
    rows = law.repeat(20000, 1) * 3.0  # unnormalised rows are fine
    ids = draw(rows.to(device), torch.Generator(device).manual_seed(0)).cpu().view(20000, 2)
    for r in range(2):
        counts = torch.bincount(ids[:, r], minlength=5).double()
        assert counts[law[r] == 0].sum() == 0
        kept = law[r] > 0
        expected = law[r][kept].double() / law[r][kept].double().sum() * 20000
        assert chisquare(counts[kept].numpy(), expected.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("bad", [[0.0, 0.0], [float("nan"), 1.0]])
def test_draw_refuses_a_row_with_no_mass(bad):
    from specrl.sampling import draw

    with pytest.raises(ValueError, match="no probability mass"):
        draw(torch.tensor([[0.5, 0.5], bad]))

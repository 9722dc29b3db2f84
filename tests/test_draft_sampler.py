"""The draft sampler kernel (`kernels/draft_sampler.cpp`): q is softmax(logits / T), and the token is the
inverse of q's cumulative distribution at the call's uniform, as `sampling.draw`.

Chain of invariants:
    q        == PyTorch's softmax(logits / T) to 1e-6, for every temperature, with a vocabulary that is not a
                multiple of 8 (the kernel's tail) and SmolLM2's 49,152;
    token    == searchsorted(cumsum(q in float64), u * total, right) for the same uniforms u: the law of
                `sampling.draw`, so each id's chance is its entry of q;
    law      chi-square of 20,000 draws on 11 ids against q;
    support  an id with q = 0 (a -inf logit) is never drawn, at the smallest and the largest uniforms;
    input    a row of NaN or of -inf only is refused, naming the problem.
The engine's chi-square tests (tests/test_engine.py) sample the draft and int8 proposers through it at
temperature 1.
"""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from specrl.kernels import draft_sampler, small_gemm
from specrl.sampling import SamplingParams
from specrl.speculation.proposer import uses_draft_sampler

pytestmark = pytest.mark.skipif(bool(small_gemm.unavailable()), reason="the kernels' library does not run here")


@pytest.mark.parametrize("vocab", [11, 49152])
@pytest.mark.parametrize("temperature", [0.3, 1.0, 1.7])
def test_q_is_the_softmax_at_the_temperature(vocab, temperature):
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(vocab)) * 4
    _, q = draft_sampler.sample(logits, temperature, torch.Generator().manual_seed(0))
    assert torch.allclose(q, (logits / temperature).softmax(-1), atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("vocab", [11, 49152])
def test_the_token_inverts_the_cumulative_of_q_at_the_call_uniform(vocab):
    logits = torch.randn(64, vocab, generator=torch.Generator().manual_seed(1)) * 3
    token, q = draft_sampler.sample(logits, 1.0, torch.Generator().manual_seed(7))
    u = torch.rand(64, dtype=torch.float64, generator=torch.Generator().manual_seed(7))  # the same uniforms
    cdf = q.double().cumsum(-1)
    assert torch.equal(token, torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1))


def test_draws_follow_q():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 3.0, 0.2, -2.0, 1.5, 0.7]])
    rows = 20000
    token, q = draft_sampler.sample(logits.expand(rows, -1), 1.3, torch.Generator().manual_seed(3))
    counts = torch.bincount(token, minlength=11).double()
    assert chisquare(counts, q[0].double() * rows / q[0].double().sum()).pvalue > 1e-4


def test_an_id_without_mass_is_never_drawn():
    logits = torch.tensor([[float("-inf"), 1.0, float("-inf"), 0.5, float("-inf")]]).expand(4000, -1)
    token, q = draft_sampler.sample(logits, 1.0, torch.Generator().manual_seed(0))
    assert set(token.tolist()) == {1, 3} and q[0, 0] == q[0, 2] == q[0, 4] == 0
    lib = small_gemm._library()[0]
    row, q = logits[:1].contiguous(), torch.empty(1, 5)
    for u in (0.0, 1.0 - 2 ** -53):  # the smallest and the largest uniforms torch.rand gives
        uniform, picked = torch.tensor([u], dtype=torch.float64), torch.empty(1, dtype=torch.long)
        lib.specrl_sample_softmax(row.data_ptr(), 1, 5, 1.0, uniform.data_ptr(), q.data_ptr(), picked.data_ptr())
        assert picked.item() == (1 if u == 0 else 3)


@pytest.mark.parametrize("row", [[0.0] * 4 + [float("nan")] + [0.0] * 4, [0.0] * 4 + [float("inf")] + [0.0] * 4,
                                 [float("-inf")] * 9], ids=["nan", "inf", "all-minus-inf"])
def test_a_row_without_a_distribution_is_refused(row):
    with pytest.raises(ValueError, match="no probability mass"):
        draft_sampler.sample(torch.stack([torch.zeros(9), torch.tensor(row)]), 1.0)


def test_only_untruncated_sampling_at_a_temperature_goes_through_the_kernel():
    logits = torch.zeros(2, 9)
    assert uses_draft_sampler(logits, SamplingParams(temperature=0.8))
    for params in (SamplingParams(temperature=0), SamplingParams(top_k=3), SamplingParams(top_p=0.9)):
        assert not uses_draft_sampler(logits, params)
    assert not uses_draft_sampler(logits.double(), SamplingParams())


@pytest.mark.parametrize("temperature", [1e-39, 1e-300])
def test_a_temperature_whose_inverse_overflows_float32_is_refused_naming_it(temperature):
    """`SamplingParams` refuses such a temperature; called directly, the kernel marks the row bad (its sum is
    0 * inf = NaN) instead of returning id -1 as a draw."""
    logits = torch.tensor([[1.0, 2.0, 0.5]])
    with pytest.raises(ValueError, match=f"softmax\\(logits / {temperature:g}\\)"):
        draft_sampler.sample(logits, temperature, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("bad", [[0.0, 0.0, 0.0], [0.5, float("nan"), 0.5], [0.5, -0.1, 0.5], [0.5, float("inf"), 0.5]],
                         ids=["no mass", "NaN", "negative", "inf"])
def test_draw_refuses_a_row_it_cannot_draw_from(bad):
    with pytest.raises(ValueError, match="cannot draw"):
        draft_sampler.draw(torch.tensor([[0.2, 0.3, 0.5], bad]), torch.tensor([0.5, 0.5], dtype=torch.float64))


def test_draw_never_takes_an_id_without_mass_at_the_extreme_uniforms():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0]] * 2)
    for u in (0.0, 1.0 - 2 ** -53):
        assert draft_sampler.draw(probs, torch.full((2,), u, dtype=torch.float64)).tolist() == [[1, 1], [3, 3]][u > 0]

"""Acceptance model: the chain formula, the fit, and the rescaling."""
import numpy as np
import pytest

from specrl.sim.acceptance import (
    Acceptance, acceptance_length, fit_acceptance, iid_tokens_per_step, tokens_per_step, with_length,
)
from specrl.sim.published import VLLM_H100_ACCEPTANCE


def test_no_decay_reduces_to_the_iid_formula():
    alphas = np.array([0.1, 0.5, 0.8])
    assert np.allclose(tokens_per_step(alphas, 4, 1.0), iid_tokens_per_step(alphas, 4))


def test_two_drafts_with_decay_by_hand():
    # 1 + a + a * (a * d) with a = 0.8, d = 0.5
    assert tokens_per_step(np.array([0.8]), 2, 0.5)[0] == pytest.approx(1 + 0.8 + 0.8 * 0.4)


def test_zero_drafts_emit_one_token():
    assert tokens_per_step(np.array([0.9]), 0)[0] == 1.0


def test_fit_reproduces_the_published_k_sweep_within_two_percent():
    acc = fit_acceptance(VLLM_H100_ACCEPTANCE)
    for k, length in VLLM_H100_ACCEPTANCE.items():
        assert acceptance_length(acc, k) == pytest.approx(length, rel=0.02)


def test_with_length_hits_the_requested_acceptance_length():
    acc = with_length(fit_acceptance(VLLM_H100_ACCEPTANCE), 3, 2.05)
    assert acceptance_length(acc, 3) == pytest.approx(2.05, abs=1e-3)


def test_acceptance_length_grows_with_mean_and_with_k():
    lo, hi = Acceptance(0.5, 3.0, 0.95), Acceptance(0.7, 3.0, 0.95)
    assert acceptance_length(hi, 3) > acceptance_length(lo, 3)
    assert acceptance_length(hi, 5) > acceptance_length(hi, 3)


def test_bad_acceptance_fields_are_named_in_the_error():
    with pytest.raises(ValueError, match="Acceptance.mean"):
        Acceptance(1.5)

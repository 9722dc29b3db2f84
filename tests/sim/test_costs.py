"""Each cost formula against a hand calculation."""
from dataclasses import replace

import numpy as np
import pytest

from specrl.sim.costs import Layout, all_to_all_time, allreduce_time, experts_touched, forward_cost, matmul_time, stream_time
from specrl.sim.hardware import GPUS, Efficiency
from specrl.sim.models import dense_params, expert_params, get_model, kv_bytes_per_token

H100 = GPUS["h100"]


def test_experts_touched_matches_the_published_qwen3_235b_counts():
    counts = experts_touched(128, 8, [1, 4, 8, 16, 32, 64])
    assert np.allclose(np.round(counts), [8, 29, 52, 82, 112, 126], atol=1)


def test_experts_touched_is_k_for_one_token_and_saturates_at_e():
    assert experts_touched(128, 8, 1) == pytest.approx(8.0)
    assert experts_touched(128, 8, 10_000) == pytest.approx(128.0)


def test_smooth_mfu_is_half_of_max_at_n_half():
    eff = Efficiency(mfu_max=0.8, n_half=100, mbu=0.8, step_overhead_s=0, forward_overhead_s=0)
    assert eff.mfu(100) == pytest.approx(0.4)


def test_tabulated_mfu_interpolates_in_log_n_and_clamps():
    eff = Efficiency(mfu_max=0.5, n_half=0, mbu=1, step_overhead_s=0, forward_overhead_s=0,
                     mfu_table=((1, 0.1), (4, 0.3)))
    assert eff.mfu(2) == pytest.approx(0.2)
    assert eff.mfu(100) == pytest.approx(0.3)


def test_matmul_and_stream_times_divide_by_calibrated_rates():
    eff = H100.efficiency
    assert matmul_time(1e12, 1e9, H100) == pytest.approx(1e12 / (989e12 * eff.mfu(1e9)))
    assert stream_time(3.35e12, H100) == pytest.approx(1.0 / eff.mbu)


def test_allreduce_is_free_alone_and_ring_priced_in_a_group():
    assert allreduce_time(1e9, 1, H100) == 0.0
    eff = H100.efficiency
    expected = eff.collective_latency_s + 2 * 7 / 8 * 1e9 / (900e9 * eff.collective_efficiency)
    assert allreduce_time(1e9, 8, H100) == pytest.approx(expected)
    assert all_to_all_time(1e9, 8, H100) == pytest.approx(eff.collective_latency_s + 7 / 8 * 1e9 / (900e9 * eff.collective_efficiency))


def test_single_token_dense_forward_streams_weights_plus_kv():
    model = get_model("llama-3.1-8b")
    cost = forward_cost(H100, model, Layout(), 1, 1000)
    nbytes = dense_params(model) * 2 + 1000 * kv_bytes_per_token(model)
    assert float(cost.memory) == pytest.approx(nbytes / (3.35e12 * H100.efficiency.mbu))
    assert float(cost.total) == pytest.approx(max(float(cost.compute), float(cost.memory)) + H100.efficiency.forward_overhead_s)


def test_moe_forward_reads_only_touched_experts():
    model = get_model("qwen3-235b-a22b")
    layout = Layout(tp=8)
    one = forward_cost(H100, model, layout, 1, 0.0)
    many = forward_cost(H100, model, layout, 64, 0.0)
    per_expert_s = model.moe_layers * expert_params(model) * 2 / 8 / (3.35e12 * H100.efficiency.mbu)
    touched = experts_touched(128, 8, [1, 64])
    assert float(many.memory - one.memory) == pytest.approx(per_expert_s * (touched[1] - touched[0]))


def test_expert_parallel_adds_all_to_all_but_spreads_experts():
    model = get_model("qwen3-235b-a22b")
    tp = forward_cost(H100, model, Layout(tp=8), 64, 0.0)
    ep = forward_cost(H100, model, Layout(tp=8, ep=32), 64, 0.0)
    assert float(ep.memory) < float(tp.memory)
    assert float(ep.comm) > float(tp.comm)


def test_layout_rejects_ep_not_a_multiple_of_tp():
    with pytest.raises(ValueError, match="Layout.ep"):
        Layout(tp=4, ep=6)


def test_gpu_efficiency_literals_equal_their_fit():
    from specrl.sim.fit import fit_gpu_efficiency

    fitted = fit_gpu_efficiency()
    eff = H100.efficiency
    assert fitted.mfu_max == pytest.approx(eff.mfu_max, abs=0.005)
    assert fitted.n_half == pytest.approx(eff.n_half, rel=0.02)
    assert fitted.mbu == pytest.approx(eff.mbu, abs=0.005)
    assert fitted.step_overhead_s + fitted.forward_overhead_s == pytest.approx(
        eff.step_overhead_s + eff.forward_overhead_s, rel=0.02)
    assert replace(eff) == eff  # frozen dataclass, shared by every GPU
    assert all(dev.efficiency is eff for dev in GPUS.values())

"""RL step formulas and the sync / async composition."""
from dataclasses import replace

import pytest

from specrl.sim.hardware import GPUS
from specrl.sim.models import active_params, get_model
from specrl.sim.rl_loop import async_step, logprob_time, sync_step, train_time
from specrl.sim.scenarios import SCENARIOS

GB200 = GPUS["gb200"]


def test_training_time_is_six_n_active_tokens_over_cluster_flops():
    m = get_model("qwen3-8b")
    expected = 6 * active_params(m) * 1e6 / (32 * 2500e12 * 0.4)
    assert train_time(m, 1e6, GB200, 32, 0.4) == pytest.approx(expected)
    assert logprob_time(m, 1e6, GB200, 32, 0.4) == pytest.approx(expected / 3)


def test_sync_step_is_the_sum_of_its_stages():
    t = sync_step(SCENARIOS["seed-8b-sync"].setup())
    assert t.total == pytest.approx(t.generation + t.logprobs + t.training + t.weight_sync)


def test_async_overlaps_generation_and_training_only_with_staleness():
    setup = replace(SCENARIOS["seed-8b-sync"].setup(), workload=replace(SCENARIOS["seed-8b-sync"].workload, prompts=64))
    overlapped = async_step(setup, 16, max_staleness=1)
    serial = async_step(setup, 16, max_staleness=0)
    assert overlapped.total == pytest.approx(max(overlapped.generation, overlapped.logprobs + overlapped.training)
                                             + overlapped.weight_sync)
    assert serial.total == pytest.approx(serial.generation + serial.logprobs + serial.training + serial.weight_sync)


def test_streaming_async_removes_the_drain_and_is_faster():
    setup = replace(SCENARIOS["seed-8b-sync"].setup(), workload=replace(SCENARIOS["seed-8b-sync"].workload, prompts=64))
    assert async_step(setup, 16, style="stream").generation < async_step(setup, 16, style="drain").generation

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


def test_a_shared_prompt_is_trained_once_per_group():
    """4 prompts of 100 tokens x 8 responses of a fixed 50 tokens: 32 x 150 tokens per sequence, 4 x 100 + 32 x 50
    once per group; the trainer's seconds fall by the same ratio."""
    from specrl.sim.workload import LengthDistribution, Workload, trained_tokens

    w = Workload(4, 8, 100, LengthDistribution(50, 0.0, 64, 0.0))
    assert trained_tokens(w, shared_prompt=False) == pytest.approx(32 * 150)
    assert trained_tokens(w, shared_prompt=True) == pytest.approx(4 * 100 + 32 * 50)
    seed = SCENARIOS["seed-8b-sync"]
    per_sequence, shared = (sync_step(replace(seed, shared_prompt=flag).setup()) for flag in (False, True))
    ratio = trained_tokens(seed.workload, False) / trained_tokens(seed.workload, True)
    assert per_sequence.training / shared.training == pytest.approx(ratio)
    assert per_sequence.generation == pytest.approx(shared.generation)  # the rollouts do not change


def test_sharing_the_prompt_saves_more_with_longer_prompts_and_larger_groups():
    from specrl.sim.projection import shared_prompt_table

    rows = {(r["prompt_tokens"], r["group_size"]): r["trainer_speedup"]
            for r in shared_prompt_table(SCENARIOS["seed-8b-sync"])}
    assert 1.0 < rows[(256, 8)] < rows[(2048, 8)] < rows[(8192, 8)] < rows[(8192, 16)]

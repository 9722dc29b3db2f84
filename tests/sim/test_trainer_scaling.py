"""The trainer world-size scenario: FSDP past one node, and where speculation starts to pay."""
from __future__ import annotations

from specrl.sim.hardware import get_device
from specrl.sim.models import get_model
from specrl.sim.projection import trainer_scaling
from specrl.sim.rl_loop import fsdp_comm_time
from specrl.sim.scenarios import get_scenario


def test_fsdp_collectives_cost_more_past_one_node_and_nothing_on_one_rank():
    model, device = get_model("qwen3-8b"), get_device("gb200")
    assert fsdp_comm_time(model, device, 1) == 0.0
    within, across = fsdp_comm_time(model, device, 8), fsdp_comm_time(model, device, 16)
    assert 0 < within < across  # NVLink inside the node, the network past it


def test_speculation_pays_once_training_no_longer_bounds_the_step():
    rows = trainer_scaling(get_scenario("seed-8b-sync"), [1, 8, 32, 64])
    training = [r["training_s"] for r in rows]
    assert training == sorted(training, reverse=True)  # more trainer GPUs, less training time
    first, last = rows[0], rows[-1]
    assert first["bound_by"] == "training" and first["step_speedup"] == 1.0  # faster rollouts hide behind training
    assert last["bound_by"] == "generation"
    assert last["step_speedup"] > 1.3  # then the step is the rollout, and speculation shortens it
    assert last["step_speedup"] <= round(last["generation_off_s"] / last["generation_on_s"], 4) + 1e-4

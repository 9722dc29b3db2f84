"""The async GRPO pipeline on Ray (real actors), on the tiny model.

Chain of invariants:
    max_staleness 0              == the sync loop: same rewards and losses, step for step;
    every trained group          staleness (s - 1) - version <= max_staleness, for every token;
    a rollout actor killed       is replaced, its requests re-issued; every group is consumed
                                 once, dropped, or still accounted for (buffered / in flight);
    the truncated IS weight      min(exp(x - b), cap), by hand; no lag == the plain GRPO loss;
    configs                      fail at load, naming the field.
One local Ray instance (2 CPUs: the trainer in this process, actors of 1 thread) serves the module.
"""
from __future__ import annotations

import json
import logging
import math
import subprocess
import sys

import pytest
import ray
import torch

from specrl.pipeline.asynchronous import AsyncTrainer
from specrl.pipeline.buffer import StalenessBuffer
from specrl.pipeline.config import load_config
from specrl.pipeline.groups import Group
from specrl.pipeline.sync import SyncTrainer
from specrl.rl.grpo import GRPOConfig, grpo_loss

# fixed K: adaptive K reads wall-clock time, which would make the sampled tokens vary from run to run
SMALL = ["rollout.prompts_per_step=4", "grpo.group_size=4", "rollout.max_tokens=12", "run.tensorboard=false",
         "optim.lr=1e-3", "optim.micro_batch_size=8", "backend.adaptive=false", "backend.proposer=ngram",
         "run.checkpoint_every=0"]


def small_config(run_dir, *extra):
    return load_config("tiny", overrides=SMALL + [f"run.run_dir={run_dir}"] + list(extra))


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield
    ray.shutdown()


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the actors run at 1 thread; matmul reductions must match theirs bit for bit
    yield
    torch.set_num_threads(threads)


def assert_within_bound(trainer: AsyncTrainer, bound: int) -> None:
    """Every trained group, and every token in it, is at most `bound` versions behind its step's trainer."""
    assert len(trainer.buffer.consumed) == trainer.config.run.steps * trainer.P
    for used in trainer.buffer.consumed:
        assert 0 <= used.staleness <= bound, used
    for record in trainer.history:
        assert all(int(age) <= bound for age in record["staleness_histogram"])


def test_max_staleness_zero_is_the_sync_loop_step_for_step(tmp_path, local_ray, one_thread):
    # requests of one whole step (prompts_per_request = P) with the step's seed, generated on exactly
    # the weights the sync loop would sync: the same samples, rewards and losses
    steps = ["run.steps=3"]
    sync = SyncTrainer(small_config(tmp_path / "sync", *steps))
    sync.run()
    run = AsyncTrainer(small_config(tmp_path / "async", *steps, "pipeline.mode=async", "pipeline.max_staleness=0"))
    summary = run.run()
    assert [r["reward_mean"] for r in run.history] == [r["reward_mean"] for r in sync.history]
    assert [r["train"]["loss"] for r in run.history] == [r["train"]["loss"] for r in sync.history]
    assert [r["rollout_tokens"] for r in run.history] == [r["rollout_tokens"] for r in sync.history]
    assert summary["max_staleness_seen"] == 0 and summary["dropped"] == 0
    assert all(u.version == u.step - 1 for u in run.buffer.consumed)
    assert "is_weight" not in run.history[-1]["train"]  # no lag: the plain GRPO path


def test_staleness_never_exceeds_the_bound_with_two_actors(tmp_path, local_ray):
    config = small_config(tmp_path, "run.steps=4", "pipeline.mode=async", "pipeline.max_staleness=1",
                          "pipeline.num_actors=2", "pipeline.prompts_per_request=2")
    trainer = AsyncTrainer(config)
    summary = trainer.run()
    assert_within_bound(trainer, 1)
    # The first window (2 steps of groups) is requested at version 0, but an actor that starts a
    # request after the trainer published version 1 generates it with version 1: how many groups
    # arrive stale is a race between actors and trainer, so only the bound is asserted, and every
    # trained group is accounted to a staleness in 0..1.
    assert sum(summary["staleness_histogram"].values()) == len(trainer.buffer.consumed)
    assert set(summary["staleness_histogram"]) <= {"0", "1"}, summary["staleness_histogram"]
    stale_steps = [r for r in trainer.history if r["staleness_histogram"].get("1")]
    assert all(0 < r["train"]["is_weight"] for r in stale_steps)
    with open(tmp_path / "metrics.jsonl") as f:
        record = json.loads(f.readline())
    assert {"pipeline_fill", "training", "weight_sync"} <= set(record["timing"])
    assert {"generation", "weight_load", "reward"} <= set(record["actors"])


def test_a_killed_rollout_actor_is_replaced_and_no_group_is_lost_or_used_twice(tmp_path, local_ray):
    config = small_config(tmp_path, "run.steps=5", "pipeline.mode=async", "pipeline.max_staleness=1")
    trainer = AsyncTrainer(config)
    killed = {}

    def kill_after_step_2(step, total, record):
        if step == 2:
            killed["in_flight"] = trainer.pool.in_flight_groups()  # step 4's request was just sent
            ray.kill(trainer.pool.actors[0], no_restart=True)

    summary = trainer.run(progress=kill_after_step_2)
    assert killed["in_flight"] > 0, "nothing was in flight when the actor was killed"
    assert summary["actor_restarts"] == 1 and summary["requests_reissued"] >= 1
    assert_within_bound(trainer, 1)
    ledger = summary["groups"]
    assert ledger["duplicates"] == 0
    assert ledger["consumed"] + ledger["dropped"] + ledger["buffered"] + ledger["in_flight"] + \
        ledger["awaiting_reissue"] == ledger["issued"]
    consumed = [u.index for u in trainer.buffer.consumed]
    assert len(consumed) == len(set(consumed)) == 5 * trainer.P
    assert not set(consumed) & set(trainer.buffer.dropped)
    # every group up to the last one trained on was either trained on or dropped for staleness
    assert set(range(max(consumed) + 1)) <= set(consumed) | set(trainer.buffer.dropped)


def make_group(index: int, version: int) -> Group:
    return Group(index=index, prompt_ids=[1], completions=[], rewards=[], issued_version=version)


def test_buffer_drops_groups_past_the_bound_and_hands_out_the_oldest_first():
    buffer = StalenessBuffer(max_staleness=1)
    buffer.put([make_group(0, 1), make_group(1, 2), make_group(2, 3), make_group(3, 2)])
    assert buffer.take(4, trainer_version=3) is None  # the version-1 group is 2 behind: dropped; 3 remain
    assert buffer.dropped == [0] and len(buffer) == 3
    batch = buffer.take(2, trainer_version=3)
    assert [g.index for g in batch] == [1, 3]
    assert [u.staleness for u in buffer.consumed] == [1, 1]
    buffer.put([make_group(1, 3)])  # a re-issued request whose first answer also arrived
    assert buffer.duplicates == 1 and len(buffer) == 1


def test_max_staleness_zero_buffer_accepts_only_the_current_version():
    buffer = StalenessBuffer(max_staleness=0)
    buffer.put([make_group(0, 4), make_group(1, 5)])
    assert [g.index for g in buffer.take(1, trainer_version=5)] == [1]
    assert buffer.dropped == [0]


def test_truncated_is_weight_on_hand_cases():
    # one response of three tokens, advantage 2; b = behaviour, x = proximal (the current weights)
    b = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.9)]])
    x = torch.tensor([[math.log(0.6), math.log(0.8), math.log(0.45)]])
    mask = torch.ones(1, 3)
    config = GRPOConfig(group_size=2, is_cap=2.0)
    current = x.clone().requires_grad_(True)
    loss, stats = grpo_loss(current, b, torch.tensor([2.0]), mask, config, proximal_logprobs=x)
    weights = [0.6 / 0.5, min(0.8 / 0.2, 2.0), 0.45 / 0.9]  # [1.2, 4 -> 2 (truncated), 0.5]
    assert loss.item() == pytest.approx(-2.0 * sum(weights) / 3, rel=1e-6)
    assert stats["is_weight"] == pytest.approx(sum(weights) / 3, rel=1e-6)
    assert stats["is_truncated_fraction"] == pytest.approx(1 / 3)
    loss.backward()  # rho = exp(l - x) == 1: the gradient is -w * A / N per token
    assert torch.allclose(current.grad, torch.tensor([[-2.0 * w / 3 for w in weights]]), atol=1e-6)


def test_without_lag_the_decoupled_loss_equals_the_plain_grpo_loss():
    torch.manual_seed(0)
    b = torch.randn(2, 4).log_softmax(-1)
    l1 = (b + 0.1 * torch.randn(2, 4)).requires_grad_(True)
    l2 = l1.detach().clone().requires_grad_(True)
    adv, mask, config = torch.tensor([1.0, -0.5]), torch.ones(2, 4), GRPOConfig(group_size=2)
    plain, _ = grpo_loss(l1, b, adv, mask, config)
    decoupled, stats = grpo_loss(l2, b, adv, mask, config, proximal_logprobs=b)  # proximal == behaviour
    plain.backward()
    decoupled.backward()
    assert stats["is_weight"] == pytest.approx(1.0)
    assert torch.allclose(plain, decoupled) and torch.allclose(l1.grad, l2.grad)


@pytest.mark.parametrize("override, message", [
    ("pipeline.mode=fast", "pipeline.mode must be one of"),
    ("pipeline.max_staleness=-1", "pipeline.max_staleness must be >= 0"),
    ("pipeline.num_actors=0", "pipeline.num_actors must be >= 1"),
    ("pipeline.prompts_per_request=3", r"pipeline.prompts_per_request \(3\) must divide"),
    ("pipeline.buffer_size=100", r"pipeline.buffer_size \(100\) must be between"),
    ("grpo.is_cap=0.5", "grpo.is_cap must be >= 1"),
])
def test_bad_pipeline_values_are_named(override, message):
    with pytest.raises(ValueError, match=message):
        load_config("tiny", overrides=["rollout.prompts_per_step=4", override])


def test_resuming_an_async_run_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="--resume is supported for pipeline.mode=sync only"):
        AsyncTrainer(small_config(tmp_path, "pipeline.mode=async"), resume=True)


@pytest.mark.slow
def test_cli_async_run_ends_with_one_json_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "specrl.cli", "train", "--preset", "tiny", "--pipeline", "async",
                          *SMALL, "run.steps=2", f"run.run_dir={tmp_path}", "run.threads=1"],
                         check=True, capture_output=True, text=True)
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["pipeline"] == "async" and summary["steps_run"] == 2
    assert {"max_staleness_seen", "dropped", "timing", "exposed_generation_s", "weight_sync_bubble_s"} <= set(summary)

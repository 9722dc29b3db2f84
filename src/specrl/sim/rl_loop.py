"""The RL step: synchronous and asynchronous GRPO, priced stage by stage.

    sync  (one pool, colocated):  weight sync + generation + logprobs + training
    async (two pools):            max(generation on the rollout pool,
                                      logprobs + training on the trainer pool)
                                  + weight broadcast (trainer pool -> rollout pool)

Async generation comes in two styles: "drain" (each step's batch is generated
to its last sequence, like sync, only overlapped with training) and "stream"
(rollout replicas stay full across steps, AReaL-style interruptible rollouts:
the long tail of one step overlaps the next step's requests).

With max_staleness >= 1 the rollout pool generates step i+1 with weights one
version old while the trainer trains step i, so the two overlap fully in steady
state; max_staleness = 0 on split pools runs them one after the other.

Training FLOPs are 6 * N_active * tokens (forward + backward), logprobs 2 * N_active
* tokens (a forward); both at `train_mfu` of peak. The tokens count each prompt once per
sequence, as the seed's trainer does, or once per group with `shared_prompt` (specrl's
packed trainer; `workload.trained_tokens`). Ignores: optimizer time, the
reward/verifier time, pipeline bubbles, and data-loader stalls.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from specrl.sim.acceptance import Acceptance
from specrl.sim.costs import Layout
from specrl.sim.hardware import Device
from specrl.sim.iteration import Engine
from specrl.sim.models import ModelSpec, active_params, total_params
from specrl.sim.rollout import RolloutResult, simulate_rollout, steady_state_rollout
from specrl.sim.workload import Workload, trained_tokens


def train_time(model: ModelSpec, tokens: float, device: Device, gpus: int, mfu: float) -> float:
    """Seconds for one optimizer step's forward + backward: 6 * N_active * tokens / (gpus * peak * mfu)."""
    return 6.0 * active_params(model) * tokens / (gpus * device.peak_flops * mfu)


def logprob_time(model: ModelSpec, tokens: float, device: Device, gpus: int, mfu: float) -> float:
    """Seconds to recompute logprobs (one forward): 2 * N_active * tokens / (gpus * peak * mfu)."""
    return 2.0 * active_params(model) * tokens / (gpus * device.peak_flops * mfu)


def weight_transfer_time(model: ModelSpec, device: Device, replica_devices: int, colocated: bool) -> float:
    """Seconds to refresh the rollout weights: each rollout device receives its 1/replica_devices shard.

    colocated: the shard comes over NVLink from training shards on the same node; otherwise it is
    broadcast over the scale-out network (all receivers in parallel). Ignores tree-broadcast depth.
    """
    shard = total_params(model) * device.bytes_per_param / replica_devices
    bw = device.link_bw if colocated else device.net_bw
    if bw <= 0:
        return 0.0
    return shard / (bw * device.efficiency.collective_efficiency) + device.efficiency.collective_latency_s


def fsdp_comm_time(model: ModelSpec, device: Device, ranks: int, gpus_per_node: int = 8) -> float:
    """Seconds of FSDP collectives per optimizer step on `ranks` trainer devices, none of it hidden
    behind compute (an upper bound): parameters all-gathered for the forward and again for the
    backward, gradients reduce-scattered, each a ring moving (ranks - 1) / ranks of the model's
    bytes through every device; over NVLink within a node, over the network past one."""
    if ranks <= 1:
        return 0.0
    moved = 3 * total_params(model) * device.bytes_per_param * (ranks - 1) / ranks
    bw = device.link_bw if ranks <= gpus_per_node else device.net_bw
    return moved / (bw * device.efficiency.collective_efficiency) + 3 * device.efficiency.collective_latency_s


@dataclass(frozen=True)
class RLSetup:
    """Everything one RL-step projection needs.

    device, gpus: cluster (identical devices).
    model, layout: target and its rollout replica layout.
    drafter_name: catalogue drafter (None = no speculation).
    workload: prompts x samples and lengths.
    acceptance: acceptance model of the drafter on this workload.
    policy: speculation policy (FixedK / AdaptiveK); K=0 policies turn speculation off.
    train_mfu: training (and logprob) MFU.
    max_seqs: live sequences per rollout replica.
    shared_prompt: the trainer computes each prompt once per group (see the module docstring).
    """

    device: Device
    gpus: int
    model: ModelSpec
    layout: Layout
    workload: Workload
    acceptance: Acceptance | None
    policy: object
    drafter: object = None
    train_mfu: float = 0.35
    max_seqs: int = 256
    seed: int = 0
    shared_prompt: bool = False


@dataclass
class StepTimes:
    """Seconds per stage of one RL step; `total` is the step's wall time."""

    generation: float
    logprobs: float
    training: float
    weight_sync: float
    total: float
    rollout: RolloutResult


def _tokens(setup: RLSetup) -> float:
    return trained_tokens(setup.workload, setup.shared_prompt)


def sync_step(setup: RLSetup) -> StepTimes:
    """Synchronous step on one colocated pool of `setup.gpus` devices."""
    replicas = setup.gpus // setup.layout.devices
    engine = Engine(setup.device, setup.model, setup.layout, setup.drafter)
    rollout = simulate_rollout(engine, setup.workload, replicas, setup.acceptance, setup.policy, setup.max_seqs, setup.seed)
    tokens = _tokens(setup)
    lp = logprob_time(setup.model, tokens, setup.device, setup.gpus, setup.train_mfu)
    tr = train_time(setup.model, tokens, setup.device, setup.gpus, setup.train_mfu)
    ws = weight_transfer_time(setup.model, setup.device, setup.layout.devices, colocated=True)
    return StepTimes(rollout.time_s, lp, tr, ws, rollout.time_s + lp + tr + ws, rollout)


def async_step(setup: RLSetup, rollout_gpus: int, max_staleness: int = 1, style: str = "drain") -> StepTimes:
    """Asynchronous step: `rollout_gpus` generate, the rest train; overlap needs max_staleness >= 1.

    style: "drain" or "stream" (see the module docstring); "stream" needs max_staleness >= 1.
    """
    trainer_gpus = setup.gpus - rollout_gpus
    if rollout_gpus < setup.layout.devices or trainer_gpus <= 0:
        raise ValueError(f"async split needs >= {setup.layout.devices} rollout GPUs and >= 1 trainer GPU")
    if style == "stream" and max_staleness >= 1:
        engine = Engine(setup.device, setup.model, setup.layout, setup.drafter)
        replicas = rollout_gpus // setup.layout.devices
        roll = steady_state_rollout(engine, setup.workload, replicas, setup.acceptance, setup.policy, setup.max_seqs)
        gen = StepTimes(roll.time_s, 0.0, 0.0, 0.0, roll.time_s, roll)
    elif style in ("drain", "stream"):
        gen = sync_step(replace(setup, gpus=rollout_gpus))
    else:
        raise ValueError(f"async style must be 'drain' or 'stream', got {style!r}")
    tokens = _tokens(setup)
    lp = logprob_time(setup.model, tokens, setup.device, trainer_gpus, setup.train_mfu)
    tr = train_time(setup.model, tokens, setup.device, trainer_gpus, setup.train_mfu)
    ws = weight_transfer_time(setup.model, setup.device, setup.layout.devices, colocated=False)
    busy = max(gen.generation, lp + tr) if max_staleness >= 1 else gen.generation + lp + tr
    return StepTimes(gen.generation, lp, tr, ws, busy + ws, gen.rollout)


def best_async_step(
    setup: RLSetup, max_staleness: int = 1, style: str = "drain", fractions=(0.5, 0.625, 0.75, 0.8125, 0.875, 0.9375),
) -> tuple[StepTimes, int]:
    """The async split (rollout share of GPUs among `fractions`) with the shortest step."""
    unit = setup.layout.devices
    best = None
    for f in fractions:
        rollout_gpus = max(unit, int(setup.gpus * f) // unit * unit)
        if rollout_gpus >= setup.gpus:
            continue
        times = async_step(setup, rollout_gpus, max_staleness, style)
        if best is None or times.total < best[0].total:
            best = (times, rollout_gpus)
    if best is None:
        raise ValueError(f"no async split of {setup.gpus} GPUs into replicas of {unit}")
    return best

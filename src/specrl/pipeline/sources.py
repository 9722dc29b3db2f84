"""Where a run's rollouts come from: one worker in the trainer's process, or Ray actors.

The pipeline (`specrl.pipeline.loop`) is one loop over a `RolloutSource`. It sends
`RolloutRequest`s when the source has room and the staleness window admits them,
collects `RolloutResult`s (scored groups) into its buffer, trains, and publishes each new
version to the source. The two sources:

| source | pipeline.mode | where requests run | when | weights |
|---|---|---|---|---|
| `LocalSource` | sync | a `RolloutWorker` in this process | inside `collect`, on the trainer's clock | handed to its backend at `publish` |
| `ActorSource` | async | `RolloutActor`s on Ray (`RolloutPool`) | alongside the trainer | one `ray.put` posted to the `WeightBoard`; offered in flight with `weight_updates=step` |

A local source runs one request at a time, and only when collected: with the window
of one step (staleness 0) the loop is generate -> train -> sync, one step after another.
"""
from __future__ import annotations

from typing import Protocol

import ray
import torch

from specrl.backends import ModelSet
from specrl.pipeline.actors import RolloutActor, RolloutPool, RolloutRequest, RolloutResult, RolloutWorker
from specrl.pipeline.config import TrainConfig
from specrl.pipeline.ray_session import RaySession
from specrl.pipeline.weights import VersionedWeights, WeightBoardActor, publish
from specrl.telemetry.timers import StageTimer


class RolloutSource(Protocol):
    """What the pipeline asks of a source of scored rollouts."""

    in_process: bool  # requests run on the trainer's clock (inside `collect`)
    abandoned: int  # groups of requests still pending when the source was closed

    def wait_ready(self, timer: StageTimer) -> None: ...  # every worker has built its backend (a wait is timed)

    def free_slot(self) -> int | None: ...  # a worker that can take one more request

    def submit(self, slot: int, request: RolloutRequest) -> None: ...

    def collect(self, timeout: float | None) -> tuple[list[RolloutResult], list[RolloutRequest]]: ...
    # (finished results, requests that failed and must be re-issued); blocks up to `timeout` (None: until one)

    def pending(self) -> list[RolloutRequest]: ...  # sent and not yet answered

    def before_training(self) -> None: ...  # the trainer is about to step (a colocated engine may sleep)

    def publish(self, version: int, policy: dict[str, torch.Tensor], draft: dict[str, torch.Tensor] | None) -> None: ...

    def evaluate(self, seed: int) -> tuple[dict, list]: ...  # `RolloutWorker.evaluate` on the newest weights

    def proposer_states(self) -> list[dict]: ...  # each worker's proposer memory, for checkpoints

    def summary(self) -> dict: ...

    def close(self) -> None: ...


class LocalSource:
    """One `RolloutWorker` in the trainer's process; a request runs when it is collected."""

    in_process = True

    def __init__(self, config: TrainConfig, models: ModelSet, version: int, proposer_state: dict):
        self.worker = RolloutWorker(config, models, None, None, version, proposer_state)
        self.backend = self.worker.backend
        # colocated vLLM on a GPU: the engine sleeps while the trainer steps (vllm.sleep_mode)
        self.sleeps = config.backend.backend == "vllm" and config.vllm.sleep_mode
        self.requests: list[RolloutRequest] = []
        self.abandoned = 0

    def wait_ready(self, timer: StageTimer) -> None:
        pass  # the worker was built with the source

    def free_slot(self) -> int | None:
        return None if self.requests else 0

    def submit(self, slot: int, request: RolloutRequest) -> None:
        self.requests.append(request)

    def collect(self, timeout: float | None) -> tuple[list[RolloutResult], list[RolloutRequest]]:
        if not self.requests and timeout is None:
            raise RuntimeError("the local rollout source was asked to wait with no request sent")
        requests, self.requests = self.requests, []
        return [self.worker.generate(request) for request in requests], []

    def pending(self) -> list[RolloutRequest]:
        return list(self.requests)

    def before_training(self) -> None:
        if self.sleeps:
            self.backend.sleep()

    def publish(self, version: int, policy: dict[str, torch.Tensor], draft: dict[str, torch.Tensor] | None) -> None:
        if self.sleeps:
            self.backend.wake_up()
        self.backend.sync_weights(policy, version=version, draft=draft)

    def evaluate(self, seed: int) -> tuple[dict, list]:
        return self.worker.evaluate(seed)

    def proposer_states(self) -> list[dict]:
        return [self.worker.proposer_state()]

    def summary(self) -> dict:
        return {"actors": 0}

    def close(self) -> None:
        self.abandoned += sum(request.count for request in self.requests)
        self.requests.clear()


class ActorSource:
    """`pipeline.num_actors` Ray rollout actors (a `RolloutPool`) and the weight board they read."""

    in_process = False

    def __init__(self, config: TrainConfig, models: ModelSet, version: int, proposer_states: list[dict]):
        spec = config.pipeline
        self.in_flight_updates = spec.weight_updates == "step"
        self.ray = RaySession(spec.ray_address)
        # the starting weights, which every actor loads itself, are version 0 or the checkpoint's
        self.board = WeightBoardActor.remote(VersionedWeights(version))
        make_actor = RolloutActor.options(num_cpus=spec.actor_threads).remote
        self.pool = RolloutPool(lambda slot: make_actor(config, models, spec.actor_threads, self.board, version,
                                                        proposer_states[slot % len(proposer_states)]),
                                spec.num_actors, spec.requests_per_actor)

    @property
    def abandoned(self) -> int:
        return self.pool.abandoned

    def wait_ready(self, timer: StageTimer) -> None:
        with timer.stage("actor_startup"):
            self.pool.wait_ready()

    def free_slot(self) -> int | None:
        return self.pool.free_slot()

    def submit(self, slot: int, request: RolloutRequest) -> None:
        self.pool.submit(slot, request)

    def collect(self, timeout: float | None) -> tuple[list[RolloutResult], list[RolloutRequest]]:
        return self.pool.collect(timeout)

    def pending(self) -> list[RolloutRequest]:
        return [request for _, _, request in self.pool.in_flight.values()]

    def before_training(self) -> None:
        pass

    def publish(self, version: int, policy: dict[str, torch.Tensor], draft: dict[str, torch.Tensor] | None) -> None:
        weights = publish(version, policy, draft)
        ray.get(self.board.post.remote(weights))
        if self.in_flight_updates:
            self.pool.offer(weights)

    def evaluate(self, seed: int) -> tuple[dict, list]:
        return self.pool.evaluate(seed)

    def proposer_states(self) -> list[dict]:
        return self.pool.proposer_states()

    def summary(self) -> dict:
        return {"actors": len(self.pool.actors), "actor_restarts": sum(self.pool.restarts)}

    def close(self) -> None:
        self.pool.shutdown()
        self.ray.close()


def make_source(config: TrainConfig, models: ModelSet, version: int, proposer_states: list[dict]) -> RolloutSource:
    """The source `pipeline.mode` names, its workers starting from `models` at `version`."""
    if config.pipeline.mode == "sync":
        return LocalSource(config, models, version, proposer_states[0])
    return ActorSource(config, models, version, proposer_states)

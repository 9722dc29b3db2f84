"""Rollout actors on Ray, and the pool that keeps them fed and restarts the ones that die.

A `RolloutWorker` (run as a Ray actor) owns one backend built by `make_backend`
(the embedded engine by default) and the task. One call, `generate(request, weights)`:
adopt the newest weights it was handed (between requests: a request runs start to
finish on one version, and every token carries it), render the request's prompts,
sample G responses per prompt, score them, and return the scored groups. Requests are
deterministic: a request's sampling seed is a function of (run.seed, request number),
so a request re-issued on the same weights version returns the same samples.

`RolloutPool` holds `num_actors` actors and the requests in flight on each (at most
`requests_per_actor`; Ray queues them on the actor in order). When an actor dies,
every request it held comes back as failed; the pool replaces the actor once and
hands the failed requests back to the caller, which re-issues them (to any actor,
with the newest weights). Nothing is lost: a request leaves `in_flight` only as a
result or as a failure handed back.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field

import ray
import torch
from ray.exceptions import RayActorError

from specrl.backends import make_backend
from specrl.pipeline.config import TrainConfig
from specrl.pipeline.groups import Group, score_groups
from specrl.pipeline.weights import VersionedWeights, adopt
from specrl.tasks import make_task, render_prompts
from specrl.telemetry.spec_stats import SpecStats

MAX_RESTARTS_PER_ACTOR = 3  # an actor that keeps dying (bad config, out of memory) stops the run instead


@dataclass(frozen=True)
class RolloutRequest:
    """Prompts task[first : first + count], sampled with `seed`."""

    number: int  # request number: first // prompts_per_request
    first: int
    count: int
    seed: int


@dataclass
class RolloutResult:
    request: RolloutRequest
    groups: list[Group]
    spec: SpecStats
    k_histogram: dict[int, int]
    num_tokens: int
    seconds: dict[str, float] = field(default_factory=dict)  # actor-side stages: weight_load, generation, reward


class RolloutWorker:
    """One rollout actor's state: a backend, the task and its sampling settings."""

    def __init__(self, config: TrainConfig, policy_dir: str, draft_dir: str | None, threads: int):
        sys.stdout = sys.stderr  # the driver's stdout ends with its one JSON line; Ray forwards ours there
        torch.set_num_threads(threads)
        self.config = config
        self.backend = make_backend(dataclasses.replace(config.backend, model=policy_dir, draft=draft_dir))
        self.task = make_task(config.task)

    def generate(self, request: RolloutRequest, weights: VersionedWeights) -> RolloutResult:
        cfg = self.config
        load_seconds = adopt(self.backend, weights)
        tokenizer = self.backend.tokenizer
        problems, prompts = render_prompts(self.task, tokenizer, request.first, request.count)
        params = cfg.rollout.sampling(cfg.grpo.group_size, seed=request.seed)
        version = self.backend.version
        result = self.backend.generate(prompts, params)
        start = time.perf_counter()
        groups = score_groups(self.task, request.first, problems, result.completions, version)
        return RolloutResult(request, groups, result.spec, result.k_histogram, result.num_tokens,
                             {"weight_load": load_seconds, "generation": result.seconds,
                              "reward": time.perf_counter() - start})

    def version(self) -> int:
        return self.backend.version


RolloutActor = ray.remote(RolloutWorker)


class RolloutPool:
    """`num_actors` rollout actors and the requests in flight on each."""

    def __init__(self, make_actor, num_actors: int, requests_per_actor: int):
        self.make_actor = make_actor  # () -> a new actor handle
        self.actors = [make_actor() for _ in range(num_actors)]
        self.requests_per_actor = requests_per_actor
        self.in_flight: dict[ray.ObjectRef, tuple[int, object, RolloutRequest]] = {}  # ref -> (slot, actor, request)
        self.restarts = [0] * num_actors

    def wait_ready(self) -> list[int]:
        """Block until every actor has built its backend; returns their weight versions."""
        return ray.get([actor.version.remote() for actor in self.actors])

    def in_flight_groups(self) -> int:
        return sum(request.count for _, _, request in self.in_flight.values())

    def free_slot(self) -> int | None:
        """The actor slot with the fewest requests in flight, if it can take one more."""
        load = [0] * len(self.actors)
        for slot, _, _ in self.in_flight.values():
            load[slot] += 1
        slot = min(range(len(self.actors)), key=load.__getitem__)
        return slot if load[slot] < self.requests_per_actor else None

    def submit(self, slot: int, request: RolloutRequest, weights: VersionedWeights) -> None:
        actor = self.actors[slot]
        self.in_flight[actor.generate.remote(request, weights)] = (slot, actor, request)

    def collect(self, timeout: float | None) -> tuple[list[RolloutResult], list[RolloutRequest]]:
        """Finished requests: (results, failed requests of actors that died). Blocks up to `timeout`
        seconds (None = until one finishes) when none has finished yet."""
        if not self.in_flight:
            return [], []
        ready, _ = ray.wait(list(self.in_flight), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(list(self.in_flight), num_returns=len(self.in_flight), timeout=0)
        results, failed = [], []
        for ref in ready:
            slot, actor, request = self.in_flight.pop(ref)
            try:
                results.append(ray.get(ref))
            except RayActorError:
                failed.append(request)
                self._replace(slot, actor)
        return results, failed

    def _replace(self, slot: int, dead) -> None:
        """Start a new actor in `slot`, once per death (all the dead actor's requests fail together)."""
        if self.actors[slot] is not dead:
            return
        self.restarts[slot] += 1
        if self.restarts[slot] > MAX_RESTARTS_PER_ACTOR:
            raise RuntimeError(f"rollout actor {slot} died {self.restarts[slot]} times; giving up")
        self.actors[slot] = self.make_actor()

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.in_flight.clear()

"""Rollout workers, the Ray actors that run them, and the pool that keeps them fed.

A `RolloutWorker` owns one backend built by `make_backend` (the embedded engine by
default) and the task. It runs in the trainer's process (the sync pipeline's
`LocalSource`) or as a Ray actor (`RolloutActor`, the async pipeline's `ActorSource`;
see `specrl.pipeline.sources`). One call, `generate(request)`: adopt the newest weights
on the `WeightBoard` (actors; an in-process worker is handed them), render the
request's prompts, sample G responses per prompt, score them, and return the scored
groups. Every token carries the version that sampled it. With
`pipeline.weight_updates=request` a request runs start to finish on one version, and
requests are deterministic: a request's sampling seed is a function of (run.seed,
request number), so a request re-issued on the same weights version returns the same
samples. With `step`, the trainer also `offer`s each new version to the actors (served
on the "state" concurrency group, so it lands while a request runs), and the engine
adopts it between two steps of the running request (in-flight updates; which step is a
race, so samples are no longer a function of the seed alone). After each request the
worker keeps a snapshot of its proposer's memory (`proposer_state`, also on the "state"
group, so a checkpoint does not wait behind queued requests). `evaluate(seed)` scores
the held-out set on the newest weights, queued behind the worker's requests.

`RolloutPool` holds `num_actors` actors and the requests in flight on each (at most
`requests_per_actor`; Ray queues them on the actor in order). When an actor dies,
every request it held comes back as failed; the pool replaces the actor once and
hands the failed requests back to the caller, which re-issues them (to any actor,
with the newest weights). An actor that is only unreachable for a moment
(`ActorUnavailableError`) is kept: its failed requests are re-issued and it is not
counted as a death. Nothing is lost: a request leaves `in_flight` only as a result or
as a failure handed back.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import ray
import torch
from ray.exceptions import ActorUnavailableError, RayActorError

from specrl.backends import ModelSet, make_backend
from specrl.pipeline.config import TrainConfig
from specrl.pipeline.evaluation import evaluate
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
    # actor-side stages: weight_load (in flight too, with the cache recomputes it causes), generation, reward
    seconds: dict[str, float] = field(default_factory=dict)
    weight_updates: int = 0  # versions adopted in flight, during this request
    trace: list = field(default_factory=list)  # the batch's drain (`GenerateResult.trace`)
    plan_reasons: dict[str, int] = field(default_factory=dict)  # steps per planner reason (`GenerateResult`)
    step_seconds: float = 0.0  # the decode steps, and the same priced as plain decoding (`GenerateResult`)
    plain_equivalent_seconds: float | None = None


class RolloutWorker:
    """One rollout worker's state: a backend, the task and its sampling settings.

    `threads`: torch threads to set (None: leave the process's setting). `board`: the `WeightBoard`
    actor it reads the newest weights from, or None when the weights are handed to its backend
    directly (in the trainer's process). `version` is the version of the weights in `models.policy`
    (0, or a resumed checkpoint's), and `proposer_state` the proposer memory a resumed run saved."""

    def __init__(self, config: TrainConfig, models: ModelSet, threads: int | None, board,
                 version: int = 0, proposer_state: dict | None = None):
        if threads is not None:
            torch.set_num_threads(threads)
        self.config, self.board = config, board
        self.backend = make_backend(config.backend, config.vllm, models)
        self.backend.version = version
        self.backend.load_proposer_state(proposer_state or {})
        self.snapshot = self.backend.proposer_state()
        self.task = make_task(config.task)
        self.offered: VersionedWeights | None = None  # the newest version offered in flight

    def adopt_latest(self) -> float:
        """Load the board's newest weights if newer than the backend's; the seconds it took."""
        return 0.0 if self.board is None else adopt(self.backend, ray.get(self.board.latest.remote()))

    def generate(self, request: RolloutRequest) -> RolloutResult:
        cfg = self.config
        load_seconds = self.adopt_latest()
        tokenizer = self.backend.tokenizer
        problems, prompts = render_prompts(self.task, tokenizer, request.first, request.count)
        params = cfg.rollout.sampling(cfg.grpo.group_size, seed=request.seed)
        version = self.backend.version
        in_flight = self.adopt_offered if cfg.pipeline.weight_updates == "step" else None
        result = self.backend.generate(prompts, params, between_steps=in_flight)
        start = time.perf_counter()
        groups = score_groups(self.task, request.first, problems, result.completions, version)
        self.snapshot = self.backend.proposer_state()
        return RolloutResult(request, groups, result.spec, result.k_histogram, result.num_tokens,
                             {"weight_load": load_seconds + result.weight_update_seconds,
                              "generation": result.seconds - result.weight_update_seconds,
                              "reward": time.perf_counter() - start}, result.weight_updates, result.trace,
                             result.plan_reasons, result.step_seconds, result.plain_equivalent_seconds)

    def evaluate(self, seed: int) -> tuple[dict, list]:
        """Held-out pass@k (`pipeline.evaluation`) of the newest weights: (result with its policy_version,
        the completions it sampled)."""
        self.adopt_latest()
        completions = []
        result = evaluate(self.backend, self.task, self.backend.tokenizer, self.config.eval,
                          self.config.rollout.max_tokens, seed=seed, completions=completions)
        self.snapshot = self.backend.proposer_state()
        return {"policy_version": self.backend.version, **result}, completions

    @ray.method(concurrency_group="state")
    def offer(self, weights: VersionedWeights) -> None:
        """A newly published version, adopted at the running request's next step boundary."""
        if self.offered is None or weights.version > self.offered.version:
            self.offered = weights

    def adopt_offered(self) -> None:
        """The engine's between-steps hook: load the offered version if it is newer than the backend's."""
        if self.offered is not None:
            adopt(self.backend, self.offered)

    def version(self) -> int:
        return self.backend.version

    @ray.method(concurrency_group="state")
    def proposer_state(self) -> dict:
        """The proposer's memory as of the end of the last request (for checkpoints)."""
        return self.snapshot


class RolloutWorkerProcess(RolloutWorker):
    """A `RolloutWorker` in a Ray actor's own process."""

    def __init__(self, *args, **kwargs):
        sys.stdout = sys.stderr  # the driver's stdout ends with its one JSON line; Ray forwards ours there
        super().__init__(*args, **kwargs)


RolloutActor = ray.remote(concurrency_groups={"state": 1})(RolloutWorkerProcess)


class RolloutPool:
    """`num_actors` rollout actors and the requests in flight on each."""

    def __init__(self, make_actor, num_actors: int, requests_per_actor: int):
        self.make_actor = make_actor  # slot -> a new actor handle for that slot
        self.actors = [make_actor(slot) for slot in range(num_actors)]
        self.requests_per_actor = requests_per_actor
        self.in_flight: dict[ray.ObjectRef, tuple[int, object, RolloutRequest]] = {}  # ref -> (slot, actor, request)
        self.restarts = [0] * num_actors
        self.abandoned = 0  # groups of requests still in flight when the pool was shut down

    def wait_ready(self) -> list[int]:
        """Block until every actor has built its backend; returns their weight versions."""
        return ray.get([actor.version.remote() for actor in self.actors])

    def in_flight_groups(self) -> int:
        return sum(request.count for _, _, request in self.in_flight.values())

    def least_loaded(self) -> tuple[int, int]:
        """(the actor slot with the fewest requests in flight, how many it has)."""
        load = [0] * len(self.actors)
        for slot, _, _ in self.in_flight.values():
            load[slot] += 1
        slot = min(range(len(self.actors)), key=load.__getitem__)
        return slot, load[slot]

    def free_slot(self) -> int | None:
        """The actor slot with the fewest requests in flight, if it can take one more."""
        slot, load = self.least_loaded()
        return slot if load < self.requests_per_actor else None

    def submit(self, slot: int, request: RolloutRequest) -> None:
        actor = self.actors[slot]
        self.in_flight[actor.generate.remote(request)] = (slot, actor, request)

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
            except ActorUnavailableError:  # unreachable for now, not dead: re-issue, keep the actor
                failed.append(request)
            except RayActorError:
                failed.append(request)
                self._replace(slot, actor)
        return results, failed

    def evaluate(self, seed: int) -> tuple[dict, list]:
        """`RolloutWorker.evaluate` on the least loaded actor (queued behind its requests). An actor that
        dies meanwhile is replaced (its requests fail in `collect`, as always) and the evaluation resent."""
        while True:
            slot, _ = self.least_loaded()
            actor = self.actors[slot]
            try:
                return ray.get(actor.evaluate.remote(seed))
            except ActorUnavailableError:
                continue
            except RayActorError:
                self._replace(slot, actor)

    def offer(self, weights: VersionedWeights) -> None:
        """Offer a new version to every actor, for in-flight adoption (no reply is awaited)."""
        for actor in self.actors:
            actor.offer.remote(weights)

    def proposer_states(self) -> list[dict]:
        """Each actor's proposer memory as of its last finished request."""
        return ray.get([actor.proposer_state.remote() for actor in self.actors])

    def _replace(self, slot: int, dead) -> None:
        """Start a new actor in `slot`, once per death (all the dead actor's requests fail together)."""
        if self.actors[slot] is not dead:
            return
        self.restarts[slot] += 1
        if self.restarts[slot] > MAX_RESTARTS_PER_ACTOR:
            raise RuntimeError(f"rollout actor {slot} died {self.restarts[slot]} times; giving up")
        self.actors[slot] = self.make_actor(slot)

    def shutdown(self) -> None:
        """Kill the actors; requests still in flight are abandoned (counted in `abandoned`)."""
        for actor in self.actors:
            ray.kill(actor)
        self.abandoned += self.in_flight_groups()
        self.in_flight.clear()

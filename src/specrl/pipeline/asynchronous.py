"""Asynchronous GRPO on Ray: rollout actors keep generating while the trainer trains.

```
            requests (P/R per step, seeded)          publish(version s): one ray.put of policy + draft
   ┌──────────────── controller ◄──────────────────────────────── trainer (this process) ◄──┐
   │                 admission: buffered + in flight + R ≤ W                                 │
   ▼                                                                                         │
 RolloutActor 0 ─┐  adopt newest weights, generate G per prompt (exact speculation),        │ take P groups,
 RolloutActor 1 ─┼─ score ──► scored groups ──► StalenessBuffer ── drop if (s-1) - v > S ───┘ staleness ≤ S
 ...            ─┘  (a dead actor is replaced; its requests are re-issued)
```
Terms: P = rollout.prompts_per_step (groups per step), G = grpo.group_size, R =
pipeline.prompts_per_request, S = pipeline.max_staleness, W = the window,
min(pipeline.buffer_size, (S + 1) * P) groups. The trainer at step s holds version
s - 1; a group made by version v has staleness (s - 1) - v when trained on.

Backpressure (what blocks whom):

| who waits | on what | bound |
|---|---|---|
| trainer | the buffer holding P groups of staleness ≤ S (`pipeline_fill` at step 1, `buffer_starvation` after) | – |
| controller (new requests) | buffered + in flight + R ≤ W groups: at version v, requests for at most S + 1 steps ahead | W = (S + 1) * P by default |
| controller (per actor) | requests queued on one actor | pipeline.requests_per_actor (default 2: one runs, one waits) |
| rollout actor | nothing but its queue: it adopts the newest weights on the board at the start of each request | – |
| trainer (weight sync) | one ray.put of the new state dicts, posted to the weight board (`weight_sync`); actors load them between requests (`weight_load`) | one version held by the board |

The window is the staleness bound made into admission control (as AReaL does): a
request is sent only when its groups will be trainable, so drops happen only when
results arrive out of order (several actors, restarts). `S = 0` makes W = P: the next
step's requests are sent only after the trainer has published the weights they must
use, which is the synchronous loop (with R = P and fixed K, the same samples, rewards
and losses as `SyncTrainer`, step for step; see tests/test_async.py).

Stale batches are trained with the decoupled, truncated-IS objective described in
`specrl.rl.grpo`, which weighs each token by its own behaviour logprob; a batch whose
every token comes from the trainer's version takes the plain GRPO path. When actors
take new weights (`pipeline.weight_updates`):
- `request` (default): between requests. A running request finishes on the version it
  started with; a queued one starts on the newest.
- `step`: also in flight. The trainer offers each new version to every actor, and a
  running request adopts it at its next engine step (`RolloutEngine.generate`'s
  `between_steps`), so one sequence's tokens may come from several versions. Each
  token carries its version; a group's version is its oldest token's, so the staleness
  bound S holds on every token trained on. Fresher tokens mean IS weights nearer 1; the
  cost is one recompute of the live rows' cache per adopted version.

Resume (`--resume RUN_DIR`): a checkpoint holds, besides the weights and optimiser, the
controller's request counter, the requests in flight or awaiting re-issue (they are sent
again), the buffer's groups and the ledger (consumed, dropped, seen), and each actor's
proposer memory. Actors restart from the checkpoint's policy at its version. The data
positions trained on continue without a gap or a repeat; which groups arrive when is a
race, as in any async run, so a resumed run is not step-for-step the uninterrupted one.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict

import ray

from specrl.pipeline.actors import RolloutActor, RolloutPool, RolloutRequest, RolloutResult
from specrl.pipeline.buffer import StalenessBuffer
from specrl.pipeline.config import TrainConfig
from specrl.pipeline.learner import Learner, sampling_seed, starting_point
from specrl.pipeline.ray_session import RaySession
from specrl.pipeline.weights import VersionedWeights, WeightBoardActor, publish
from specrl.telemetry.spec_stats import SpecStats


class AsyncTrainer(Learner):
    """A `Learner` fed by Ray rollout actors through a staleness-bounded buffer."""

    def __init__(self, config: TrainConfig, resume: bool = False):
        checkpoint, models = starting_point(config, resume)
        super().__init__(config, checkpoint, models)
        spec, saved = config.pipeline, self.resumed_pipeline
        self.P = config.rollout.prompts_per_step
        self.R = spec.prompts_per_request or self.P
        self.window = min(spec.buffer_size or (spec.max_staleness + 1) * self.P, (spec.max_staleness + 1) * self.P)
        self.buffer = StalenessBuffer(spec.max_staleness)
        self.next_request = saved.get("next_request", 0)
        self.reissue: list[RolloutRequest] = [RolloutRequest(**r) for r in saved.get("requests", [])]  # sent first
        if saved:
            self.buffer.load_state_dict(saved["buffer"])
        self.ray = RaySession(spec.ray_address)
        # the starting weights, which every actor loads itself, are version 0 or the checkpoint's
        self.board = WeightBoardActor.remote(VersionedWeights(self.start_version))
        states = saved.get("proposer") or [{}]
        make_actor = RolloutActor.options(num_cpus=spec.actor_threads).remote
        self.pool = RolloutPool(lambda slot: make_actor(config, models, spec.actor_threads, self.board,
                                                        self.start_version, states[slot % len(states)]),
                                spec.num_actors, spec.requests_per_actor)
        self.reissued = 0
        self.in_flight_updates = 0  # versions adopted by running requests (pipeline.weight_updates=step)
        self.actor_seconds: Counter[str] = Counter()
        self._since_step: list[RolloutResult] = []  # results ingested since the last record

    # -- the controller -------------------------------------------------------------
    def _new_request(self) -> RolloutRequest:
        number = self.next_request
        return RolloutRequest(number, number * self.R, self.R, sampling_seed(self.config.run.seed, number + 1))

    def dispatch(self) -> None:
        """Send requests while an actor has room and the window admits them (re-issues first)."""
        while (slot := self.pool.free_slot()) is not None:
            request = self.reissue[0] if self.reissue else self._new_request()
            if len(self.buffer) + self.pool.in_flight_groups() + request.count > self.window:
                return
            if self.reissue:
                self.reissue.pop(0)
                self.reissued += 1
            else:
                self.next_request += 1
            self.pool.submit(slot, request)

    def ingest(self, timeout: float | None) -> None:
        """Move finished requests into the buffer; queue the failed ones for re-issue."""
        results, failed = self.pool.collect(timeout)
        for result in results:
            self.buffer.put(result.groups)
            self.actor_seconds.update(result.seconds)
            self.note_rollouts(result.spec, result.num_tokens, result.seconds["generation"])
            self._since_step.append(result)
        self.reissue += failed

    def next_batch(self, step: int):
        """P groups trainable at step s (version s - 1); waits (timed) while the buffer is short."""
        with self.timer.stage("pipeline_fill" if step == 1 else "buffer_starvation"):
            while True:
                self.ingest(timeout=0)
                batch = self.buffer.take(self.P, trainer_version=step - 1)
                if batch is not None:
                    return batch
                self.dispatch()  # dropped groups and failed requests free room in the window
                self.ingest(timeout=None)

    # -- the run ---------------------------------------------------------------------
    def step(self, step: int) -> dict:
        groups = self.next_batch(step)
        stats = self.train(step, groups, decoupled=min(g.version for g in groups) < step - 1)
        with self.timer.stage("weight_sync"):
            policy, draft = self.weights()
            weights = publish(step, policy, draft)
            ray.get(self.board.post.remote(weights))
            if self.config.pipeline.weight_updates == "step":
                self.pool.offer(weights)
            self.dispatch()
        record = self._record(step, groups, stats)
        self.checkpoint_if_due(step)  # after the record: a resume from it never lacks this step's record
        return record

    def _record(self, step: int, groups, stats: dict) -> dict:
        results, self._since_step = self._since_step, []
        spec, k_histogram = SpecStats(), Counter()
        for result in results:
            spec.merge(result.spec)
            k_histogram.update(result.k_histogram)
        tokens = sum(r.num_tokens for r in results)
        seconds = sum(r.seconds["generation"] for r in results)
        actors = {name: sum(r.seconds.get(name, 0.0) for r in results) for name in ("generation", "weight_load", "reward")}
        self.in_flight_updates += sum(r.weight_updates for r in results)
        extra = {"actors": actors, "in_flight_weight_updates": sum(r.weight_updates for r in results),
                 "dropped_total": len(self.buffer.dropped),
                 "buffered": len(self.buffer), "in_flight_groups": self.pool.in_flight_groups()}
        return self.record(step, groups, stats, spec, dict(k_histogram), tokens / max(seconds, 1e-9), extra)

    def pipeline_state(self) -> dict:
        """Everything the controller needs to continue: requests not yet answered are sent again."""
        pending = self.reissue + [request for _, _, request in self.pool.in_flight.values()]
        return {"next_request": self.next_request, "requests": [asdict(r) for r in pending],
                "buffer": self.buffer.state_dict(), "proposer": self.pool.proposer_states()}

    def run(self, progress=None) -> dict:
        try:
            with self.timer.stage("actor_startup"):
                self.pool.wait_ready()
            self.dispatch()
            for step in range(self.start_step + 1, self.config.run.steps + 1):
                record = self.step(step)
                if progress is not None:
                    progress(step, self.config.run.steps, record)
            return self.summary()
        finally:
            self.sink.close()
            self.pool.shutdown()
            self.ray.close()
            self.close()

    def ledger(self) -> dict[str, int]:
        """Where every issued group went: consumed + dropped + buffered + in flight + awaiting re-issue +
        abandoned at shutdown (a resumed run sends those again) == issued."""
        return {"issued": self.next_request * self.R, "consumed": len(self.buffer.consumed),
                "dropped": len(self.buffer.dropped), "buffered": len(self.buffer),
                "in_flight": self.pool.in_flight_groups(), "awaiting_reissue": sum(r.count for r in self.reissue),
                "abandoned": self.pool.abandoned, "duplicates": self.buffer.duplicates}

    def summary(self) -> dict:
        timing = self.timer.total
        fill, starvation = timing.get("pipeline_fill", 0.0), timing.get("buffer_starvation", 0.0)
        return {
            **super().summary(),
            "max_staleness": self.config.pipeline.max_staleness,
            "dropped": len(self.buffer.dropped),
            "exposed_generation_s": fill + starvation, "buffer_starvation_s": starvation,
            "weight_sync_bubble_s": {"trainer": timing.get("weight_sync", 0.0),
                                     "actors": self.actor_seconds.get("weight_load", 0.0)},
            "actor_timing": dict(self.actor_seconds), "weight_updates": self.config.pipeline.weight_updates,
            "in_flight_weight_updates": self.in_flight_updates,
            "actors": self.config.pipeline.num_actors, "actor_restarts": sum(self.pool.restarts),
            "requests_reissued": self.reissued, "groups": self.ledger(),
        }

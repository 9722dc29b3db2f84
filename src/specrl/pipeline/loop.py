"""The GRPO pipeline: one loop, a staleness-bounded buffer, and a source of rollouts.

```
            requests (P/R per step, seeded)          publish(version s): policy + draft
   ┌──────────────── controller ◄──────────────────────────────── learner (this process) ◄──┐
   │                 admission: buffered + in flight + R ≤ W                                 │
   ▼                                                                                         │
 rollout source ──  adopt newest weights, generate G per prompt (exact speculation),        │ take P groups,
 (`sources`)        score ──► scored groups ──► StalenessBuffer ── drop if (s-1) - v > S ───┘ staleness ≤ S
                    (a dead actor is replaced; its requests are re-issued)
```
Terms: P = rollout.prompts_per_step (groups per step), G = grpo.group_size, R =
pipeline.prompts_per_request, S = pipeline.max_staleness, W = the window,
min(pipeline.buffer_size, (S + 1) * P) groups. The learner at step s holds version
s - 1; a group made by version v has staleness (s - 1) - v when trained on.

The two modes are this loop over two sources (`specrl.pipeline.sources`):
- **sync** (`pipeline.mode=sync`): S = 0 and R = P over a `LocalSource`, a rollout worker in
  this process that runs a request when it is collected. The window admits the next
  step's request only after the learner has published the weights it must use, so a step
  is generate -> score -> train -> sync, one after another, on the trainer's clock.
- **async** (`pipeline.mode=async`): Ray rollout actors (`ActorSource`) keep generating while
  the learner trains, S and R as configured. With S = 0, R = P and fixed K it makes the same
  samples, rewards and losses as sync, step for step (tests/test_async.py).

Every random choice is a function of (run.seed, request number): request n renders task
positions [n R, (n + 1) R) and samples with `sampling_seed(run.seed, n + 1)`, so in sync
step s is request s - 1, seeded with s.

Backpressure (what blocks whom):

| who waits | on what | bound |
|---|---|---|
| learner | the buffer holding P groups of staleness ≤ S (`generation` in sync; `pipeline_fill` at step 1, `buffer_starvation` after, in async) | – |
| controller (new requests) | buffered + in flight + R ≤ W groups: at version v, requests for at most S + 1 steps ahead | W = (S + 1) * P by default |
| controller (per worker) | requests queued on one actor | pipeline.requests_per_actor (default 2: one runs, one waits); one in sync |
| rollout actor | nothing but its queue: it adopts the newest weights on the board at the start of each request | – |
| learner (weight sync) | sync: loading the new state dicts into the engine; async: one ray.put posted to the weight board (`weight_sync`), which actors load between requests (`weight_load`) | one version held by the board |

The window is the staleness bound made into admission control (as AReaL does): a
request is sent only when its groups will be trainable, so drops happen only when
results arrive out of order (several actors, restarts).

Stale batches are trained with the decoupled, truncated-IS objective described in
`specrl.rl.grpo`, which weighs each token by its own behaviour logprob; a batch whose
every token comes from the learner's version takes the plain GRPO path. When actors
take new weights (`pipeline.weight_updates`, async only: sync never has a newer version
while a request runs):
- `request` (default): between requests. A running request finishes on the version it
  started with; a queued one starts on the newest.
- `step`: also in flight. The learner offers each new version to every actor, and a
  running request adopts it at its next engine step (`RolloutEngine.generate`'s
  `between_steps`), so one sequence's tokens may come from several versions. Each
  token carries its version; a group's version is its oldest token's, so the staleness
  bound S holds on every token trained on. Fresher tokens mean IS weights nearer 1; the
  cost is one recompute of the live rows' cache per adopted version.

Held-out evaluation (`eval.every`) runs on the source's newest weights: in this process
(sync), or on the least loaded actor, queued behind its requests (async). It is timed as
`eval` and left out of step_seconds.

Resume (`--resume RUN_DIR`): a checkpoint holds, besides the weights and optimiser, the
controller's request counter, the requests sent and not yet answered (they are sent
again), the buffer's groups and the ledger (consumed, dropped, filtered, seen), and each worker's
proposer memory. Workers restart from the checkpoint's policy at its version. The data
positions trained on continue without a gap or a repeat. In sync a resumed run is step
for step the uninterrupted one; in async which groups arrive when is a race, as in any
async run.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict

from specrl.pipeline.actors import RolloutRequest, RolloutResult
from specrl.pipeline.buffer import StalenessBuffer
from specrl.pipeline.config import TrainConfig
from specrl.pipeline.groups import Group
from specrl.pipeline.learner import Learner, sampling_seed, starting_point
from specrl.pipeline.sources import make_source
from specrl.telemetry.spec_stats import SpecStats

EVAL_SEED_OFFSET = 7919  # held-out sampling seed: sampling_seed(run.seed, 0) + this, the same at every evaluation


class Pipeline:
    """A `Learner` fed by a rollout source through a staleness-bounded buffer (see the module docstring)."""

    def __init__(self, config: TrainConfig, resume: bool = False):
        checkpoint, models = starting_point(config, resume)
        self.config = config
        self.learner = learner = Learner(config, checkpoint, models)
        pipeline, saved = config.pipeline, learner.resumed_pipeline
        sync = pipeline.mode == "sync"
        self.P = config.rollout.prompts_per_step
        self.R = self.P if sync else pipeline.prompts_per_request or self.P
        self.max_staleness = 0 if sync else pipeline.max_staleness
        window = (self.max_staleness + 1) * self.P
        self.window = window if sync else min(pipeline.buffer_size or window, window)
        self.dynamic = config.grpo.dynamic_sampling
        self.buffer = StalenessBuffer(self.max_staleness, drop_uniform=self.dynamic)
        # a checkpoint written before the two modes shared this loop holds no request counter: step s was request s - 1
        self.next_request = saved.get("next_request", learner.start_step * self.P // self.R)
        self.next_position = saved.get("next_position", self.next_request * self.R)  # the next data position to issue
        self.reissue: list[RolloutRequest] = [RolloutRequest(**r) for r in saved.get("requests", [])]  # sent first
        if "buffer" in saved:
            self.buffer.load_state_dict(saved["buffer"])
        self.filtered_at_step = len(self.buffer.filtered)  # groups set aside before this step (dynamic sampling)
        states = saved.get("proposer") or [{}]  # one per worker (a sync checkpoint from before held one dict)
        if config.eval.every:
            learner.task.check_held_out(config.eval.prompts, config.run.steps * self.P)
        self.source = make_source(config, models, learner.start_version,
                                  states if isinstance(states, list) else [states])
        self.reissued = 0
        self.in_flight_updates = 0  # versions adopted by running requests (pipeline.weight_updates=step)
        self.rollout_seconds: Counter[str] = Counter()  # the workers' stages: generation, weight_load, reward
        self._since_step: list[RolloutResult] = []  # results ingested since the last record
        self.plan_reasons: Counter[str] = Counter()  # engine steps per planner reason, over the run
        # the priced requests' decode steps: as they ran, and priced as plain decoding (`GenerateResult`)
        self.decode_seconds, self.plain_equivalent_seconds = 0.0, 0.0

    @property
    def history(self) -> list[dict]:
        return self.learner.history

    # -- the controller -------------------------------------------------------------
    def _new_request(self) -> RolloutRequest:
        """The next R positions; under dynamic sampling only as many as the window has room for (a top-up
        for groups set aside), and at least one."""
        number, count = self.next_request, self.R
        if self.dynamic:
            count = max(1, min(self.R, self.window - len(self.buffer) - self.in_flight_groups()))
        if self.config.eval.every:
            self.learner.task.check_held_out(self.config.eval.prompts, self.next_position + count)
        return RolloutRequest(number, self.next_position, count, sampling_seed(self.config.run.seed, number + 1))

    def dispatch(self) -> None:
        """Send requests while a worker has room and the window admits them (re-issues first)."""
        while (slot := self.source.free_slot()) is not None:
            request = self.reissue[0] if self.reissue else self._new_request()
            if len(self.buffer) + self.in_flight_groups() + request.count > self.window:
                return
            if self.reissue:
                self.reissue.pop(0)
                self.reissued += 1
            else:
                self.next_request += 1
                self.next_position += request.count
            self.source.submit(slot, request)

    def in_flight_groups(self) -> int:
        return sum(request.count for request in self.source.pending())

    def ingest(self, timeout: float | None) -> list[RolloutResult]:
        """Move finished requests into the buffer; queue the failed ones for re-issue. Returns the results."""
        results, failed = self.source.collect(timeout)
        for result in results:
            self.buffer.put(result.groups)
            self.rollout_seconds.update(result.seconds)
            if result.plain_equivalent_seconds is not None:
                self.decode_seconds += result.step_seconds
                self.plain_equivalent_seconds += result.plain_equivalent_seconds
            self.learner.note_rollouts(result.spec, result.num_tokens, result.seconds["generation"])
            self._since_step.append(result)
        self.reissue += failed
        return results

    def next_batch(self, step: int) -> list[Group]:
        """P groups trainable at step s (version s - 1); waits (timed) while the buffer is short. In this
        process the wait is the generation itself, and its scoring is timed as `reward`."""
        timer, local = self.learner.timer, self.source.in_process
        stage = "generation" if local else "pipeline_fill" if step == 1 else "buffer_starvation"
        arrived = []
        with timer.stage(stage):
            while True:
                arrived += self.ingest(timeout=0)
                batch = self.buffer.take(self.P, trainer_version=step - 1)
                if batch is not None:
                    break
                self._check_dynamic_sampling_budget(step)
                self.dispatch()  # dropped groups and failed requests free room in the window
                arrived += self.ingest(timeout=None)
        if local:
            timer.reassign(stage, "reward", sum(r.seconds["reward"] for r in arrived))
        return batch

    def _check_dynamic_sampling_budget(self, step: int) -> None:
        filtered = len(self.buffer.filtered) - self.filtered_at_step
        budget = self.config.grpo.dynamic_sampling_budget * self.P
        if filtered > budget:
            raise RuntimeError(
                f"step {step}: dynamic sampling set aside {filtered} groups whose rewards were all equal (more than "
                f"grpo.dynamic_sampling_budget x rollout.prompts_per_step = {budget}) before {self.P} groups with "
                "a reward spread arrived: the task is too hard or too easy for the policy at this group size. "
                "Raise grpo.group_size or the budget, or change the task")

    def evaluate(self) -> dict:
        """Held-out pass@k of the source's newest policy (timed as `eval`, left out of step_seconds). The
        same problems and seed every time, so successive evaluations differ only by the policy."""
        with self.learner.timer.stage("eval"):
            result, completions = self.source.evaluate(sampling_seed(self.config.run.seed, 0) + EVAL_SEED_OFFSET)
            result.update(self.learner.head_acceptance(completions))
        return result

    # -- the run ---------------------------------------------------------------------
    def step(self, step: int) -> dict:
        cfg, learner = self.config, self.learner
        extra = {}
        if cfg.eval.every and step == 1:
            extra["eval_start"] = self.evaluate()
        groups = self.next_batch(step)
        self.source.before_training()
        stats = learner.train(step, groups, decoupled=min(g.version for g in groups) < step - 1)
        with learner.timer.stage("weight_sync"):
            policy, draft = learner.weights()
            self.source.publish(step, policy, draft)
            self.dispatch()
        if cfg.eval.every and (step % cfg.eval.every == 0 or step == cfg.run.steps):
            extra["eval"] = self.evaluate()
        record = self._record(step, groups, stats, extra)
        # after the record: a resume from it never lacks this step's record
        learner.checkpoint_if_due(step, self.pipeline_state)
        return record

    def _record(self, step: int, groups: list[Group], stats: dict, extra: dict) -> dict:
        results, self._since_step = self._since_step, []
        spec, k_histogram, reasons = SpecStats(), Counter(), Counter()
        for result in results:
            spec.merge(result.spec)
            k_histogram.update(result.k_histogram)
            reasons.update(result.plan_reasons)
        self.plan_reasons.update(reasons)
        tokens = sum(r.num_tokens for r in results)
        seconds = sum(r.seconds["generation"] for r in results)
        updates = sum(r.weight_updates for r in results)
        self.in_flight_updates += updates
        filtered, self.filtered_at_step = len(self.buffer.filtered) - self.filtered_at_step, len(self.buffer.filtered)
        if self.dynamic:
            extra["filtered_groups"] = filtered  # each a group of grpo.group_size extra generations
        extra = {**extra, "rollout_seconds": {name: sum(r.seconds.get(name, 0.0) for r in results)
                                              for name in ("generation", "weight_load", "reward")},
                 "in_flight_weight_updates": updates, "dropped_total": len(self.buffer.dropped),
                 "plan_reasons": dict(reasons),
                 "buffered": len(self.buffer), "in_flight_groups": self.in_flight_groups()}
        if results and results[0].trace:
            extra["drain"] = results[0].trace  # the live batch and k over one request
        return self.learner.record(step, groups, stats, spec, dict(k_histogram), tokens / max(seconds, 1e-9), extra)

    def pipeline_state(self) -> dict:
        """Everything the controller needs to continue: requests not yet answered are sent again."""
        pending = self.reissue + self.source.pending()
        return {"next_request": self.next_request, "next_position": self.next_position,
                "requests": [asdict(r) for r in pending],
                "buffer": self.buffer.state_dict(), "proposer": self.source.proposer_states()}

    def run(self, progress=None) -> dict:
        learner = self.learner
        try:
            self.source.wait_ready(learner.timer)
            self.dispatch()
            for step in range(learner.start_step + 1, self.config.run.steps + 1):
                record = self.step(step)
                if progress is not None:
                    progress(step, self.config.run.steps, record)
            return self.summary()
        finally:
            learner.sink.close()
            self.source.close()
            learner.close()

    def ledger(self) -> dict[str, int]:
        """Where every issued group went: consumed + dropped + filtered + buffered + in flight + awaiting
        re-issue + abandoned at shutdown (a resumed run sends those again) == issued."""
        return {"issued": self.next_position, "consumed": len(self.buffer.consumed),
                "dropped": len(self.buffer.dropped), "filtered": len(self.buffer.filtered), "buffered": len(self.buffer),
                "in_flight": self.in_flight_groups(), "awaiting_reissue": sum(r.count for r in self.reissue),
                "abandoned": self.source.abandoned, "duplicates": self.buffer.duplicates}

    def summary(self) -> dict:
        timing = self.learner.timer.total
        waited = sum(timing.get(stage, 0.0) for stage in ("generation", "reward", "pipeline_fill", "buffer_starvation"))
        return {
            **self.learner.summary(),
            "max_staleness": self.max_staleness,
            "dropped": len(self.buffer.dropped),
            "exposed_generation_s": waited, "buffer_starvation_s": timing.get("buffer_starvation", 0.0),
            "weight_sync_bubble_s": {"trainer": timing.get("weight_sync", 0.0),
                                     "rollout": self.rollout_seconds.get("weight_load", 0.0)},
            "rollout_timing": dict(self.rollout_seconds), "weight_updates": self.config.pipeline.weight_updates,
            "in_flight_weight_updates": self.in_flight_updates,
            "dynamic_sampling_extra_generations": len(self.buffer.filtered) * self.config.grpo.group_size,
            "plan_reasons": dict(self.plan_reasons),
            # what speculation saved: the decode steps priced as plain decoding over what they took (`GenerateResult`)
            "speculation_gain": self.plain_equivalent_seconds / self.decode_seconds if self.decode_seconds else None,
            **self.source.summary(), "requests_reissued": self.reissued, "groups": self.ledger(),
        }

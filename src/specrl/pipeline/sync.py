"""The synchronous GRPO loop: generate -> score -> train -> sync, one step after another.

    step s:  prompts[s*P : (s+1)*P] --backend.generate(n=G)--> completions (tokens, logprobs, version s-1)
             rewards (task verifier) -> group advantages -> trainer.step (GRPO; draft adapts on the same
             micro-batches) -> sync policy + draft weights into the engine as version s -> metrics, checkpoint

Every random choice is a function of (run.seed, step): sampling is seeded per step and
the data position is the step number, so a run resumed from a checkpoint continues
exactly as the uninterrupted run would have. The training half is the `Learner`
(shared with the async pipeline); this module only adds the in-process backend.
"""
from __future__ import annotations

from specrl.backends import make_backend
from specrl.pipeline.config import TrainConfig
from specrl.pipeline.evaluation import check_held_out, evaluate
from specrl.pipeline.groups import score_groups
from specrl.tasks import render_prompts
from specrl.pipeline.learner import Learner, sampling_seed, starting_point

__all__ = ["SyncTrainer", "sampling_seed"]


class SyncTrainer(Learner):
    """A `Learner` fed by one in-process backend, one step after another."""

    def __init__(self, config: TrainConfig, resume: bool = False):
        checkpoint, models = starting_point(config, resume)
        self.backend = make_backend(config.backend, config.vllm, models)
        # colocated vLLM on a GPU: the engine sleeps while the trainer steps (vllm.sleep_mode)
        self.sleeps = config.backend.backend == "vllm" and config.vllm.sleep_mode
        super().__init__(config, checkpoint, models, tokenizer=self.backend.tokenizer)
        if checkpoint is not None:
            policy, draft = self.weights()
            self.backend.sync_weights(policy, version=self.start_version, draft=draft)
            self.backend.load_proposer_state(self.resumed_pipeline.get("proposer", {}))
        if config.eval.every:
            check_held_out(self.task, config.eval.prompts, config.run.steps * config.rollout.prompts_per_step)

    def evaluate(self) -> dict:
        """Held-out pass@k of the engine's current policy (timed as `eval`, left out of step_seconds).
        The same problems and seed every time, so successive evaluations differ only by the policy."""
        cfg = self.config
        completions = []
        with self.timer.stage("eval"):
            result = evaluate(self.backend, self.task, self.tokenizer, cfg.eval, cfg.rollout.max_tokens,
                              seed=sampling_seed(cfg.run.seed, 0) + 7919, completions=completions)
            result.update(self.head_acceptance(completions))
        return {"policy_version": self.backend.version, **result}

    def pipeline_state(self) -> dict:
        return {"proposer": self.backend.proposer_state()}

    def step(self, step: int) -> dict:
        cfg, timer = self.config, self.timer
        P, G = cfg.rollout.prompts_per_step, cfg.grpo.group_size
        problems, prompts = render_prompts(self.task, self.tokenizer, (step - 1) * P, P)
        params = cfg.rollout.sampling(G, seed=sampling_seed(cfg.run.seed, step))
        version = self.backend.version
        extra = {}  # eval results; the rollouts' drain (the live batch and k over the call)
        if cfg.eval.every and step == 1:
            extra["eval_start"] = self.evaluate()
        with timer.stage("generation"):
            result = self.backend.generate(prompts, params)
        with timer.stage("reward"):
            groups = score_groups(self.task, (step - 1) * P, problems, result.completions, version)
        if self.sleeps:
            self.backend.sleep()
        stats = self.train(step, groups)
        with timer.stage("weight_sync"):
            if self.sleeps:
                self.backend.wake_up()
            policy, draft = self.weights()
            self.backend.sync_weights(policy, version=step, draft=draft)
        self.note_rollouts(result.spec, result.num_tokens, result.seconds)
        extra["drain"] = result.trace
        if cfg.eval.every and (step % cfg.eval.every == 0 or step == cfg.run.steps):
            extra["eval"] = self.evaluate()
        record = self.record(step, groups, stats, result.spec, result.k_histogram,
                             result.num_tokens / max(result.seconds, 1e-9), extra)
        self.checkpoint_if_due(step)  # after the record: a resume from it never lacks this step's record
        return record

    def run(self, progress=None) -> dict:
        try:
            for step in range(self.start_step + 1, self.config.run.steps + 1):
                record = self.step(step)
                if progress is not None:
                    progress(step, self.config.run.steps, record)
        finally:
            self.sink.close()
            self.close()
        return self.summary()

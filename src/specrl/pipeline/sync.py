"""The synchronous GRPO loop: generate -> score -> train -> sync, one step after another.

    step s:  prompts[s*P : (s+1)*P] --backend.generate(n=G)--> completions (tokens, logprobs, version s-1)
             rewards (task verifier) -> group advantages -> trainer.step (GRPO; draft adapts on the same
             micro-batches) -> sync policy + draft weights into the engine as version s -> metrics, checkpoint

Every random choice is a function of (run.seed, step): sampling is seeded per step and
the data position is the step number, so a run resumed from a checkpoint continues
exactly as the uninterrupted run would have.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
from pathlib import Path

import torch

from specrl.backends import make_backend
from specrl.engine.sampling import SamplingParams
from specrl.models.registry import DRAFT_FOR, resolve_checkpoint
from specrl.pipeline.checkpoint import latest_checkpoint, restore_training_state, save_checkpoint
from specrl.pipeline.config import TrainConfig, config_to_dict
from specrl.rl.advantages import group_advantages
from specrl.rl.draft_adaptation import DraftTrainer
from specrl.rl.tasks import make_task
from specrl.rl.trainer import PolicyTrainer
from specrl.telemetry.sinks import MetricsSink, truncate_metrics
from specrl.telemetry.spec_stats import SpecStats
from specrl.telemetry.timers import StageTimer


def _checkpoints_to_load(config: TrainConfig, resume_from: Path | None) -> tuple[str, str | None]:
    """(policy dir, draft dir or None) to start from: the registered models or the checkpoint's."""
    wants_draft = config.backend.proposer == "draft"
    draft = (config.backend.draft or DRAFT_FOR.get(config.backend.model)) if wants_draft else None
    if resume_from is None:
        return str(resolve_checkpoint(config.backend.model)), str(resolve_checkpoint(draft)) if draft else None
    saved_draft = resume_from / "draft"
    return str(resume_from / "policy"), str(saved_draft) if saved_draft.is_dir() else (
        str(resolve_checkpoint(draft)) if draft else None)


def sampling_seed(run_seed: int, step: int) -> int:
    return run_seed * 1_000_003 + step


class SyncTrainer:
    """Owns the backend, the policy (and draft) trainer, the task and the telemetry of one run."""

    def __init__(self, config: TrainConfig, resume: bool = False):
        self.config = config
        self.run_dir = Path(config.run.run_dir)
        checkpoint = latest_checkpoint(self.run_dir) if resume else None
        if resume and checkpoint is None:
            raise ValueError(f"--resume {self.run_dir}: no checkpoint to resume from (checkpoints/ is empty)")
        policy_dir, draft_dir = _checkpoints_to_load(config, checkpoint)
        self.backend = make_backend(dataclasses.replace(config.backend, model=policy_dir, draft=draft_dir))
        self.tokenizer = self.backend.tokenizer
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.trainer = PolicyTrainer(policy_dir, config.grpo, config.optim, config.rollout.temperature, pad)
        self.draft = None
        if config.draft.enabled and draft_dir is not None:
            self.draft = DraftTrainer(draft_dir, config.draft, config.rollout.temperature)
        self.task = make_task(config.task.name, config.task.size, config.task.seed, dict(config.task.difficulty))
        self.start_step = 0
        if checkpoint is not None:
            state = restore_training_state(checkpoint, self.trainer.optimizer,
                                           self.draft.optimizer if self.draft else None)
            self.start_step = state["step"]
            self.backend.sync_weights(self.trainer.state_dict(), version=state["version"],
                                      draft=self.draft.state_dict() if self.draft else None)
            truncate_metrics(self.run_dir, self.start_step)
        else:
            self._claim_run_dir()
        (self.run_dir / "config.json").write_text(json.dumps(config_to_dict(config), indent=2))
        self.sink = MetricsSink(self.run_dir, tensorboard=config.run.tensorboard)
        self.timer = StageTimer()
        self.spec_total = SpecStats()
        self.history: list[dict] = []

    def _claim_run_dir(self) -> None:
        """Start a fresh run folder; an earlier run's checkpoints are never dropped silently."""
        if latest_checkpoint(self.run_dir) is not None:
            if not self.config.run.overwrite:
                raise ValueError(f"{self.run_dir} already holds a run's checkpoints: continue it with --resume "
                                 f"{self.run_dir}, pick another run.run_dir, or set run.overwrite=true to replace it")
            shutil.rmtree(self.run_dir / "checkpoints")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "metrics.jsonl").unlink(missing_ok=True)

    def step(self, step: int) -> dict:
        cfg, timer = self.config, self.timer
        P, G = cfg.rollout.prompts_per_step, cfg.grpo.group_size
        problems = [self.task[(step - 1) * P + i] for i in range(P)]
        prompts = [self.task.render(p, self.tokenizer) for p in problems]
        params = SamplingParams(n=G, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                max_tokens=cfg.rollout.max_tokens, seed=sampling_seed(cfg.run.seed, step))
        with timer.stage("generation"):
            result = self.backend.generate(prompts, params)
        completions = result.completions
        with timer.stage("reward"):
            rewards = torch.tensor([self.task.reward(c.text, problems[c.prompt_index]) for c in completions])
        advantages = group_advantages(rewards, G, scale=cfg.grpo.scale_advantages)
        prompt_ids = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        adapt = self.draft is not None and step % cfg.draft.every == 0
        num_tokens = sum(len(c.token_ids) for c in completions)
        draft_seconds = StageTimer()

        def on_micro_batch(batch, logits):
            with draft_seconds.stage("draft_training"):
                self.draft.accumulate(batch, logits, num_tokens)

        with timer.stage("training"):
            stats = self.trainer.step([prompt_ids[c.prompt_index] for c in completions],
                                      [c.token_ids for c in completions], [c.logprobs for c in completions],
                                      advantages, on_micro_batch=on_micro_batch if adapt else None)
        timer.reassign("training", "draft_training", draft_seconds.total.get("draft_training", 0.0))
        if adapt:
            with timer.stage("draft_training"):
                stats.update(self.draft.step())
        with timer.stage("weight_sync"):
            self.backend.sync_weights(self.trainer.state_dict(), version=step,
                                      draft=self.draft.state_dict() if self.draft else None)
        every = cfg.run.checkpoint_every
        if step == cfg.run.steps or (every and step % every == 0):
            with timer.stage("checkpoint"):
                save_checkpoint(self.run_dir, step, step, self.trainer.model, self.trainer.optimizer, self.tokenizer,
                                self.draft.model if self.draft else None, self.draft.optimizer if self.draft else None)
        self.spec_total.merge(result.spec)
        lengths = [len(c.token_ids) for c in completions]
        record = {
            "step": step,
            "policy_version": completions[0].versions[0] if completions[0].versions else step - 1,
            "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std(unbiased=False)),
            "response_length_mean": statistics.mean(lengths), "response_length_max": max(lengths),
            "rollout_tokens": num_tokens, "rollout_tokens_per_s": num_tokens / max(result.seconds, 1e-9),
            "spec": result.spec.as_dict(), "k_histogram": {str(k): v for k, v in result.k_histogram.items()},
            "train": stats, "timing": timer.lap(),
        }
        record["step_seconds"] = sum(record["timing"].values())
        self.sink.write(step, record)
        self.history.append(record)
        return record

    def run(self, progress=None) -> dict:
        try:
            for step in range(self.start_step + 1, self.config.run.steps + 1):
                record = self.step(step)
                if progress is not None:
                    progress(step, self.config.run.steps, record)
        finally:
            self.sink.close()
        return self.summary()

    def summary(self) -> dict:
        rewards = [r["reward_mean"] for r in self.history]
        tail = rewards[-max(1, len(rewards) // 5):]
        generation = self.timer.total.get("generation", 0.0)
        return {
            "steps": self.config.run.steps, "steps_run": len(self.history), "resumed_from": self.start_step,
            "reward_first": rewards[0] if rewards else None, "reward_last": rewards[-1] if rewards else None,
            "reward_last_fifth_mean": statistics.mean(tail) if tail else None,
            "acceptance_length": self.spec_total.acceptance_length, "acceptance_rate": self.spec_total.acceptance_rate,
            "rollout_tokens_per_s": sum(r["rollout_tokens"] for r in self.history) / max(generation, 1e-9),
            "timing": self.timer.total, "seconds": sum(self.timer.total.values()),
            "proposer": self.config.backend.proposer, "backend": self.config.backend.backend,
            "run_dir": str(self.run_dir),
        }

"""The trainer side of the pipeline: train on scored groups, checkpoint, record.

A `Learner` owns the policy (and draft) trainers, the task, the run folder and its
telemetry. The pipeline (`specrl.pipeline.loop`) decides where the groups come from and
when; the learner turns a batch of groups into one optimiser step and one metrics record:

    groups [P] --group advantages--> PolicyTrainer.step (GRPO; the draft adapts on the same
    micro-batches) --> checkpoint when due --> metrics.jsonl record (+ TensorBoard)
"""
from __future__ import annotations

import itertools
import json
import os
import operator
import shutil
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Callable

import torch

from specrl.atomic import write_text_atomically
from specrl.backends import ModelSet, resolve_models
from specrl.device import resolve_device
from specrl.models.checkpoint import check_finite, load_tokenizer
from specrl.pipeline.config import TrainConfig, config_to_dict
from specrl.pipeline.groups import Group
from specrl.pipeline.ray_session import RaySession
from specrl.pipeline.resume import latest_checkpoint, restore_training_state, save_checkpoint
from specrl.pipeline.trainer_group import TrainerGroup
from specrl.rl.advantages import group_advantages
from specrl.rl.grpo import overlong_penalty
from specrl.rl.adaptation import draft_trainer
from specrl.rl.head_adaptation import HeadTrainer
from specrl.rl.trainer import PolicyTrainer
from specrl.speculation.acceptance import expected_tokens
from specrl.tasks import make_task
from specrl.telemetry.sinks import MetricsSink, truncate_metrics
from specrl.telemetry.spec_stats import SpecStats
from specrl.telemetry.timers import StageTimer


HEAD_ACCEPTANCE_ROLLOUTS = 64  # held-out rollouts the adapted and frozen heads are scored on (two trainer passes)


def make_policy_trainer(config: TrainConfig, policy_dir: str, pad_id: int) -> PolicyTrainer | TrainerGroup:
    """One in-process `PolicyTrainer`, or `run.trainer_ranks` FSDP ranks on Ray (`TrainerGroup`)."""
    run, args = config.run, (policy_dir, config.grpo, config.optim, config.rollout.sampling(), pad_id)
    if run.trainer_ranks == 1:
        return PolicyTrainer(*args, device=run.device)
    threads = max(1, (run.threads or os.cpu_count() or 1) // run.trainer_ranks)
    return TrainerGroup(run.trainer_ranks, *args, device=run.device, threads_per_rank=threads)


def sampling_seed(run_seed: int, step: int) -> int:
    return run_seed * 1_000_003 + step


def starting_point(config: TrainConfig, resume: bool) -> tuple[Path | None, ModelSet]:
    """(checkpoint to resume or None, the run's models): the configured (or registered) models, or the checkpoint's
    policy and adapted draft. The one place a run's model set is decided; everything after is handed it.

    Checks the run folder first, before any model or engine is loaded: a fresh run may not drop an
    earlier run's checkpoints unless run.overwrite is set, and a resume needs a checkpoint."""
    resolve_device(config.run.device)
    run_dir = Path(config.run.run_dir)
    checkpoint = latest_checkpoint(run_dir)
    if resume and checkpoint is None:
        raise ValueError(f"--resume {run_dir}: no checkpoint to resume from (checkpoints/ is empty)")
    if not resume and checkpoint is not None and not config.run.overwrite:
        raise ValueError(f"{run_dir} already holds a run's checkpoints: continue it with --resume "
                         f"{run_dir}, pick another run.run_dir, or set run.overwrite=true to replace it")
    checkpoint = checkpoint if resume else None
    configured = resolve_models(config.backend)
    if checkpoint is None:
        return None, configured
    saved = checkpoint / "draft"
    draft, draft_source = (saved, f"checkpoint {checkpoint.name}") if saved.is_dir() else \
        (configured.draft, configured.draft_source)
    return checkpoint, ModelSet(checkpoint / "policy", draft, f"checkpoint {checkpoint.name}", draft_source)


class Learner:
    """Policy (+ draft) trainers, task, run folder and telemetry of one run."""

    def __init__(self, config: TrainConfig, checkpoint: Path | None, models: ModelSet):
        self.config = config
        self.run_dir = Path(config.run.run_dir)
        self.models = models
        policy_dir, draft_dir = self.policy_dir, self.draft_dir
        self.tokenizer = load_tokenizer(policy_dir)
        # several trainer ranks are Ray actors: join the pipeline's Ray (or start one on this machine)
        self.trainer_ray = RaySession(config.pipeline.ray_address) if config.run.trainer_ranks > 1 else None
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.trainer = make_policy_trainer(config, policy_dir, pad)
        self.draft = None  # the draft's online trainer (`rl.adaptation`), by its kind's recipe
        self.frozen_head = None  # the starting head, for comparison (loaded at the first evaluation)
        if config.draft.enabled and draft_dir is not None:
            self.draft = draft_trainer(config.backend.draft_kind, draft_dir, self.trainer.model, policy_dir,
                                       config.draft, config.rollout.sampling())
        self.task = make_task(config.task)
        self.start_step, self.start_version, self.resumed_pipeline = 0, 0, {}
        if checkpoint is not None:
            state, optimizer, draft_optimizer = restore_training_state(checkpoint, with_draft=self.draft is not None)
            self.trainer.load_optimizer_state(optimizer)
            if self.draft is not None:
                self.draft.optimizer.load_state_dict(draft_optimizer)
            self.start_step = state["step"]
            self.start_version = state["version"]
            self.resumed_pipeline = state.get("pipeline", {})
            truncate_metrics(self.run_dir, self.start_step)
        else:
            self._claim_run_dir()
        write_text_atomically(self.run_dir / "config.json", json.dumps(config_to_dict(config), indent=2))
        self.sink = MetricsSink(self.run_dir, tensorboard=config.run.tensorboard)
        self.timer = StageTimer()
        self.spec_total = SpecStats()
        self.generated_tokens, self.generation_seconds = 0, 0.0
        self.staleness_total: Counter[int] = Counter()  # trained groups by staleness (their oldest token's)
        self.token_staleness_total: Counter[int] = Counter()  # trained tokens by their own staleness
        self.skipped_total: Counter[str] = Counter()  # optimiser steps skipped for a non-finite loss or gradient
        self.history: list[dict] = []
        self.reported_reward_errors: set[str] = set()  # rewards whose first failure has been printed

    @property
    def policy_dir(self) -> str:
        return str(self.models.policy)

    @property
    def draft_dir(self) -> str | None:
        return str(self.models.draft) if self.models.draft else None

    def _claim_run_dir(self) -> None:
        """Start a fresh run folder (`starting_point` has checked that replacing its checkpoints is allowed)."""
        if (self.run_dir / "checkpoints").exists():
            shutil.rmtree(self.run_dir / "checkpoints")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "metrics.jsonl").unlink(missing_ok=True)

    def head_acceptance(self, completions: list) -> dict:
        """When a head adapts online: per depth, the expected acceptance sum_x min(p, q) of the adapted
        head and of the head this process started from (frozen: the registered head on a fresh run, the
        checkpoint's on a resume), against the current policy on the first `HEAD_ACCEPTANCE_ROLLOUTS` of
        `completions` (held-out rollouts, the same ones at every evaluation), and the acceptance length each
        implies (1 + a1 + a1 a2 + ...)."""
        kind = self.config.backend.draft_kind
        if not isinstance(self.draft, HeadTrainer) or not completions:
            return {}
        completions = completions[:HEAD_ACCEPTANCE_ROLLOUTS]
        if self.frozen_head is None:
            self.frozen_head = draft_trainer(kind, self.draft_dir, self.trainer.model, self.policy_dir,
                                             self.config.draft, self.config.rollout.sampling())
        out = {}
        for name, head in (("adapted", self.draft), ("frozen", self.frozen_head)):
            per_depth = self.trainer.head_acceptance(head, [c.prompt_ids for c in completions],
                                                     [c.token_ids for c in completions])
            prefix = list(itertools.accumulate(per_depth, operator.mul))  # P(drafts 1..j all accepted)
            out[f"head_acceptance_{name}"] = [round(a, 4) for a in per_depth]
            out[f"head_acceptance_length_{name}"] = round(expected_tokens(len(prefix), prefix), 4)
        return out

    def weights(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
        """(policy, draft or None) state dicts under Hugging Face names, for weight sync and checkpoints.
        Weights holding NaN or infinity are an error here, before anything is published or written
        (`finite_step` skips the steps that would make them; this is the last line)."""
        policy, draft = self.trainer.state_dict(), self.draft.state_dict() if self.draft else None
        check_finite(policy, "the trained policy's weights (not published, not checkpointed)")
        if draft is not None:
            check_finite(draft, "the adapted draft's weights (not published, not checkpointed)")
        return policy, draft

    def train(self, step: int, groups: list[Group], decoupled: bool = False) -> dict:
        """One optimiser step on `groups` (timed as `training` / `draft_training`); returns the train stats.
        `grpo.overlong`: `penalty` adds DAPO's soft length penalty to the rewards before the advantages;
        `filter` leaves the responses cut at rollout.max_tokens out of the loss (and of its token count),
        after the advantages are computed over whole groups."""
        cfg, timer = self.config, self.timer
        completions = [c for g in groups for c in g.completions]
        prompts = [g.prompt_ids for g in groups for _ in g.completions]
        rewards = torch.tensor([r for g in groups for r in g.rewards])
        extra = {}
        if cfg.grpo.overlong == "penalty":
            penalties = torch.tensor([overlong_penalty(len(c.token_ids), cfg.rollout.max_tokens, cfg.grpo.overlong_buffer)
                                      for c in completions])
            rewards = rewards + penalties
            extra["overlong_penalty_mean"] = float(penalties.mean())
        advantages = group_advantages(rewards, cfg.grpo.group_size, scale=cfg.grpo.scale_advantages)
        if cfg.grpo.overlong == "filter":
            kept = [i for i, c in enumerate(completions) if c.finish_reason != "length"]
            extra["overlong_filtered"] = len(completions) - len(kept)
            if not kept:
                return {**extra, "policy_step_skipped": 0, "no_sequence_left": 1}
            completions, prompts, advantages = ([completions[i] for i in kept], [prompts[i] for i in kept],
                                                advantages[kept])
        adapt = self.draft is not None and step % cfg.draft.every == 0
        num_tokens = sum(len(c.token_ids) for c in completions)
        draft_seconds = StageTimer()

        def on_micro_batch(batch, logits, hidden):
            with draft_seconds.stage("draft_training"):
                self.draft.accumulate(batch, logits, hidden, num_tokens)

        with timer.stage("training"):
            stats = self.trainer.step(prompts, [c.token_ids for c in completions], [c.logprobs for c in completions],
                                      advantages, on_micro_batch=on_micro_batch if adapt else None,
                                      decoupled=decoupled, hidden_layers=self.draft.hidden_layers if adapt else ())
        timer.reassign("training", "draft_training", draft_seconds.total.get("draft_training", 0.0))
        if adapt:
            with timer.stage("draft_training"):
                stats.update(self.draft.step())
        return {**stats, **extra}

    def checkpoint_if_due(self, step: int, pipeline_state: Callable[[], dict]) -> None:
        """Save when due, with the pipeline's `pipeline_state()` (JSON-ready: what it needs to continue).
        Its time is counted in the next step's record (the record is written first)."""
        every = self.config.run.checkpoint_every
        if step == self.config.run.steps or (every and step % every == 0):
            with self.timer.stage("checkpoint"):
                self.weights()  # refuses non-finite weights before a file is written
                save_checkpoint(self.run_dir, step, step, self.save_policy, self.trainer.optimizer_state(),
                                self.draft.save if self.draft else None,
                                self.draft.optimizer.state_dict() if self.draft else None, pipeline=pipeline_state())

    def save_policy(self, folder: Path) -> None:
        self.trainer.save_policy(folder)
        self.tokenizer.save_pretrained(folder)

    def close(self) -> None:
        """Stop the trainer ranks (and the Ray this learner started for them), when there are several."""
        if isinstance(self.trainer, TrainerGroup):
            self.trainer.close()
        if self.trainer_ray is not None:
            self.trainer_ray.close()

    def note_rollouts(self, spec: SpecStats, tokens: int, seconds: float) -> None:
        """Count generated tokens and generation seconds (whether or not their groups are trained on)."""
        self.spec_total.merge(spec)
        self.generated_tokens += tokens
        self.generation_seconds += seconds

    def record(self, step: int, groups: list[Group], stats: dict, spec: SpecStats, k_histogram: dict,
               tokens_per_s: float, extra: dict | None = None) -> dict:
        """Write one step's metrics record (timing = the stage timer's lap) and keep it in `history`."""
        rewards = torch.tensor([r for g in groups for r in g.rewards])
        lengths = [len(c.token_ids) for g in groups for c in g.completions]
        staleness = Counter(step - 1 - g.version for g in groups)
        token_staleness = Counter(step - 1 - v for g in groups for c in g.completions for v in c.versions)
        self.staleness_total.update(staleness)
        self.token_staleness_total.update(token_staleness)
        self.skipped_total.update({part: stats.get(f"{part}_step_skipped", 0) for part in ("policy", "draft")})
        record = {
            "step": step, "policy_version": min(g.version for g in groups),
            "data_positions": [g.index for g in groups],
            "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std(unbiased=False)),
            **self._reward_parts(step, groups),
            "response_length_mean": statistics.mean(lengths), "response_length_max": max(lengths),
            "rollout_tokens": sum(lengths), "rollout_tokens_per_s": tokens_per_s,
            "spec": spec.as_dict(), "k_histogram": {str(k): v for k, v in k_histogram.items()},
            "staleness_histogram": {str(k): v for k, v in sorted(staleness.items())},
            "token_staleness_histogram": {str(k): v for k, v in sorted(token_staleness.items())},
            "train": stats, "skipped_steps_total": dict(self.skipped_total), **(extra or {}),
            "timing": self.timer.lap(),
        }
        record["step_seconds"] = sum(v for stage, v in record["timing"].items() if stage != "eval")
        record["tokens_per_s_by_stage"] = {stage: record["rollout_tokens"] / seconds
                                           for stage, seconds in record["timing"].items() if seconds > 0}
        self.sink.write(step, record)
        self.history.append(record)
        return record

    def _reward_parts(self, step: int, groups: list[Group]) -> dict:
        """Each named reward's mean ("rewards"), and the samples where a reward function raised, counted by
        reward ("reward_errors"); the first failure of each reward in this process is printed."""
        names = groups[0].reward_parts.keys()
        parts = {name: statistics.fmean(v for g in groups for v in g.reward_parts[name]) for name in names}
        errors = Counter(name for g in groups for name, _ in g.reward_errors)
        for name, reason in (failure for g in groups for failure in g.reward_errors):
            if name not in self.reported_reward_errors:
                self.reported_reward_errors.add(name)
                print(f"step {step}: the reward {name} raised {reason}; the sample scores 0 there (failures are "
                      "counted in metrics.jsonl as reward_errors)", file=sys.stderr, flush=True)
        return {"rewards": parts, "reward_errors": dict(errors)} if errors else {"rewards": parts}

    def _eval_summary(self) -> dict:
        """The first and last held-out pass@1 of this process's records (with their intervals)."""
        evals = [r[key] for r in self.history for key in ("eval_start", "eval") if key in r]
        if not evals:
            return {}
        first, last = evals[0], evals[-1]
        return {"eval_pass@1_first": first["pass@1"], "eval_pass@1_first_ci95": first["pass@1_ci95"],
                "eval_pass@1_last": last["pass@1"], "eval_pass@1_last_ci95": last["pass@1_ci95"],
                "eval_versions": [first["policy_version"], last["policy_version"]]}

    def _adaptation_summary(self) -> dict:
        """The online draft/head adaptation's loss and expected acceptance, first and last adapted step."""
        adapted = [r["train"] for r in self.history if "draft_loss" in r["train"]]
        if not adapted:
            return {}
        return {"draft_loss_first": adapted[0]["draft_loss"], "draft_loss_last": adapted[-1]["draft_loss"],
                "draft_expected_acceptance_first": adapted[0]["draft_expected_acceptance"],
                "draft_expected_acceptance_last": adapted[-1]["draft_expected_acceptance"]}

    def summary(self) -> dict:
        rewards = [r["reward_mean"] for r in self.history]
        tail = rewards[-max(1, len(rewards) // 5):]
        return {
            "steps": self.config.run.steps, "steps_run": len(self.history), "resumed_from": self.start_step,
            "reward_first": rewards[0] if rewards else None, "reward_last": rewards[-1] if rewards else None,
            "reward_last_fifth_mean": statistics.mean(tail) if tail else None,
            **self._eval_summary(), **self._adaptation_summary(),
            "acceptance_length": self.spec_total.acceptance_length, "acceptance_rate": self.spec_total.acceptance_rate,
            "rollout_tokens_per_s": self.generated_tokens / max(self.generation_seconds, 1e-9),
            "rollout_tokens": self.generated_tokens, "rollout_generation_s": self.generation_seconds,
            "timing": self.timer.total, "seconds": sum(self.timer.total.values()),
            "proposer": self.config.backend.proposer, "backend": self.config.backend.backend,
            "pipeline": self.config.pipeline.mode, "trainer_ranks": self.config.run.trainer_ranks,
            "device": self.config.run.device, "precision": self.config.optim.precision,
            "staleness_histogram": {str(k): v for k, v in sorted(self.staleness_total.items())},
            "max_staleness_seen": max(self.staleness_total, default=0),
            "skipped_steps_total": dict(self.skipped_total),
            "token_staleness_mean": (sum(k * v for k, v in self.token_staleness_total.items())
                                     / max(sum(self.token_staleness_total.values()), 1)),
            "run_dir": str(self.run_dir),
        }

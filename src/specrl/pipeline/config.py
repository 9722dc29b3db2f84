"""The training run's config: small per-component configs, presets, validated at load.

A run is described by `TrainConfig`, built from a preset, then a JSON file, then
`key=value` overrides with dotted keys (`grpo.group_size=4`, `backend.proposer=ngram`).
An unknown key or a bad value fails at load with a message naming it.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from specrl.backends.base import BackendConfig
from specrl.backends.vllm.options import VLLMOptions
from specrl.pipeline.evaluation import EvalConfig
from specrl.rl.draft_adaptation import DraftAdaptConfig
from specrl.rl.grpo import GRPOConfig
from specrl.rl.trainer import OptimConfig
from specrl.sampling import SamplingParams
from specrl.tasks import TaskConfig
from specrl.tasks.presets import model_task
from specrl.validation import build, check_fields, parse_overrides, within


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling for rollouts (the engine is chosen by `backend`)."""

    SECTION: ClassVar[str] = "rollout"

    temperature: float = within(1.0, "(0, inf)")  # > 0: RL needs sampled rollouts
    top_p: float = within(1.0, "(0, 1]")  # nucleus truncation; the trainer scores tokens under the same one
    top_k: int = within(0, "[0, inf)")  # keep the k most likely tokens (0 = all); the trainer applies it too
    max_tokens: int = within(32, "[1, inf)")  # response cap, in tokens
    prompts_per_step: int = within(8, "[1, inf)")  # distinct prompts per step; each sampled grpo.group_size times
    # draw each token from noise keyed by (run.seed, request, sample, position): a run samples the same rollouts
    # with any backend.proposer or none, at some cost in acceptance (docs/drafters.md); the embedded backend only
    drafter_invariant: bool = False

    def __post_init__(self):
        check_fields(self)

    def sampling(self, n: int = 1, seed: int | None = None) -> SamplingParams:
        """The engine's sampling parameters for rollouts of n samples per prompt."""
        return SamplingParams(n=n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_tokens=self.max_tokens, seed=seed, drafter_invariant=self.drafter_invariant)


@dataclass(frozen=True)
class RunConfig:
    """How long, where, and how often to save."""

    SECTION: ClassVar[str] = "run"

    steps: int = within(50, "[1, inf)")  # GRPO steps (optimiser steps) of the run
    seed: int = 0  # every random choice (problems, sampling) is a function of it
    run_dir: str = "runs/latest"  # config.json, metrics.jsonl, tensorboard/, checkpoints/ and plots/ go here
    checkpoint_every: int = within(10, "[0, inf)")  # steps between checkpoints (and always at the end); 0 = only at the end
    threads: int | None = within(None, "[1, inf)")  # torch CPU threads; None = all cores
    # where the policy trainer runs (cuda without a CUDA device is an error, never a CPU fallback); rollouts run
    # where their backend runs: the embedded engine on the CPU (its fast path is a CPU kernel), vLLM on its device
    device: Literal["cpu", "cuda"] = "cpu"
    # the policy trainer as this many FSDP2 ranks on Ray (`pipeline.trainer_group`), each with threads / ranks
    # torch threads; the rollout batch must split evenly over them
    trainer_ranks: int = within(1, "[1, inf)")
    tensorboard: bool = True  # also write metrics to run_dir/tensorboard
    overwrite: bool = False  # a fresh run may replace an earlier run's checkpoints and metrics in run_dir

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class PipelineConfig:
    """Sync (in-process rollouts) or async (Ray rollout actors) GRPO: one loop, see `specrl.pipeline.loop`."""

    SECTION: ClassVar[str] = "pipeline"

    mode: Literal["sync", "async"] = "sync"  # sync: generate -> train -> sync in turn | async: Ray rollout actors run alongside the trainer
    max_staleness: int = within(1, "[0, inf)")  # async: a group is trained on at most this many versions after its weights (0 = sync)
    num_actors: int = within(1, "[1, inf)")  # async: Ray rollout actors, each with its own backend
    prompts_per_request: int | None = within(None, "[1, inf)")  # async: prompts per actor call; None = rollout.prompts_per_step
    requests_per_actor: int = within(2, "[1, inf)")  # async: calls queued on one actor (1 running + the rest waiting)
    buffer_size: int | None = None  # async: most groups buffered + in flight; None = (max_staleness + 1) * prompts_per_step (the most)
    actor_threads: int = within(1, "[1, inf)")  # async: torch threads (and Ray CPUs) per rollout actor
    ray_address: str | None = None  # async: join this Ray cluster; None = start a local Ray on this machine's cores
    # async: when a rollout actor adopts newly published weights. request: at the start of each request (a
    # request runs on one version) | step: also in flight, between engine steps of a running request (the
    # live rows' cache is recomputed; each token carries the version that sampled it; embedded backend only)
    weight_updates: Literal["request", "step"] = "request"

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class TrainConfig:
    run: RunConfig = field(default_factory=RunConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    draft: DraftAdaptConfig = field(default_factory=DraftAdaptConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    vllm: VLLMOptions = field(default_factory=VLLMOptions)  # how the vllm backend runs (backend.backend=vllm)

    def __post_init__(self):
        ranks, rows = self.run.trainer_ranks, self.rollout.prompts_per_step * self.grpo.group_size
        if rows % ranks:
            raise ValueError(f"run.trainer_ranks ({ranks}) must divide the batch of rollout.prompts_per_step x "
                             f"grpo.group_size = {rows} sequences")
        if ranks > 1 and self.draft.enabled and self.backend.draft_kind is not None:
            raise ValueError(f"draft.enabled: online adaptation of the {self.backend.draft_kind} draft trains on the "
                             "policy's activations in one process; set run.trainer_ranks=1, or draft.enabled=false")
        if self.pipeline.weight_updates == "step" and self.pipeline.mode != "async":
            raise ValueError("pipeline.weight_updates=step: in-flight weight updates are for pipeline.mode=async: the "
                             "sync pipeline publishes a version only between requests (staleness 0), so a running request "
                             "never has a newer version to adopt")
        if self.pipeline.weight_updates == "step" and self.backend.backend != "embedded":
            raise ValueError(f"pipeline.weight_updates=step needs backend.backend=embedded: the "
                             f"{self.backend.backend} backend takes new weights between calls only")
        if self.rollout.drafter_invariant and self.backend.backend != "embedded":
            raise ValueError(f"rollout.drafter_invariant needs backend.backend=embedded: the {self.backend.backend} "
                             "backend draws with its own sampler, whose tokens depend on the drafts")
        if self.grpo.overlong == "filter" and ranks > 1:
            raise ValueError("grpo.overlong=filter leaves a varying number of sequences, which does not split over "
                             f"run.trainer_ranks ({ranks}); use grpo.overlong=penalty or one trainer rank")
        if self.grpo.overlong == "penalty" and self.grpo.overlong_buffer >= self.rollout.max_tokens:
            raise ValueError(f"grpo.overlong_buffer ({self.grpo.overlong_buffer}) must be below rollout.max_tokens "
                             f"({self.rollout.max_tokens}): the penalty ramps over the last overlong_buffer tokens")
        P, request = self.rollout.prompts_per_step, self.pipeline.prompts_per_request
        if request is not None and (request > P or P % request):
            raise ValueError(f"pipeline.prompts_per_request ({request}) must divide rollout.prompts_per_step ({P})")
        window = (self.pipeline.max_staleness + 1) * P
        if self.pipeline.buffer_size is not None and not P <= self.pipeline.buffer_size <= window:
            raise ValueError(f"pipeline.buffer_size ({self.pipeline.buffer_size}) must be between one step's groups "
                             f"(rollout.prompts_per_step = {P}) and the staleness window "
                             f"((pipeline.max_staleness + 1) * prompts_per_step = {window})")


PRESETS: dict[str, dict] = {
    "tiny": {
        "run": {"steps": 400, "run_dir": "runs/tiny", "checkpoint_every": 100, "threads": 1},
        "task": model_task("tiny"),
        "backend": {"model": "tiny", "proposer": "ngram"},
        "rollout": {"max_tokens": 16, "prompts_per_step": 16},
        "grpo": {"group_size": 8},
        "optim": {"lr": 2e-4},
    },
    # SmolLM2-135M-Instruct on two-term sums (reasoning-gym chain_sum): held-out pass@1 ~0.14 at
    # temperature 0.7 before training; the shipped EAGLE-3 head drafts (adaptive K, trees) and adapts online
    "smollm2-135m": {
        "run": {"steps": 40, "run_dir": "runs/smollm2-135m", "checkpoint_every": 10},
        "task": model_task("smollm2-135m"),
        "backend": {"model": "smollm2-135m", "proposer": "eagle3"},
        "rollout": {"max_tokens": 128, "prompts_per_step": 4, "temperature": 0.7},
        "grpo": {"group_size": 8},
        "optim": {"lr": 1e-5},
        "draft": {"enabled": True, "lr": 1e-4},
        "eval": {"every": 10, "prompts": 128, "temperature": 0.7},
    },
}


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_config(preset: str | None = None, file: str | None = None, overrides: list[str] = ()) -> TrainConfig:
    """preset, then file (JSON), then `a.b=value` overrides; validated once at the end."""
    data: dict = {}
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        data = _merge(data, PRESETS[preset])
    if file is not None:
        try:
            data = _merge(data, json.loads(Path(file).read_text()))
        except json.JSONDecodeError as err:
            raise ValueError(f"config file {file}: not valid JSON ({err})") from err
    return build(TrainConfig, _merge(data, parse_overrides(overrides)), "")


def config_to_dict(config: TrainConfig) -> dict:
    return dataclasses.asdict(config)

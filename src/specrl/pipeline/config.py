"""The training run's config: small per-component configs, presets, validated at load.

A run is described by `TrainConfig`, built from a preset, then a JSON file, then
`key=value` overrides with dotted keys (`grpo.group_size=4`, `rollout.proposer=ngram`).
An unknown key or a bad value fails at load with a message naming it.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path

from specrl.backends.base import BackendConfig
from specrl.rl.draft_adaptation import DraftAdaptConfig
from specrl.rl.grpo import GRPOConfig
from specrl.rl.trainer import OptimConfig


@dataclass(frozen=True)
class TaskSpec:
    """Where prompts and rewards come from."""

    name: str = "arithmetic"  # arithmetic (the tiny model's own task) or a reasoning-gym dataset name
    size: int = 100_000  # problems generated
    seed: int = 0
    difficulty: dict = field(default_factory=dict)  # arithmetic: {"digits": 2, "ops": ["+"]}; reasoning-gym kwargs


@dataclass(frozen=True)
class RolloutSpec:
    """Sampling for rollouts (the engine is chosen by `backend`)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 32
    prompts_per_step: int = 8  # distinct prompts per step; each sampled grpo.group_size times

    def __post_init__(self):
        if self.temperature <= 0:
            raise ValueError(f"rollout.temperature must be > 0 for RL, got {self.temperature}")
        if self.prompts_per_step < 1 or self.max_tokens < 1:
            raise ValueError("rollout.prompts_per_step and rollout.max_tokens must be >= 1")


@dataclass(frozen=True)
class RunSpec:
    """How long, where, and how often to save."""

    steps: int = 50
    seed: int = 0
    run_dir: str = "runs/latest"
    checkpoint_every: int = 10  # steps between checkpoints (and always at the end); 0 = only at the end
    threads: int | None = None  # torch CPU threads; None = all cores
    tensorboard: bool = True
    overwrite: bool = False  # a fresh run may replace an earlier run's checkpoints and metrics in run_dir

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"run.steps must be >= 1, got {self.steps}")
        if self.checkpoint_every < 0:
            raise ValueError(f"run.checkpoint_every must be >= 0, got {self.checkpoint_every}")


@dataclass(frozen=True)
class PipelineSpec:
    """Sync or async (Ray) GRPO; see `specrl.pipeline.asynchronous` for the async design."""

    MODES: typing.ClassVar[tuple[str, ...]] = ("sync", "async")

    mode: str = "sync"  # sync: generate -> train -> sync in turn | async: Ray rollout actors run alongside the trainer
    max_staleness: int = 1  # async: a group is trained on at most this many versions after its weights (0 = sync)
    num_actors: int = 1  # async: Ray rollout actors, each with its own backend
    prompts_per_request: int | None = None  # async: prompts per actor call; None = rollout.prompts_per_step
    requests_per_actor: int = 2  # async: calls queued on one actor (1 running + the rest waiting)
    buffer_size: int | None = None  # async: most groups buffered + in flight; None = (max_staleness + 1) * prompts_per_step (the most)
    actor_threads: int = 1  # async: torch threads (and Ray CPUs) per rollout actor
    ray_address: str | None = None  # async: join this Ray cluster; None = start a local Ray on this machine's cores

    def __post_init__(self):
        if self.mode not in self.MODES:
            raise ValueError(f"pipeline.mode must be one of {self.MODES}, got {self.mode!r}")
        for name in ("num_actors", "requests_per_actor", "actor_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"pipeline.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_staleness < 0:
            raise ValueError(f"pipeline.max_staleness must be >= 0, got {self.max_staleness}")
        if self.prompts_per_request is not None and self.prompts_per_request < 1:
            raise ValueError(f"pipeline.prompts_per_request must be >= 1, got {self.prompts_per_request}")


@dataclass(frozen=True)
class TrainConfig:
    run: RunSpec = field(default_factory=RunSpec)
    task: TaskSpec = field(default_factory=TaskSpec)
    backend: BackendConfig = field(default_factory=BackendConfig)
    rollout: RolloutSpec = field(default_factory=RolloutSpec)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    draft: DraftAdaptConfig = field(default_factory=DraftAdaptConfig)
    pipeline: PipelineSpec = field(default_factory=PipelineSpec)

    def __post_init__(self):
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
        "task": {"name": "arithmetic", "difficulty": {"digits": 2, "ops": ["+"]}},
        "backend": {"model": "tiny", "proposer": "ngram", "num_speculative_tokens": 3},
        "rollout": {"max_tokens": 16, "prompts_per_step": 16},
        "grpo": {"group_size": 8},
        "optim": {"lr": 2e-4, "micro_batch_size": 64},
    },
    "smollm2-135m": {
        "run": {"steps": 20, "run_dir": "runs/smollm2-135m", "checkpoint_every": 5},
        "task": {"name": "chain_sum", "difficulty": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}},
        "backend": {"model": "smollm2-135m", "proposer": "draft", "num_speculative_tokens": 3},
        "rollout": {"max_tokens": 96, "prompts_per_step": 4},
        "grpo": {"group_size": 8},
        "optim": {"lr": 2e-6, "micro_batch_size": 4},
        "draft": {"enabled": False},
    },
}


def _parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


_SCALARS = {int: (int,), float: (int, float), bool: (bool,), str: (str,), dict: (dict,)}


def _check_type(path: str, hint, value) -> None:
    """Scalars must have their field's type (an int is fine where a float is expected)."""
    options = typing.get_args(hint) or (hint,)
    if value is None and type(None) in options:
        return
    accepted = tuple(t for option in options for t in _SCALARS.get(option, ()))
    if accepted and (not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted)):
        raise ValueError(f"config key '{path}' expects {hint}, got {value!r}")


def _build(cls, data: dict, where: str):
    """Recursively build dataclass `cls` from `data`, naming unknown keys and bad values."""
    if not isinstance(data, dict):
        raise ValueError(f"config section '{where or 'root'}' must be a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        prefix = f"{where}." if where else ""
        raise ValueError(f"unknown config key(s) {[prefix + k for k in unknown]}; known in "
                         f"'{where or 'root'}': {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        hint = hints[name]
        path = f"{where}.{name}" if where else name
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value, path)
        else:
            _check_type(path, hint, value)
            kwargs[name] = tuple(value) if isinstance(value, list) and "tuple" in str(hint) else value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ValueError(f"invalid config '{where or 'root'}': {err}") from err


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
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value (e.g. grpo.group_size=4)")
        key, value = item.split("=", 1)
        node = {}
        cursor = node
        parts = key.split(".")
        for part in parts[:-1]:
            cursor[part] = {}
            cursor = cursor[part]
        cursor[parts[-1]] = _parse_value(value)
        data = _merge(data, node)
    return _build(TrainConfig, data, "")


def config_to_dict(config: TrainConfig) -> dict:
    return dataclasses.asdict(config)

"""A task's reward: one or several named rewards, weighted and summed, each recorded on its own.

`task.reward` names them: one name, or a mapping of names to weights (`{"format": 0.2, "math": 1}`
from a config file, or `task.reward='{"math": 1, "my_rewards.py:format": 0.2}'` on the command line).

    task                  the built-in task's own verifier (arithmetic, reasoning-gym)
    exact numeric choice  the verifiers of `specrl.tasks.verifiers`, against the example's answer field
    math
    MODULE:FUNCTION       a user's function `(response: str, example: dict) -> float`, imported once, when
    PATH.py:FUNCTION      the task is made: a module on the import path (the current directory included)
                          or a Python file

Trust model: a user's reward function is the user's own code and runs in the trainer's
process (and in each rollout actor). The model's text is only ever data: it is passed to
the functions as a string, and no built-in verifier runs it.

A reward function that raises on one sample scores 0 there; `Score.error` says which reward and
why, and the pipeline counts these per step. A return that is not a finite number stops the run
with an error naming the function and the sample: it is a bug in the function, not a low score.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import numbers
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from specrl.tasks.verifiers import VERIFIERS, numeric

RewardFn = Callable[[str, dict], float]


@dataclass(frozen=True)
class Score:
    """A response's reward: the weighted sum, each named reward's own value, and the first failure."""

    reward: float
    parts: dict[str, float] = field(default_factory=dict)
    error: tuple[str, str] | None = None  # (reward, "ExceptionType: message") of the first reward function that raised


def _import_function(spec: str) -> RewardFn:
    """`package.module:function` or `path/to/file.py:function` -> the function (its module run once, now)."""
    where, _, name = spec.rpartition(":")
    if not where or not name.isidentifier():
        raise ValueError(f"task.reward {spec!r}: a reward function is written MODULE:FUNCTION or PATH.py:FUNCTION")
    if where.endswith(".py") and not Path(where).is_file():
        raise ValueError(f"task.reward {spec!r}: no file {where}")
    try:
        if where.endswith(".py"):
            module_spec = importlib.util.spec_from_file_location(f"specrl_user_reward_{Path(where).stem}", where)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.append(str(Path.cwd()))
            module = importlib.import_module(where)
    except Exception as err:  # noqa: BLE001 - an import error of the user's module, named with its cause
        raise ValueError(f"task.reward {spec!r}: importing {where} failed: {type(err).__name__}: {err}") from err
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"task.reward {spec!r}: {where} has no function {name!r}")
    try:
        inspect.signature(function).bind("response", {})
    except TypeError:
        raise ValueError(f"task.reward {spec!r}: the function must take (response: str, example: dict); its "
                         f"signature is {name}{inspect.signature(function)}") from None
    except ValueError:  # a builtin without a signature: it is called as it is
        pass
    return function


def absolute_reward_files(reward: str | dict | None) -> str | dict | None:
    """`task.reward` with each PATH.py:FUNCTION's path made absolute (against the current directory), so a run's
    saved config, its rollout actors and `specrl eval RUN_DIR` find the file from anywhere."""
    def absolute(name: str) -> str:
        where, _, function = name.rpartition(":")
        return f"{Path(where).absolute()}:{function}" if where.endswith(".py") else name

    if isinstance(reward, str):
        return absolute(reward)
    if isinstance(reward, dict):
        return {absolute(name): weight for name, weight in reward.items()}
    return reward


def short_name(name: str) -> str:
    """How a reward is named in scores and logs: a file's function by the file's name (`reward.py:tagged`)."""
    where, _, function = name.rpartition(":")
    return f"{Path(where).name}:{function}" if where.endswith(".py") else name


def reward_weights(reward: str | dict | None, default: str) -> dict[str, float]:
    """`task.reward` as {name: weight} (None: the task's default reward, weight 1)."""
    if reward is None:
        return {default: 1.0}
    if isinstance(reward, str):
        return {reward: 1.0}
    if not reward:
        raise ValueError("task.reward is an empty mapping: name at least one reward")
    for name, weight in reward.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"task.reward: the weight of {name!r} must be a finite number, got {weight!r}")
    return {name: float(weight) for name, weight in reward.items()}


class Rewards:
    """Named rewards with weights -> `Score`. `own` is the task's own verifier (the name `task`), if it has one;
    `answer_field` is where the built-in verifiers find the gold answer in an example."""

    def __init__(self, weights: dict[str, float], own: RewardFn | None, answer_field: str, tolerance: float):
        shown = {name: short_name(name) for name in weights}
        if len(set(shown.values())) < len(shown):  # two files of one name: show the paths
            shown = {name: name for name in weights}
        self.weights = {shown[name]: weight for name, weight in weights.items()}  # by the names the logs show
        self.functions: dict[str, RewardFn] = {}
        for name in weights:
            if name == "task":
                if own is None:
                    raise ValueError("task.reward 'task': this task has no verifier of its own; name one of "
                                     f"{sorted(VERIFIERS)} or a function MODULE:FUNCTION")
                self.functions[name] = own
            elif name in VERIFIERS:
                verifier = VERIFIERS[name]
                self.functions[name] = self._gold_reader(name, verifier, answer_field, tolerance)
            elif ":" in name:
                self.functions[shown[name]] = _import_function(name)
            else:
                raise ValueError(f"task.reward: unknown verifier {name!r}; the built-in ones are "
                                 f"{sorted(VERIFIERS)} ('task' for the task's own), or name a function as "
                                 "MODULE:FUNCTION or PATH.py:FUNCTION")
        self.user_functions = {shown[name] for name in weights if ":" in name}
        self.reads_answer = {name for name in weights if name in VERIFIERS}  # they need the example's answer

    @staticmethod
    def _gold_reader(name: str, verifier, answer_field: str, tolerance: float) -> RewardFn:
        def reward(response: str, example: dict) -> float:
            if answer_field not in example:
                raise KeyError(f"the example has no answer field {answer_field!r}")
            gold = example[answer_field]
            return numeric(response, gold, tolerance) if verifier is numeric else verifier(response, gold)
        reward.__name__ = name
        return reward

    def __call__(self, response: str, example: dict) -> Score:
        parts, error = {}, None
        for name, function in self.functions.items():
            try:
                value = function(response, example)
            except Exception as err:  # noqa: BLE001 - one sample's failure scores 0 and is counted
                if name not in self.user_functions:
                    raise
                parts[name] = 0.0
                error = error or (name, f"{type(err).__name__}: {err}")
                continue
            if not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"task.reward {name!r} returned {value!r}, not a finite number, for the response "
                                 f"{response[:200]!r} to the example {_preview(example)}")
            parts[name] = float(value)
        total = sum(self.weights[name] * value for name, value in parts.items())
        return Score(total, parts, error)


def _preview(example: dict) -> str:
    text = repr(example)
    return text if len(text) <= 300 else text[:300] + "...}"

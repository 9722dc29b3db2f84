"""What a task is: problems, the prompt each renders to, and a verifier that scores responses.

    len(task), task[i]          problems, a pure function of the config (index wraps around)
    task.render(problem, tok)   the prompt text the policy sees
    task.reward(text, problem)  1.0 or 0.0 from the task's own verifier

`make_task` builds the task a `TaskConfig` names: `arithmetic` (tiny's task) or a
reasoning-gym dataset.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from specrl.validation import check_fields, within


@dataclass(frozen=True)
class TaskConfig:
    """Where prompts and rewards come from."""

    SECTION: ClassVar[str] = "task"
    REMOVED: ClassVar[dict[str, str]] = {
        "isolated_scoring": "its worker ran the model's answer as code; every dataset it served is now scored "
                            "by a parser that never runs the answer, or refused (docs/tasks.md)"}

    name: str = "arithmetic"  # arithmetic (the tiny model's own task) or a reasoning-gym dataset name
    size: int = within(100_000, "[1, inf)")  # problems generated (procedurally, offline)
    seed: int = 0  # generation seed
    difficulty: dict = field(default_factory=dict)  # arithmetic: {"digits": 2, "ops": ["+"]}; reasoning-gym kwargs

    def __post_init__(self):
        check_fields(self)


class Task(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, index: int): ...

    def render(self, problem, tokenizer) -> str: ...

    def reward(self, response: str, problem) -> float: ...


def render_prompts(task: Task, tokenizer, first: int, count: int) -> tuple[list, list[str]]:
    """Problems task[first : first + count] and their prompt texts."""
    problems = [task[first + i] for i in range(count)]
    return problems, [task.render(p, tokenizer) for p in problems]


def make_task(config: TaskConfig) -> Task:
    """`arithmetic` or any reasoning-gym dataset name."""
    if config.name == "arithmetic":
        from specrl.tasks.arithmetic import ArithmeticTask

        return ArithmeticTask(config)
    from specrl.tasks.gym import ReasoningGymTask

    return ReasoningGymTask(config)

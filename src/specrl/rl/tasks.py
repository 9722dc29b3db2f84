"""Verifiable reasoning tasks from reasoning-gym, rendered as prompts and scored exactly.

A task yields `Problem`s; `render` turns one into prompt text (through the model's
chat template when the tokenizer has one); `reward` scores a response with the
task's own scorer: 1.0 when the extracted answer scores >= 1, else 0.0.
The answer is taken from the last `<answer>...</answer>` in the response, or, when
there is none, the last number in it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import reasoning_gym

INSTRUCTION = "Solve the problem. Give only the final answer inside <answer></answer>."
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class TaskConfig:
    """Which reasoning-gym dataset, how many problems, and its difficulty settings."""

    name: str = "chain_sum"  # any reasoning-gym dataset name (chain_sum, basic_arithmetic, gcd, gsm_symbolic, ...)
    size: int = 1000  # problems generated (procedurally, offline)
    seed: int = 0  # generation seed
    difficulty: dict = field(default_factory=dict)  # forwarded to reasoning_gym.create_dataset, e.g. {"max_terms": 2}


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str
    entry: dict  # the dataset's own record, passed back to its scorer


def extract_answer(response: str) -> str | None:
    tagged = _ANSWER_TAG.findall(response)
    if tagged:
        return tagged[-1].strip()
    numbers = _NUMBER.findall(response)
    return numbers[-1] if numbers else None


class ReasoningGymTask:
    def __init__(self, config: TaskConfig = TaskConfig()):
        try:
            self.dataset = reasoning_gym.create_dataset(config.name, size=config.size, seed=config.seed,
                                                        **config.difficulty)
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"task {config.name!r} with difficulty {config.difficulty}: {err}") from err
        self.config = config

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Problem:
        entry = self.dataset[index % len(self.dataset)]
        return Problem(entry["question"], str(entry["answer"]), entry)

    def render(self, problem: Problem, tokenizer) -> str:
        content = f"{problem.question}\n{INSTRUCTION}"
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                 add_generation_prompt=True)
        return content + "\n"

    def reward(self, response: str, problem: Problem) -> float:
        answer = extract_answer(response)
        if answer is None:
            return 0.0
        return 1.0 if self.dataset.score_answer(answer, problem.entry) >= 1.0 else 0.0


class ArithmeticTask:
    """The `tiny` model's own arithmetic task (see specrl.models.arithmetic), same interface."""

    def __init__(self, size: int, seed: int, difficulty: dict):
        from specrl.models.arithmetic import ArithmeticConfig, generate_problems

        try:
            config = ArithmeticConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in difficulty.items()})
        except TypeError as err:
            raise ValueError(f"task.difficulty for arithmetic: {err}") from err
        self.problems = generate_problems(config, size, seed, split="train")

    def __len__(self) -> int:
        return len(self.problems)

    def __getitem__(self, index: int):
        return self.problems[index % len(self.problems)]

    def render(self, problem, tokenizer) -> str:
        return problem.prompt

    def reward(self, response: str, problem) -> float:
        from specrl.models.arithmetic import score

        return score(problem, response)


def make_task(name: str, size: int, seed: int, difficulty: dict):
    """`arithmetic` or any reasoning-gym dataset name."""
    if name == "arithmetic":
        return ArithmeticTask(size, seed, difficulty)
    return ReasoningGymTask(TaskConfig(name=name, size=size, seed=seed, difficulty=difficulty))

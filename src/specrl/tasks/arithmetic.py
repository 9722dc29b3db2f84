"""The arithmetic task the `tiny` model is trained on: problems, prompts, answers, reward.

Format ("copy the problem, then answer"):

    prompt    Q:12+34\\nA:
    response  12+34=46<eos>

The response first repeats the problem, which a draft model can predict almost
perfectly, then gives the answer, which it often cannot; so speculative acceptance
is visibly high on the copy and low on the answer, and RL has room to improve the
answer's accuracy.

Problems are a pure function of (config, seed, index). A fixed held-out split
(`is_held_out`) is never used for training, so accuracy on it measures
generalisation rather than memorisation.
"""
from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from specrl.tasks.task import HeldOutTail, TaskConfig
from specrl.validation import check_fields, within

PROMPT_PREFIX = "Q:"
PROMPT_SUFFIX = "\nA:"
OPS = ("+", "-", "*")

# Every character a prompt or response of this task can contain (the tiny tokenizer's alphabet).
ALPHABET = "0123456789+-*=QA:\n"


@dataclass(frozen=True)
class ArithmeticConfig:
    """Which problems to generate.

    digits: operands are drawn uniformly from 0 .. 10**digits - 1.
    ops: the operators to draw from, a subset of "+", "-", "*".
    held_out_every: one operand pair in this many (by a fixed hash) is held out of training.
    """

    digits: int = within(2, "[1, 6]")
    ops: tuple[str, ...] = ("+",)
    held_out_every: int = within(10, "[2, inf)")

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.ops or any(op not in OPS for op in self.ops):
            raise ValueError(f"ArithmeticConfig.ops must be a non-empty subset of {OPS}, got {self.ops}")


@dataclass(frozen=True)
class Problem:
    a: int
    op: str
    b: int

    @property
    def expression(self) -> str:
        return f"{self.a}{self.op}{self.b}"

    @property
    def answer(self) -> int:
        if self.op == "+":
            return self.a + self.b
        if self.op == "-":
            return self.a - self.b
        return self.a * self.b

    @property
    def prompt(self) -> str:
        return f"{PROMPT_PREFIX}{self.expression}{PROMPT_SUFFIX}"

    @property
    def response(self) -> str:
        """The reference response, without the end-of-sequence token."""
        return f"{self.expression}={self.answer}"


def is_held_out(problem: Problem, config: ArithmeticConfig) -> bool:
    """A fixed, seed-independent hash of the expression decides the held-out split.

    A cryptographic hash, not a linear one: `(k1*a + k2*b) % 10` would hold out exactly
    the sums ending in one digit, a split the model could never generalise to.
    """
    digest = hashlib.blake2b(problem.expression.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % config.held_out_every == 0


def generate_problems(config: ArithmeticConfig, n: int, seed: int, split: str = "train") -> list[Problem]:
    """`n` problems drawn with replacement from `split` ("train", "test" or "all"), reproducibly from `seed`."""
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    rng = random.Random(seed)
    high = 10**config.digits - 1
    problems: list[Problem] = []
    while len(problems) < n:
        p = Problem(rng.randint(0, high), rng.choice(config.ops), rng.randint(0, high))
        if split == "all" or is_held_out(p, config) == (split == "test"):
            problems.append(p)
    return problems


_ANSWER = re.compile(r"=(-?\d+)\s*$")


def extract_answer(response: str) -> int | None:
    """The integer after the last "=" at the end of a response, or None if there is none."""
    match = _ANSWER.search(response)
    return int(match.group(1)) if match else None


def score(problem: Problem, response: str) -> float:
    """1.0 when the response's final answer equals the problem's, else 0.0.

    Only the answer counts; a wrongly copied problem with the right answer still scores 1,
    so the reward stays a pure verifier of the result.
    """
    return 1.0 if extract_answer(response) == problem.answer else 0.0


class ArithmeticTask(HeldOutTail):
    """`TaskConfig.difficulty` = ArithmeticConfig's fields; the training split, drawn from the config's seed.
    Its prompts are the `tiny` model's fixed format: no chat template, system prompt or instruction."""

    def __init__(self, config: TaskConfig):
        for key in ("system_prompt", "instruction"):
            if getattr(config, key) is not None:
                raise ValueError(f"task.{key}: the arithmetic task's prompts are the tiny model's fixed format "
                                 f"({PROMPT_PREFIX!r} problem {PROMPT_SUFFIX!r}); leave it unset")
        try:
            settings = ArithmeticConfig(**{k: tuple(v) if isinstance(v, list) else v
                                           for k, v in config.difficulty.items()})
        except TypeError as err:
            raise ValueError(f"task.difficulty for arithmetic: {err}") from err
        self.problems = generate_problems(settings, config.size, config.seed, split="train")

    def __len__(self) -> int:
        return len(self.problems)

    def __getitem__(self, index: int) -> Problem:
        return self.problems[index % len(self.problems)]

    def render(self, problem: Problem, tokenizer) -> str:
        return problem.prompt

    def example(self, problem: Problem) -> dict:
        return {"prompt": problem.prompt, "question": problem.expression, "answer": str(problem.answer)}

    def verify(self, response: str, example: dict) -> float:
        """1.0 when the response's final answer is the example's (`score`), else 0.0."""
        return 1.0 if extract_answer(response) == int(example["answer"]) else 0.0

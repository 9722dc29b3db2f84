"""Verifiable reasoning tasks from reasoning-gym, rendered as prompts and scored exactly.

A task yields `Problem`s; `render` turns one into prompt text (through the model's
chat template when the tokenizer has one); `reward` scores a response with the
dataset's own scorer: 1.0 when the extracted answer scores >= 1, else 0.0.
The answer is taken from the last `<answer>...</answer>` in the response, or, when
there is none, the last number in it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import reasoning_gym

from specrl.tasks.task import TaskConfig

INSTRUCTION = "Solve the problem. Give only the final answer inside <answer></answer>."
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


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
    def __init__(self, config: TaskConfig):
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

"""What a task is: problems, the prompt each renders to, and the rewards that score responses.

    len(task), task[i]          training problems, a pure function of the config (index wraps around)
    task.held_out(count)        the held-out problems, never trained on
    task.render(problem, tok)   the prompt text the policy sees
    task.score(text, problem)   a `Score`: the weighted reward, each named reward's value, a failure
    task.reward(text, problem)  the weighted reward alone
    task.passes(text, problem)  whether a held-out sample counts as solved (reward >= task.pass_threshold)

`make_task` builds the task a `TaskConfig` names: `arithmetic` (tiny's task), `file` (a user's
dataset, `tasks.file_dataset`) or a reasoning-gym dataset; its rewards are `task.reward`'s
(`tasks.rewards`), by default the task's own verifier (`math` for a file).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal, Protocol

from specrl.tasks.rewards import Rewards, Score, absolute_reward_files, reward_weights
from specrl.validation import check_fields, within


@dataclass(frozen=True)
class TaskConfig:
    """Where prompts and rewards come from."""

    SECTION: ClassVar[str] = "task"
    REMOVED: ClassVar[dict[str, str]] = {
        "isolated_scoring": "its worker ran the model's answer as code; every dataset it served is now scored "
                            "by a parser that never runs the answer, or refused (docs/tasks.md)"}

    name: str = "arithmetic"  # arithmetic (the tiny model's own task), file (task.path), or a reasoning-gym dataset
    size: int = within(100_000, "[1, inf)")  # problems generated (procedurally, offline); not for file
    seed: int = 0  # generation seed (file: the order rows are trained in is the file's)
    difficulty: dict = field(default_factory=dict)  # arithmetic: {"digits": 2, "ops": ["+"]}; reasoning-gym kwargs
    # file: a .jsonl, .json, .csv or .parquet file, or a folder written by datasets' save_to_disk
    path: str | None = None
    eval_path: str | None = None  # file: the held-out problems; None = the last task.eval_size rows of task.path
    eval_size: int = within(200, "[1, inf)")  # file: rows held out from task.path when there is no task.eval_path
    prompt_field: str | None = None  # file: the prompt's column; None = "prompt", else "question"
    answer_field: str = "answer"  # file: the gold answer's column, read by the built-in verifiers
    # auto: the tokenizer's chat template where it has one, else the text | none: the text as it is
    template: Literal["auto", "none"] = "auto"
    system_prompt: str | None = None  # a system message before the problem
    instruction: str | None = None  # text after the problem; None = the task's own (reasoning-gym's answer format)
    # one reward, or {name: weight}: task (the task's own verifier), exact, numeric, choice, math, or a
    # function MODULE:FUNCTION / PATH.py:FUNCTION called as (response, example) -> float (tasks/rewards.py)
    reward: str | dict | None = None
    tolerance: float = within(1e-6, "[0, inf)")  # numeric: |x - y| <= tolerance * max(1, |y|)
    pass_threshold: float = 1.0  # a held-out sample counts as solved when its reward is at least this

    def __post_init__(self):
        check_fields(self)
        # files are named as given and kept absolute: a run's saved config, its rollout actors and `specrl eval
        # RUN_DIR` find them from any directory
        for key in ("path", "eval_path"):
            if getattr(self, key) is not None:
                object.__setattr__(self, key, str(Path(getattr(self, key)).absolute()))
        object.__setattr__(self, "reward", absolute_reward_files(self.reward))
        if (self.name == "file") != (self.path is not None):
            raise ValueError("task.path names the dataset file of task.name=file, and only of it"
                             if self.path is not None else "task.name=file needs task.path=PATH (a .jsonl, .json, "
                                                           ".csv or .parquet file, or a save_to_disk folder)")
        if self.eval_path is not None and self.name != "file":
            raise ValueError(f"task.eval_path is for task.name=file; {self.name}'s held-out set is its last problems")


class Problems(Protocol):
    """A task's problems and prompts, before rewards: what `arithmetic`, reasoning-gym and `file` each provide."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int): ...

    def held_out(self, count: int) -> list: ...

    held_out_size: int  # how many problems `held_out` can give

    def check_held_out(self, count: int, trained_positions: int) -> None: ...

    def render(self, problem, tokenizer) -> str: ...

    def example(self, problem) -> dict: ...  # the record a reward function receives

    # file and reasoning-gym: the chat messages `render` puts through the template (arithmetic has none)
    def messages(self, problem) -> list[dict]: ...


class HeldOutTail:
    """The held-out problems are a generated task's last ones, problems[len - 1], [len - 2], ...: training draws
    from the front (step s trains on positions (s-1)*P .. s*P-1), so a run that has not reached the tail never
    trained on them (`check_held_out` refuses one that has)."""

    @property
    def held_out_size(self) -> int:
        return len(self)

    def held_out(self, count: int) -> list:
        if count > len(self):
            raise ValueError(f"eval.prompts ({count}) is more than the task's {len(self)} problems (task.size)")
        return [self[len(self) - 1 - i] for i in range(count)]

    def check_held_out(self, count: int, trained_positions: int) -> None:
        """Refuse a held-out set that overlaps the problems a run trains on."""
        first = len(self) - count
        if trained_positions > first:
            raise ValueError(f"the held-out set (the task's last {count} problems, from index {first}) overlaps the "
                             f"{trained_positions} problems this run trains on; raise task.size or lower eval.prompts")


def chat_messages(messages: list[dict], config: TaskConfig) -> list[dict]:
    """Messages (a text problem is one user message) with `task.system_prompt` put first and `task.instruction`
    added to the last user message, on a new line."""
    messages = [dict(m) for m in messages]
    if config.instruction:
        users = [m for m in messages if m["role"] == "user"] or messages
        users[-1]["content"] = f"{users[-1]['content']}\n{config.instruction}"
    if config.system_prompt:
        messages.insert(0, {"role": "system", "content": config.system_prompt})
    return messages


def chat_prompt(messages: list[dict], tokenizer, config: TaskConfig) -> str:
    """`chat_messages` rendered by the tokenizer's chat template (`task.template=auto`, where it has one) or as
    plain text (the contents, a blank line apart, and a newline)."""
    messages = chat_messages(messages, config)
    if config.template == "auto" and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(m["content"] for m in messages) + "\n"


class Task:
    """Problems with their rewards (see the module docstring)."""

    def __init__(self, config: TaskConfig, problems: Problems, rewards: Rewards):
        self.config, self.problems, self.rewards = config, problems, rewards

    def __len__(self) -> int:
        return len(self.problems)

    def __getitem__(self, index: int):
        return self.problems[index]

    def held_out(self, count: int) -> list:
        return self.problems.held_out(count)

    @property
    def held_out_size(self) -> int:
        return self.problems.held_out_size

    def check_held_out(self, count: int, trained_positions: int) -> None:
        self.problems.check_held_out(count, trained_positions)

    def render(self, problem, tokenizer) -> str:
        return self.problems.render(problem, tokenizer)

    def messages(self, problem) -> list[dict]:
        """The chat messages a chat template renders for `problem` (what another framework would be handed)."""
        if not hasattr(self.problems, "messages"):
            raise ValueError(f"task {self.config.name!r} has no chat messages: its prompts are a fixed text format")
        return chat_messages(self.problems.messages(problem), self.problems.config)  # with the task's own defaults

    def score(self, response: str, problem) -> Score:
        return self.rewards(response, self.problems.example(problem))

    def reward(self, response: str, problem) -> float:
        return self.score(response, problem).reward

    def passes(self, response: str, problem) -> bool:
        return self.reward(response, problem) >= self.config.pass_threshold


def render_prompts(task: Task, tokenizer, first: int, count: int) -> tuple[list, list[str]]:
    """Problems task[first : first + count] and their prompt texts."""
    problems = [task[first + i] for i in range(count)]
    return problems, [task.render(p, tokenizer) for p in problems]


def make_task(config: TaskConfig) -> Task:
    """`arithmetic`, `file` or any reasoning-gym dataset name, with `task.reward`'s rewards."""
    if config.name == "arithmetic":
        from specrl.tasks.arithmetic import ArithmeticTask as problems_class
    elif config.name == "file":
        from specrl.tasks.file_dataset import FileProblems as problems_class
    else:
        from specrl.tasks.gym import ReasoningGymTask as problems_class
    problems = problems_class(config)
    own = getattr(problems, "verify", None)  # (response, example) -> float, for a task with a verifier of its own
    weights = reward_weights(config.reward, "task" if own is not None else "math")
    rewards = Rewards(weights, own, config.answer_field, config.tolerance)
    if hasattr(problems, "check_rewards"):
        problems.check_rewards(rewards)
    return Task(config, problems, rewards)

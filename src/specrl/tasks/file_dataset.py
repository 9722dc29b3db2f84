"""A user's dataset as a task: `task.name=file task.path=PATH`.

PATH is a `.jsonl`, `.json`, `.csv` or `.parquet` file, or a folder written by `datasets`'
`save_to_disk`, read with the `datasets` library's local loaders (nothing is fetched). Each
row is one problem:

    prompt     task.prompt_field (default "prompt", else "question"): text, or a list of chat
               messages {"role": ..., "content": ...}
    answer     task.answer_field (default "answer"): what the built-in verifiers compare with
    the rest   passed on, with the two above, as the `example` a reward function receives

The held-out problems are task.eval_path's rows, or else the last task.eval_size rows of
task.path; training draws the other rows in file order (wrapping around), never those.
Every row is checked when the task is made: a missing file or field, an empty dataset or
a malformed prompt is an error naming the file, the row and the field.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specrl.tasks.task import TaskConfig, chat_prompt
from specrl.tasks.verifiers import gold_letter, read_number

SUFFIX_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def read_rows(path: str, key: str) -> list[dict]:
    """The rows of a dataset file or save_to_disk folder (`key` names the config key in errors)."""
    import datasets

    where = Path(path)
    if not where.exists():
        raise ValueError(f"{key}: no file or folder {where}")
    if where.is_file() and where.stat().st_size <= 4096 and not where.read_bytes().strip():
        raise ValueError(f"{key}: {where} holds no rows")  # the loaders fail on an empty file with no reason
    datasets.disable_progress_bars()
    try:
        if where.is_dir():
            loaded = datasets.load_from_disk(str(where))
            if isinstance(loaded, datasets.DatasetDict):
                if "train" not in loaded:
                    raise ValueError(f"{key}: {where} holds the splits {sorted(loaded)} and no 'train'; point at "
                                     "one split's folder")
                loaded = loaded["train"]
        else:
            builder = SUFFIX_BUILDERS.get(where.suffix.lower())
            if builder is None:
                raise ValueError(f"{key}: {where} is not a dataset file; use one of {sorted(SUFFIX_BUILDERS)} or a "
                                 "folder written by datasets' save_to_disk")
            loaded = datasets.load_dataset(builder, data_files=str(where), split="train")
    except ValueError:
        raise
    except Exception as err:  # noqa: BLE001 - the loader's own reason (bad JSON, a truncated parquet, ...)
        raise ValueError(f"{key}: reading {where} failed: {type(err).__name__}: {err}") from err
    rows = loaded.to_list()
    if not rows:
        raise ValueError(f"{key}: {where} holds no rows")
    return rows


def _check_prompt(prompt, where: str) -> list[dict]:
    """A text prompt or a list of chat messages -> messages; anything else is an error naming `where`."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError(f"{where}: the prompt is empty")
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt):
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    raise ValueError(f"{where}: the prompt must be text or a non-empty list of {{'role', 'content'}} messages, "
                     f"got {str(prompt)[:120]!r}")


@dataclass(frozen=True)
class Problem:
    index: int  # row in its file
    messages: tuple  # the prompt as chat messages
    example: dict  # the row


class FileProblems:
    """Training rows and held-out rows of a user's dataset (see the module docstring)."""

    def __init__(self, config: TaskConfig):
        self.config = config
        rows = read_rows(config.path, "task.path")
        if config.eval_path is not None:
            train, held = rows, read_rows(config.eval_path, "task.eval_path")
        else:
            if len(rows) <= config.eval_size:
                raise ValueError(f"task.path: {config.path} has {len(rows)} rows, not more than task.eval_size "
                                 f"({config.eval_size}) held out; lower task.eval_size or give task.eval_path")
            train, held = rows[:-config.eval_size], rows[-config.eval_size:]
        self.prompt_field = config.prompt_field or ("prompt" if "prompt" in rows[0] else "question")
        self.train = self._problems(train, config.path)
        self.held = self._problems(held, config.eval_path or config.path, offset=len(train) * (not config.eval_path))

    def _problems(self, rows: list[dict], path: str, offset: int = 0) -> list[Problem]:
        field = self.prompt_field
        problems = []
        for i, row in enumerate(rows):
            where = f"task.path {path}, row {offset + i}"
            if field not in row:
                default = "" if self.config.prompt_field else " (the default is 'prompt', else 'question')"
                raise ValueError(f"{where}: no prompt field {field!r}{default}; its fields are {sorted(row)}. "
                                 "Set task.prompt_field")
            problems.append(Problem(offset + i, tuple(_check_prompt(row[field], where)), row))
        return problems

    def check_rewards(self, rewards) -> None:
        """The built-in verifiers read task.answer_field: every row must have one, in the form they read."""
        field = self.config.answer_field
        for problem in self.train + self.held if rewards.reads_answer else ():
            gold = problem.example.get(field)
            if gold is None:
                raise ValueError(f"task.path row {problem.index}: no answer field {field!r} (the verifiers "
                                 f"{sorted(rewards.reads_answer)} read it); its fields are {sorted(problem.example)}. "
                                 "Set task.answer_field")
            if "numeric" in rewards.reads_answer and read_number(gold) is None:
                raise ValueError(f"task.path row {problem.index}: the answer {gold!r} is not a number, which the "
                                 "numeric verifier needs (integers, decimals, fractions a/b, 1,234)")
            if "choice" in rewards.reads_answer:
                try:
                    gold_letter(gold)
                except ValueError as err:
                    raise ValueError(f"task.path row {problem.index}: {err}") from None

    def __len__(self) -> int:
        return len(self.train)

    def __getitem__(self, index: int) -> Problem:
        return self.train[index % len(self.train)]

    @property
    def held_out_size(self) -> int:
        return len(self.held)

    def held_out(self, count: int) -> list[Problem]:
        if count > len(self.held):
            source = "task.eval_path" if self.config.eval_path else "task.eval_size"
            raise ValueError(f"eval.prompts ({count}) is more than the {len(self.held)} held-out problems "
                             f"({source}); lower eval.prompts")
        return self.held[:count]

    def check_held_out(self, count: int, trained_positions: int) -> None:
        self.held_out(count)  # the held-out rows are apart from the training rows: only their number can be wrong

    def messages(self, problem: Problem) -> list[dict]:
        return [dict(m) for m in problem.messages]

    def render(self, problem: Problem, tokenizer) -> str:
        return chat_prompt(self.messages(problem), tokenizer, self.config)

    def example(self, problem: Problem) -> dict:
        return problem.example

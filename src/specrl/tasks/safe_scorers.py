"""specrl's own scorers for the reasoning-gym datasets whose scorer runs the answer as code.

reasoning-gym 0.1.25 scores countdown and puzzle24 with sympy's `parse_expr`, which calls
`eval()`, and binary_matrix, n_queens, spiral_matrix and string_insertion with `eval()`
itself. `REWRITTEN_SCORERS[name](answer, entry)` scores the same answers without running
them, on the dataset's scale; the task reward is 1.0 when the score is >= 1, else 0.0.

    countdown       1.0 when the answer is arithmetic (`safe_arithmetic`), its literals are the
                    entry's numbers, each used as often as it is given, and its value is the
                    target exactly; 0.05 when it is arithmetic but not that; 0.01 when it is
                    empty or not arithmetic.
    puzzle24        1.0 when the answer is arithmetic over the entry's four numbers, each used as
                    often as it is given, and its value is exactly 24; 0.01 otherwise.
    binary_matrix, n_queens, spiral_matrix, string_insertion
                    1.0 when the answer is the dataset's answer (n_queens: one of its valid
                    boards; spiral_matrix: after stripping whitespace), else 0.0. The dataset's
                    `eval` only gave partial credit (0.1, n_queens 0.5) to an answer spelled as a
                    Python list, below the reward's threshold: the reward is the dataset's.

Where countdown and puzzle24 differ from the dataset's scorer, on purpose:
- arithmetic is + - * / and parentheses over decimal literals (`×`, `÷`, `−` read as `*`, `/`,
  `-`, which sympy fails to parse). sympy also evaluates `**`, `^`, `!`, `1e3`, names and
  calls: here those are not arithmetic (0.01), nor is a division by zero.
- the numbers used are the expression's literals. The dataset reads every run of digits
  (`\\b\\d+\\b`), so `3.5*2` counts as using 3, 5 and 2.
- the value must equal the target exactly. countdown compares with `np.isclose`, whose default
  relative tolerance of 1e-5 takes 1000.01 for 1000; puzzle24 truncates with `int()`, so any
  value in [24, 25) counts as 24.
- puzzle24's numbers must be the entry's. The dataset only checks that there are four numbers
  in the config's range, so `6*4*1*1` solves every puzzle.
"""
from __future__ import annotations

from typing import Callable

from specrl.tasks.safe_arithmetic import Arithmetic, parse


def _solves(expression: Arithmetic | None, numbers: list[int], target: int) -> bool:
    """Each of `numbers` used as often as it is given, no other literal, and the value exactly `target`."""
    return expression is not None and sorted(expression.numbers) == sorted(numbers) and expression.value == target


def countdown(answer: str | None, entry: dict) -> float:
    expression = parse(answer)
    if expression is None:
        return 0.01
    return 1.0 if _solves(expression, entry["metadata"]["numbers"], entry["metadata"]["target"]) else 0.05


def puzzle24(answer: str | None, entry: dict) -> float:
    return 1.0 if _solves(parse(answer), entry["metadata"]["numbers"], 24) else 0.01


def exact_answer(answer: str | None, entry: dict) -> float:
    """binary_matrix and string_insertion: the answer as the dataset writes it, character for character."""
    return 1.0 if answer == entry["answer"] else 0.0


def n_queens(answer: str | None, entry: dict) -> float:
    return 1.0 if isinstance(answer, str) and answer in entry["metadata"]["valid_answers"] else 0.0


def spiral_matrix(answer: str | None, entry: dict) -> float:
    return 1.0 if answer and answer.strip() == entry["answer"].strip() else 0.0


REWRITTEN_SCORERS: dict[str, Callable[[str | None, dict], float]] = {
    "countdown": countdown,
    "puzzle24": puzzle24,
    "binary_matrix": exact_answer,
    "n_queens": n_queens,
    "spiral_matrix": spiral_matrix,
    "string_insertion": exact_answer,
}

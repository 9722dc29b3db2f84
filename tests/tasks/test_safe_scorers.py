"""specrl's rewritten scorers against reasoning-gym's own, on real dataset entries.

Chain of invariants:
    countdown and puzzle24        score like the dataset's scorer, to the partial credit, on every
                                  answer written in the shared grammar: correct ones (the entry's
                                  own and others found by brute force), wrong values, a number
                                  used twice, a number missing, a number added, malformed text;
    where they differ             it is one of the differences safe_scorers' docstring lists, each
                                  tested here by name;
    the exact-match rewrites      give the dataset's reward (score >= 1) on right, wrong and
                                  Python-list answers;
    through ReasoningGymTask      a correct answer scores 1.0, a wrong one 0.0, and an answer that
                                  is code scores 0.0, prints nothing and leaves later scores alone.

The dataset's scorer runs its answer through sympy's parse_expr or eval(): it is called here
only on strings this file writes (arithmetic over the entry's numbers, or plain words).
"""
from __future__ import annotations

import re
from fractions import Fraction
from itertools import permutations

import pytest
import reasoning_gym

from specrl.tasks import TaskConfig, make_task
from specrl.tasks.safe_scorers import REWRITTEN_SCORERS


def solutions(numbers: list[int], target: int, limit: int) -> list[str]:
    """Up to `limit` expressions that use each of `numbers` once and equal `target` exactly, found by
    combining two values at a time with + - * / (the usual 24-game search), values kept as Fractions."""
    found: list[str] = []

    def search(items: list[tuple[Fraction, str]]) -> None:
        if len(found) >= limit:
            return
        if len(items) == 1:
            if items[0][0] == target:
                found.append(items[0][1][1:-1] if items[0][1].startswith("(") else items[0][1])
            return
        for i, j in permutations(range(len(items)), 2):
            (a, x), (b, y) = items[i], items[j]
            rest = [item for k, item in enumerate(items) if k not in (i, j)]
            combined = [(a + b, f"({x} + {y})"), (a - b, f"({x} - {y})"), (a * b, f"({x} * {y})")]
            if b:
                combined.append((a / b, f"({x} / {y})"))
            for item in combined:
                search(rest + [item])

    search([(Fraction(n), str(n)) for n in numbers])
    return found


def answers_for(entry: dict, target: int) -> list[str]:
    """Right and wrong answers for an entry, all arithmetic over its numbers or plain words."""
    numbers = entry["metadata"]["numbers"]
    first, *others = [str(n) for n in numbers]
    right = [entry["answer"], *solutions(numbers, target, limit=3)] if len(numbers) <= 4 else [entry["answer"]]
    wrong = [
        " + ".join([first, *others]) + " + 1",  # a number added
        " * ".join([first, *others]),  # each number once, another value (unless it is the target)
        f"{right[0]} - {first} + {first}",  # the target, a number used three times
        f"{right[0]} * {first} / {first}",
        " + ".join(others),  # a number missing
        " + ".join([first, first, *others[1:]]),  # a number in place of another
        str(target),
        f" {right[0]} ",
        f"({right[0]})",
        f"-({right[0]})",
        "", "   ", "abc", "x + 1", f"{first} +", f"({right[0]}", f"{right[0]})", f"{first} {first}",
    ]
    return right + wrong


def test_the_brute_force_search_finds_known_solutions():
    assert "8 / (3 - (8 / 3))" in solutions([8, 3, 8, 3], 24, limit=10_000)
    assert solutions([1, 1, 1, 1], 24, limit=10) == []


@pytest.mark.parametrize(
    "name, difficulty, target",
    [
        ("countdown", {}, None),
        ("countdown", {"min_numbers": 3, "max_numbers": 4, "min_target": 10, "max_target": 200}, None),
        ("puzzle24", {}, 24),
        ("puzzle24", {"min_value": 1, "max_value": 6}, 24),
    ],
)
def test_countdown_and_puzzle24_score_like_the_dataset_on_real_entries(name, difficulty, target):
    """puzzle24's scorer takes any four numbers in range (a difference tested below): such answers
    are expected to score 0.01 here."""
    dataset = reasoning_gym.create_dataset(name, size=25, seed=1, **difficulty)
    ours = REWRITTEN_SCORERS[name]
    solved = 0
    for entry in dataset:
        numbers, entry_target = entry["metadata"]["numbers"], target or entry["metadata"]["target"]
        for answer in answers_for(entry, entry_target):
            expected = dataset.score_answer(answer, entry)
            if name == "puzzle24" and sorted(int(n) for n in re.findall(r"\d+", answer)) != sorted(numbers):
                expected = 0.01
            assert ours(answer, entry) == expected, (numbers, entry_target, answer)
            solved += expected >= 1.0
    assert solved > len(dataset)  # every entry's own answer, and the ones found by brute force


def _entry(numbers: list[int], target: int | None = None, answer: str = "") -> dict:
    metadata = {"numbers": numbers} if target is None else {"numbers": numbers, "target": target}
    return {"answer": answer, "metadata": metadata}


@pytest.fixture(scope="module")
def countdown():
    return reasoning_gym.create_dataset("countdown", size=1, seed=0)


@pytest.fixture(scope="module")
def puzzle24():
    return reasoning_gym.create_dataset("puzzle24", size=1, seed=0)


def test_unicode_operators_are_read_where_sympy_fails_on_them(countdown, puzzle24):
    entry = _entry([6, 4, 2, 2], target=24)
    for answer in ("6×4×(2÷2)", "6 × 4 + 2 − 2"):
        assert countdown.score_answer(answer, entry) == puzzle24.score_answer(answer, entry) == 0.01
        assert REWRITTEN_SCORERS["countdown"](answer, entry) == REWRITTEN_SCORERS["puzzle24"](answer, entry) == 1.0


def test_an_answer_outside_the_grammar_is_malformed_where_sympy_would_evaluate_it(countdown, puzzle24):
    entry = _entry([2, 3, 4, 1], target=24)
    for answer in ("2**3*(4-1)", "(2+3-1)!*1", "2^3*3*4"):  # ^ is xor in sympy: (2^3)*3*4 = 12
        assert REWRITTEN_SCORERS["countdown"](answer, entry) == REWRITTEN_SCORERS["puzzle24"](answer, entry) == 0.01
    assert puzzle24.score_answer("2**3*(4-1)", entry) == puzzle24.score_answer("(2+3-1)!*1", entry) == 1.0


def test_countdown_needs_the_exact_target_where_np_isclose_takes_a_near_miss(countdown):
    entry = _entry([10, 100, 1, 100], target=1000)
    near_miss = "10*100 + 1/100"  # 1000.01: np.isclose's default rtol=1e-5 allows 0.01 at 1000
    assert countdown.score_answer(near_miss, entry) == 1.0
    assert REWRITTEN_SCORERS["countdown"](near_miss, entry) == 0.05
    assert REWRITTEN_SCORERS["countdown"]("100*(10 + 1) - 100", entry) == 1.0


def test_puzzle24_needs_exactly_24_where_int_truncation_takes_24_and_a_half(puzzle24):
    entry = _entry([7, 7, 2, 1])
    assert puzzle24.score_answer("7*7/2*1", entry) == 1.0  # int(49/2) == 24
    assert REWRITTEN_SCORERS["puzzle24"]("7*7/2*1", entry) == 0.01


def test_puzzle24_needs_the_entrys_numbers_where_the_dataset_takes_any_four_in_range(puzzle24):
    entry = _entry([1, 3, 5, 9])
    for answer in ("6*4*1*1", "3*8*1*1", "9+5+9+1"):  # each makes 24, none from {1, 3, 5, 9} once each
        assert puzzle24.score_answer(answer, entry) == 1.0
        assert REWRITTEN_SCORERS["puzzle24"](answer, entry) == 0.01
    assert REWRITTEN_SCORERS["puzzle24"]("1*3*5 + 9", entry) == 1.0


def test_the_numbers_used_are_the_literals_where_the_dataset_splits_decimals_into_digit_runs(countdown):
    entry = _entry([3, 5, 2], target=7)
    assert countdown.score_answer("3.5*2", entry) == 1.0  # \b\d+\b reads 3, 5 and 2
    assert REWRITTEN_SCORERS["countdown"]("3.5*2", entry) == 0.05


EXACT_MATCH = ["binary_matrix", "n_queens", "spiral_matrix", "string_insertion"]


def _python_list_spelling(name: str, entry: dict) -> str:
    """The answer as a Python literal, the spelling the dataset's eval() gave partial credit."""
    answer = entry["metadata"]["valid_answers"][0] if name == "n_queens" else entry["answer"]
    if name == "string_insertion":
        return repr(list(answer))
    if name == "spiral_matrix":
        return repr([int(x) for x in answer.split()])
    return repr([row.split() if name == "n_queens" else [int(x) for x in row.split()] for row in answer.splitlines()])


@pytest.mark.parametrize("name", EXACT_MATCH)
def test_the_exact_match_rewrites_give_the_datasets_reward(name):
    dataset = reasoning_gym.create_dataset(name, size=10, seed=2)
    for entry in dataset:
        right = entry["metadata"]["valid_answers"][0] if name == "n_queens" else entry["answer"]
        python_list = _python_list_spelling(name, entry)
        for answer in (right, f" {right}\n", right[:-1], right + "x", "", None, python_list):
            theirs = dataset.score_answer(answer, entry)
            assert (REWRITTEN_SCORERS[name](answer, entry) >= 1.0) == (theirs >= 1.0), (answer, theirs)
        assert 0.0 < dataset.score_answer(python_list, entry) < 1.0  # their eval's partial credit
        assert REWRITTEN_SCORERS[name](python_list, entry) == 0.0


@pytest.mark.parametrize("name", ["countdown", "puzzle24"])
def test_a_correct_answer_scores_one_and_wrong_ones_zero_through_the_task(name):
    task = make_task(TaskConfig(name=name, size=20, seed=3))
    for i in range(len(task)):
        problem = task[i]
        numbers = problem.entry["metadata"]["numbers"]
        assert task.reward(f"Thinking... <answer>{problem.answer}</answer>", problem) == 1.0
        assert task.reward(f"<answer>{problem.answer.replace('*', '×')}</answer>", problem) == 1.0
        assert task.reward(f"<answer>{problem.answer} + {numbers[0]}</answer>", problem) == 0.0
        assert task.reward(f"<answer>{' + '.join(map(str, numbers[1:]))}</answer>", problem) == 0.0
        assert task.reward("<answer>print(3)</answer>", problem) == 0.0
        assert task.reward("no answer here", problem) == 0.0


CODE = [
    "print(3)",
    "print(1.0)",
    "print('{{\"score\": 1.0}}')",
    "__import__('os').system('touch {canary}')",
    "__import__('pathlib').Path('{canary}').touch()",
    "open('{canary}', 'w').write(open('/proc/%d/environ' % __import__('os').getppid()).read())",
    "(lambda: __import__('os').system('touch {canary}'))()",
    "[[__import__('os').system('touch {canary}')]]",
    "__import__('os').system('touch {canary}') + 0",
    "exec(\"open('{canary}', 'w')\")",
]


@pytest.mark.parametrize("name", sorted(REWRITTEN_SCORERS))
def test_an_answer_that_is_code_scores_zero_runs_nothing_and_leaves_later_scores_alone(name, tmp_path, capfd):
    task = make_task(TaskConfig(name=name, size=3))
    problem = task[0]
    right = problem.entry["metadata"]["valid_answers"][0] if name == "n_queens" else problem.answer
    for i, code in enumerate(CODE):
        assert task.reward(f"<answer>{code.format(canary=tmp_path / str(i))}</answer>", problem) == 0.0
        assert task.reward(f"<answer>{right}</answer>", problem) == 1.0
    assert list(tmp_path.iterdir()) == []
    assert capfd.readouterr() == ("", "")

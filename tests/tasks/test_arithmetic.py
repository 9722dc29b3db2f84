"""The arithmetic task: problem generation, the held-out split and the answer checker."""
from collections import Counter

import pytest

from helpers import parse_arithmetic_prompt

from specrl.tasks import arithmetic
from specrl.tasks.arithmetic import ArithmeticConfig, Problem


def test_reference_response_copies_the_problem_then_answers():
    p = Problem(12, "+", 34)
    assert p.prompt == "Q:12+34\nA:"
    assert p.response == "12+34=46"
    assert Problem(3, "-", 10).response == "3-10=-7"
    assert Problem(12, "*", 11).answer == 132


@pytest.mark.parametrize(
    "response, expected",
    [
        ("12+34=46", 1.0),
        ("12+34=47", 0.0),
        ("12+35=46", 1.0),  # only the result is verified
        ("12+34=046", 1.0),
        ("12+34=", 0.0),
        ("12+34", 0.0),
        ("", 0.0),
        ("12+34=46=47", 0.0),  # the last "=" decides
        ("12+34=4 6", 0.0),
        ("12+34=46\n", 1.0),
    ],
)
def test_score_checks_the_final_answer_by_hand(response, expected):
    assert arithmetic.score(Problem(12, "+", 34), response) == expected


def test_negative_answers_are_parsed():
    assert arithmetic.extract_answer("3-10=-7") == -7
    assert arithmetic.score(Problem(3, "-", 10), "3-10=-7") == 1.0
    assert arithmetic.score(Problem(3, "-", 10), "3-10=7") == 0.0


def test_generation_is_a_pure_function_of_the_seed():
    config = ArithmeticConfig()
    assert arithmetic.generate_problems(config, 50, seed=7) == arithmetic.generate_problems(config, 50, seed=7)
    assert arithmetic.generate_problems(config, 50, seed=7) != arithmetic.generate_problems(config, 50, seed=8)


def test_train_and_test_splits_are_disjoint():
    config = ArithmeticConfig()
    train = set(arithmetic.generate_problems(config, 3000, seed=0, split="train"))
    test = set(arithmetic.generate_problems(config, 1000, seed=0, split="test"))
    assert train.isdisjoint(test)
    assert all(arithmetic.is_held_out(p, config) for p in test)


def test_held_out_split_is_not_biased_towards_a_last_digit():
    """A linear hash would hold out only sums ending in one digit; every last digit must appear."""
    test = arithmetic.generate_problems(ArithmeticConfig(), 2000, seed=1, split="test")
    counts = Counter(p.answer % 10 for p in test)
    assert len(counts) == 10
    assert min(counts.values()) > 100


def test_prompt_parses_back_to_its_problem():
    for p in arithmetic.generate_problems(ArithmeticConfig(ops=("+", "-", "*")), 20, seed=3):
        assert parse_arithmetic_prompt(p.prompt) == p
    with pytest.raises(ValueError, match="not an arithmetic prompt"):
        parse_arithmetic_prompt("hello")


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="digits"):
        ArithmeticConfig(digits=0)
    with pytest.raises(ValueError, match="ops"):
        ArithmeticConfig(ops=("/",))

"""The safe arithmetic parser: its grammar's values are exact, and everything outside it is refused.

Chain of invariants:
    every expression in the grammar     has the exact value of the tree it spells (random trees,
                                        rendered with random spacing, parentheses and operator glyphs);
    every text outside the grammar      returns None, scores as malformed (0.01, a reward of 0) and
                                        raises nothing, code included;
    the bounds                          are where the docstring puts them, and the biggest accepted
                                        text still parses in milliseconds.
"""
from __future__ import annotations

import random
import time
from fractions import Fraction

import pytest

from specrl.tasks.safe_arithmetic import MAX_CHARS, MAX_DEPTH, MAX_DIGITS, parse
from specrl.tasks.safe_scorers import REWRITTEN_SCORERS


@pytest.mark.parametrize(
    "text, value",
    [
        ("1+2", 3),
        ("7-10", -3),
        ("6*7", 42),
        ("7/2", Fraction(7, 2)),
        ("8/(3-8/3)", 24),  # 23.999999999999996 in floats
        ("2-3-4", -5),  # left-associative, as in Python
        ("8/2/2", 2),
        ("2+3*4", 14),  # * before +
        ("(2+3)*4", 20),
        ("-3+5", 2),
        ("+4", 4),
        ("--3", 3),
        ("2*-3", -6),
        ("-(-(2))", 2),
        ("(((1+2)))*3", 9),
        ("3×4", 12),
        ("8÷2", 4),
        ("5−2", 3),  # U+2212 minus
        ("1.5*2", 3),
        ("0.1+0.2", Fraction(3, 10)),  # decimal literals are exact too
        ("007", 7),
        ("\t1 +\n 2  ", 3),
        ("10*(8 - 5) - 6", 24),
    ],
)
def test_the_grammar_computes_every_accepted_form_exactly(text, value):
    parsed = parse(text)
    assert parsed is not None and parsed.value == value and isinstance(parsed.value, Fraction)


def test_the_literals_are_the_numbers_as_written():
    assert parse("2*(3+3)").numbers == (2, 3, 3)
    assert parse("-1.5 × 4 ÷ 2").numbers == (Fraction(3, 2), 4, 2)


def _random_tree(rng: random.Random, depth: int) -> tuple[Fraction, str]:
    """A random expression's exact value, computed on the tree, and one way to write it."""
    if depth == 0 or rng.random() < 0.3:
        literal = rng.choice([str(rng.randint(0, 999)), f"{rng.randint(0, 99)}.{rng.randint(0, 99):02d}"])
        value, text = Fraction(literal), literal
    else:
        (a, x), (b, y) = _random_tree(rng, depth - 1), _random_tree(rng, depth - 1)
        op = rng.choice("+-*/" if b else "+-*")
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]
        glyph = rng.choice({"+": ["+"], "-": ["-", "−"], "*": ["*", "×"], "/": ["/", "÷"]}[op])
        space = rng.choice(["", " ", "  "])
        text = f"({x}){space}{glyph}{space}({y})"
    if rng.random() < 0.2:
        value, text = -value, f"-({text})"
    return value, text


def test_random_expressions_parse_to_the_exact_value_of_their_tree():
    rng = random.Random(0)
    for _ in range(2000):
        value, text = _random_tree(rng, depth=4)
        parsed = parse(text)
        assert parsed is not None, text
        assert parsed.value == value, text


REFUSED = [
    # names, calls, attributes, imports, subscripts, lambdas, strings, containers
    "x", "x + 1", "C", "pi", "print(3)", "__import__('os')", "__import__('os').system('touch /tmp/canary')",
    "open('/proc/1/environ').read()", "(1).real", "1 .real", "import os", "[1][0]", "(1, 2)[0]",
    "(lambda: 1)()", "'24'", '"24"', "[24]", "{24}", "sqrt(4)", "Integer(24)", "exec('1')", "eval('1')",
    # operators outside + - * /
    "2**3", "4**0.5", "2^3", "7%4", "7//2", "3!", "1 < 2", "24=24", "24 == 24", "1 if 1 else 2", "~1",
    # literals outside digits[.digits]
    "1e3", "1E3", "1_000", "0x10", "0b11", ".5", "5.", "1j", "1.2.3",
    # not an expression
    "", "   ", "()", "1+", "*2", "(1", "1)", "1 2", "(1)(2)", "2(3)", "<answer>24</answer>", "24.", "1;2",
    "1\x002", "٣+1", "２+２", "1,000",
    # a division by zero
    "5/0", "1/(2-2)", "0/0",
    # over a bound
    "1" * (MAX_DIGITS + 1), "1." + "1" * MAX_DIGITS, "1+" * (MAX_CHARS // 2) + "1",
    "(" * MAX_DEPTH + "1" + ")" * MAX_DEPTH, "-" * MAX_DEPTH + "1", "(" * 100_000, "9" * 100_000,
]


ENTRY = {"answer": "2*3*4*1", "metadata": {"numbers": [2, 3, 4, 1], "target": 24}}


@pytest.mark.parametrize("text", REFUSED, ids=[repr(t[:30]) for t in REFUSED])
def test_text_outside_the_grammar_is_refused_and_scores_as_malformed_without_raising(text):
    assert parse(text) is None
    assert REWRITTEN_SCORERS["countdown"](text, ENTRY) == REWRITTEN_SCORERS["puzzle24"](text, ENTRY) == 0.01


@pytest.mark.parametrize("text", [None, 24, b"24", ["24"]])
def test_a_value_that_is_not_text_is_refused_without_raising(text):
    assert parse(text) is None
    assert REWRITTEN_SCORERS["countdown"](text, ENTRY) == REWRITTEN_SCORERS["puzzle24"](text, ENTRY) == 0.01


def test_the_bounds_sit_where_the_docstring_puts_them():
    assert parse("9" * MAX_DIGITS).value == int("9" * MAX_DIGITS)
    assert parse("(" * (MAX_DEPTH - 1) + "1" + ")" * (MAX_DEPTH - 1)).value == 1
    assert parse("-" * (MAX_DEPTH - 1) + "1").value == -1
    longest = ("1+" * MAX_CHARS)[:MAX_CHARS - 1] + "1"
    assert len(longest) == MAX_CHARS and parse(longest) is not None


def test_the_biggest_accepted_answers_parse_in_milliseconds():
    """Huge products and sums of fractions over MAX_CHARS characters of MAX_DIGITS-digit literals."""
    big = "9" * MAX_DIGITS
    product = "*".join([big] * (MAX_CHARS // (MAX_DIGITS + 1)))
    harmonic = "+".join(f"1/{int(big) - i}" for i in range(MAX_CHARS // (MAX_DIGITS + 3)))
    for text in (product, harmonic):
        start = time.perf_counter()
        assert parse(text) is not None
        assert time.perf_counter() - start < 0.5  # ~0.3 ms on the project's CPU

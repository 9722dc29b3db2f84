"""The built-in verifiers: what each accepts and refuses, and that none of them runs the text it reads.

    exact     equal after collapsing whitespace and case, from the <answer> tag, \\boxed{} or the whole text
    numeric   within tolerance, over integers, decimals, fractions and thousands separators
    choice    the same letter, however the gold and the response write it
    math      the same exact value across \\frac, \\boxed, decimals and simple LaTeX; else the same text
    safety    code in a response is text: it scores 0 and nothing runs
"""
from __future__ import annotations

import builtins

import pytest

from specrl.tasks.verifiers import choice, exact, marked_answer, math, math_value, numeric, read_number


def test_the_answer_is_read_from_the_last_tag_then_the_last_box():
    assert marked_answer("<answer>1</answer> then <answer>2</answer>") == "2"
    assert marked_answer("so \\boxed{\\frac{1}{2}} and \\boxed{3}") == "3"
    assert marked_answer("\\boxed{\\frac{1}{\\sqrt{2}}}") == "\\frac{1}{\\sqrt{2}}"
    assert marked_answer("no answer") is None


@pytest.mark.parametrize("response, gold, expected", [
    ("  Paris ", "paris", 1.0), ("<answer>New   York</answer>", "new york", 1.0), ("Paris.", "Paris", 0.0),
    ("\\boxed{blue}", "Blue", 1.0), ("red", "blue", 0.0)])
def test_exact(response, gold, expected):
    assert exact(response, gold) == expected


@pytest.mark.parametrize("response, gold, expected", [
    ("The total is 1,234.", "1234", 1.0), ("<answer>3/4</answer>", "0.75", 1.0), ("it is -12", "-12", 1.0),
    ("about 0.3333334", "1/3", 1.0), ("about 0.334", "1/3", 0.0), ("first 5 then 7", "5", 0.0),
    ("no number", "3", 0.0), ("\\boxed{2,000,000}", "2e6" if False else "2000000", 1.0), (".5", "1/2", 1.0)])
def test_numeric(response, gold, expected):
    assert numeric(response, gold) == expected


def test_numeric_tolerance_is_relative_above_one_and_absolute_below():
    assert numeric("1000.5", "1000", tolerance=1e-3) == 1.0 and numeric("1001.5", "1000", tolerance=1e-3) == 0.0
    assert numeric("0.0005", "0", tolerance=1e-3) == 1.0 and numeric("0.002", "0", tolerance=1e-3) == 0.0


def test_numeric_reads_what_it_says_and_refuses_a_gold_that_is_not_a_number():
    assert [read_number(t) for t in ("1,234.5", "-7", "+3", "3 / 4", "1e3", "12,34", "")] == \
        [1234.5, -7, 3, 0.75, None, None, None]
    with pytest.raises(ValueError, match="the gold answer 'seven' is not a number"):
        numeric("7", "seven")


@pytest.mark.parametrize("response, gold, expected", [
    ("The answer is (B).", "B", 1.0), ("B", "(B)", 1.0), ("<answer>C</answer>", "C) forty", 1.0),
    ("A) is wrong, so D)", "D", 1.0), ("answer: c", "C", 1.0), ("The answer is (B).", "C", 0.0),
    ("<answer>B. 42</answer>", "B", 1.0), ("I think so", "A", 0.0)])
def test_choice(response, gold, expected):
    assert choice(response, gold) == expected


def test_choice_refuses_a_gold_that_is_not_a_letter():
    with pytest.raises(ValueError, match="not a choice letter"):
        choice("A", "42")


@pytest.mark.parametrize("response, gold", [
    ("\\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{\\dfrac{3}{4}}", "3/4"), ("\\boxed{\\frac{\\frac{1}{2}}{3}}", "1/6"),
    ("<answer>2\\cdot 3</answer>", "6"), ("\\boxed{x = 5}", "5"), ("\\boxed{1{,}000}", "1000"),
    ("\\boxed{\\left(2+3\\right)\\times 4}", "20"), ("\\boxed{12\\text{ cm}}", "12"), ("\\boxed{50\\%}", "50"),
    ("\\boxed{\\$5.00}", "5"), ("the answer is 42.", "42"), ("\\boxed{x+1}", "x + 1"), ("\\boxed{\\frac12}", "1/2"),
    ("\\boxed{6 \\div 4}", "\\frac{3}{2}")])
def test_math_accepts_equivalent_answers(response, gold):
    assert math(response, gold) == 1.0


@pytest.mark.parametrize("response, gold", [
    ("\\boxed{\\frac{1}{3}}", "0.33"), ("\\boxed{7}", "8"), ("\\boxed{1+x}", "x+1"), ("no answer", "3"),
    ("\\boxed{}", "0"), ("\\boxed{2^{10}}", "1024")])
def test_math_refuses_answers_that_are_not_the_same(response, gold):
    assert math(response, gold) == 0.0


def test_math_values_are_exact_fractions():
    assert math_value("\\frac{1}{3} + \\frac{1}{6}") == math_value("0.5") and math_value("0.1+0.2") * 10 == 3


INJECTIONS = ["__import__('os').system('touch {canary}')", "open('{canary}', 'w').write('x')",
              "exec(\"open('{canary}','w')\")", "eval(\"open('{canary}','w')\")", "(lambda: open('{canary}','w'))()",
              "\\input{{{canary}}}", "2**10**10**10"]


@pytest.mark.parametrize("verifier", [exact, numeric, choice, math])
def test_no_verifier_runs_the_text_it_reads(verifier, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a verifier ran text as code")

    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    for i, code in enumerate(INJECTIONS):
        text = code.format(canary=tmp_path / str(i))
        for response in (f"<answer>{text}</answer>", f"\\boxed{{{text}}}", text):
            assert verifier(response, "Z" if verifier is choice else "7") == 0.0
    assert not list(tmp_path.iterdir())

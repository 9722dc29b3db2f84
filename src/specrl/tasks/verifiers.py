"""Built-in answer verifiers: `exact`, `numeric`, `choice` and `math`. None of them runs the text it reads.

Each is `(response, gold) -> 1.0 or 0.0`. The response's answer is taken from, in order:
the last `<answer>...</answer>`, else the last `\\boxed{...}`, else (per verifier) the
whole response (`exact`), its last number (`numeric`, `math`) or its last stated letter (`choice`).

    exact    equal after collapsing whitespace and case ("  Paris " == "paris")
    numeric  |x - y| <= tolerance * max(1, |y|), over integers, decimals, fractions a/b, a leading
             sign and thousands separators (1,234.5); a trailing %, $ or unit word is not read
    choice   the same letter A-Z: the gold may be "B", "(B)" or "B) text"; the response's letter is
             the tagged one, or the last "answer is B" / "(B)" / "B)", or a response that is one letter
    math     the same exact value (a `fractions.Fraction`) when both sides are numbers or arithmetic
             over them, read by `safe_arithmetic` after LaTeX is rewritten: \\frac{a}{b}, \\dfrac,
             \\tfrac, \\cdot, \\times, \\div, \\left( \\right), \\!, \\, and {,} thousands separators,
             $...$, \\text{...} units, a leading "x =" and a trailing period are handled; otherwise the
             same text after that normalisation and dropping spaces

`math` has no symbolic algebra: `x+1` equals `x+1` and `1+x` does not. Nothing reaches
`eval`, `exec`, sympy's `parse_expr` or `sympify`: numbers are read by a regular
expression and arithmetic by `safe_arithmetic`'s grammar, which refuses anything else.
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Callable

from specrl.tasks.safe_arithmetic import parse

MAX_CHARS = 2000  # an answer longer than this is not read (a verifier's regular expressions stay linear anyway)

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|[-+−]?\.\d+")
_LETTER_STATED = re.compile(r"(?:answer|option|choice)\s*(?:is|:)?\s*\(?\s*([A-Z])\b\)?", re.IGNORECASE)
_LETTER_MARKED = re.compile(r"\(([A-Z])\)|\b([A-Z])\)")


def boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced, or None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for at in range(brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[at], 0)
        if depth == 0:
            return text[brace + 1:at]
    return None


def marked_answer(response: str) -> str | None:
    """The last `<answer>` content, else the last `\\boxed{}` content, else None."""
    tagged = _ANSWER_TAG.findall(response)
    if tagged:
        return tagged[-1].strip()
    inside = boxed(response)
    return inside.strip() if inside is not None else None


def _normalise(text: str) -> str:
    return " ".join(str(text).split()).casefold()


def exact(response: str, gold) -> float:
    answer = marked_answer(response)
    answer = response if answer is None else answer
    return float(_normalise(answer) == _normalise(gold))


def read_number(text: str) -> Fraction | None:
    """The value of a number written as text ("1,234", "-0.5", "3/4", "+7"), or None."""
    text = str(text).strip().replace("−", "-")
    if not text or len(text) > 64 or _NUMBER.fullmatch(text) is None:
        return None
    text = text.replace(",", "").replace(" ", "")
    numerator, _, denominator = text.partition("/")
    try:
        value = Fraction(numerator)
        return value / Fraction(denominator) if denominator else value
    except (ValueError, ZeroDivisionError):
        return None


def last_number(text: str) -> Fraction | None:
    numbers = _NUMBER.findall(text[-MAX_CHARS:])
    return read_number(numbers[-1]) if numbers else None


def numeric(response: str, gold, tolerance: float = 1e-6) -> float:
    expected = read_number(gold)
    if expected is None:
        raise ValueError(f"the gold answer {gold!r} is not a number (the numeric verifier reads integers, "
                         "decimals, fractions a/b and thousands separators)")
    marked = marked_answer(response)
    got = last_number(marked if marked is not None else response)
    return float(got is not None and abs(got - expected) <= tolerance * max(1, abs(expected)))


def gold_letter(gold) -> str:
    match = re.match(r"\s*\(?([A-Za-z])(?:\)|\.|:|\s|$)", str(gold))
    if match is None:
        raise ValueError(f"the gold answer {gold!r} is not a choice letter (A-Z, as 'B', '(B)' or 'B) text')")
    return match.group(1).upper()


def response_letter(response: str) -> str | None:
    marked = marked_answer(response)
    text = marked if marked is not None else response[-MAX_CHARS:]
    if re.fullmatch(r"\s*\(?[A-Za-z]\)?[.\s]*", text):
        return re.search(r"[A-Za-z]", text).group(0).upper()
    stated = _LETTER_STATED.findall(text)
    if stated:
        return stated[-1].upper()
    marks = _LETTER_MARKED.findall(text)
    if marks:
        return "".join(marks[-1]).upper()
    if marked is not None:  # a tagged answer that starts with its letter: "<answer>B. 42</answer>"
        found = re.match(r"\s*\(?([A-Z])\b", marked)
        return found.group(1) if found else None
    return None


def choice(response: str, gold) -> float:
    return float(response_letter(response) == gold_letter(gold))


_LATEX_REWRITES = (
    (re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}"), r"(\1)/(\2)"),
    (re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)"), r"(\1)/(\2)"),  # \frac12
    (re.compile(r"\\text\s*\{[^{}]*\}|\\mathrm\s*\{[^{}]*\}"), ""),  # units and words
    (re.compile(r"\\left|\\right|\\[!,;: ]|\\quad|\\displaystyle|\$|\\%|%|\\\$"), ""),
    (re.compile(r"\{,\}"), ""),
    (re.compile(r"\\cdot|\\times"), "*"),
    (re.compile(r"\\div"), "/"),
    (re.compile(r"^\s*[A-Za-z]\s*=\s*"), ""),  # "x = 5"
)


def normalise_math(text: str) -> str:
    """LaTeX rewritten towards plain arithmetic (see the module docstring); braces left are dropped last."""
    text = str(text).strip()
    for pattern, replacement in _LATEX_REWRITES:
        previous = None
        while previous != text:  # nested \frac{\frac{1}{2}}{3}: innermost first
            previous, text = text, pattern.sub(replacement, text)
    text = text.replace("{", "(").replace("}", ")").strip().rstrip(".").strip()
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)


def math_value(text: str) -> Fraction | None:
    """The exact value of a number or arithmetic over numbers written in plain text or simple LaTeX, or None."""
    normal = normalise_math(text)
    number = read_number(normal)
    if number is not None:
        return number
    expression = parse(normal)
    return expression.value if expression is not None else None


def math(response: str, gold) -> float:
    marked = marked_answer(response)
    candidate = marked if marked is not None else (_NUMBER.findall(response[-MAX_CHARS:]) or [None])[-1]
    if candidate is None or len(candidate) > MAX_CHARS:
        return 0.0
    expected, got = math_value(str(gold)), math_value(candidate)
    if expected is not None and got is not None:
        return float(expected == got)
    return float(normalise_math(candidate).replace(" ", "") == normalise_math(str(gold)).replace(" ", ""))


VERIFIERS: dict[str, Callable[..., float]] = {"exact": exact, "numeric": numeric, "choice": choice, "math": math}

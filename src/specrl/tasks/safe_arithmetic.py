"""Exact arithmetic over number literals, read by a small grammar: the model's text is never run.

    expression := term (("+" | "-") term)*
    term       := factor (("*" | "/") factor)*
    factor     := ("+" | "-") factor | number | "(" expression ")"
    number     := digit+ ("." digit+)?          digits are 0-9

`×`, `÷` and `−` (U+2212) read as `*`, `/` and `-`, and whitespace between tokens is ignored.
The operators have Python's precedence and associativity (`8/2/2` is 2, `2-3-4` is -5, `-2*3`
is -6), and the value is exact: a `fractions.Fraction`, so `8/(3-8/3)` is 24, not the
23.999999999999996 of floats, and `0.1+0.2` is 3/10.

Anything else is refused: names, calls, attributes, subscripts, strings, lambdas, `**`, `^`,
`%`, `//`, `!`, literals with an exponent, an underscore or a base prefix, and text too big
to be an answer (over `MAX_CHARS` characters, a literal over `MAX_DIGITS` digits, signs and
parentheses nested over `MAX_DEPTH` deep), and a division by zero. `parse` then returns None;
it raises nothing, and no text reaches `eval`, `compile`, an import or Python's parser.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

MAX_CHARS = 500  # countdown's hardest curriculum level (15 numbers up to 300) needs under 200
MAX_DIGITS = 12  # per literal, both sides of the point
MAX_DEPTH = 32  # nested signs and parentheses

_UNICODE_OPERATORS = str.maketrans({"×": "*", "÷": "/", "−": "-"})
_TOKEN = re.compile(r"\s*(?:([0-9]+(?:\.[0-9]+)?)|([-+*/()]))")  # group 1: a number, group 2: an operator


@dataclass(frozen=True)
class Arithmetic:
    value: Fraction
    numbers: tuple[Fraction, ...]  # the literals, in the order written: "2*(3+3)" -> (2, 3, 3)


class _Refused(Exception):
    """The text is not in the grammar, or is over a bound."""


def parse(text: str | None) -> Arithmetic | None:
    """The exact value and the literals of the arithmetic `text`, or None when it is not arithmetic
    (not a string, empty, outside the grammar, over a bound, or dividing by zero)."""
    if not isinstance(text, str) or len(text) > MAX_CHARS:
        return None
    try:
        return _Parser(_tokens(text.translate(_UNICODE_OPERATORS))).read()
    except _Refused:
        return None


def _tokens(text: str) -> list[str]:
    """"(12 + 3.5)*2" -> ["(", "12", "+", "3.5", ")", "*", "2"]."""
    tokens, at, end = [], 0, len(text.rstrip())
    while at < end:
        match = _TOKEN.match(text, at)
        if match is None:
            raise _Refused(f"not arithmetic at {text[at:at + 10]!r}")
        number, operator = match.groups()
        if number is not None and len(number.replace(".", "")) > MAX_DIGITS:
            raise _Refused(f"a literal over {MAX_DIGITS} digits")
        tokens.append(number or operator)
        at = match.end()
    return tokens


class _Parser:
    """Recursive descent over the tokens, one method per rule of the grammar; values as they are read."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.at, self.depth = tokens, 0, 0
        self.numbers: list[Fraction] = []

    def read(self) -> Arithmetic:
        value = self.expression()
        if self.at != len(self.tokens):
            raise _Refused(f"{self.tokens[self.at]!r} after a complete expression")
        return Arithmetic(value, tuple(self.numbers))

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise _Refused("the expression ends early")
        self.at += 1
        return token

    def expression(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            operator, right = self.take(), self.term()
            value = value + right if operator == "+" else value - right
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            operator, right = self.take(), self.factor()
            if operator == "*":
                value *= right
            elif right == 0:
                raise _Refused("division by zero")
            else:
                value /= right
        return value

    def factor(self) -> Fraction:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Refused(f"signs and parentheses nested over {MAX_DEPTH} deep")
        token = self.take()
        if token in ("+", "-"):
            value = self.factor() if token == "+" else -self.factor()
        elif token == "(":
            value = self.expression()
            if self.take() != ")":
                raise _Refused("an unclosed parenthesis")
        elif token[0].isdigit():
            value = Fraction(token)
            self.numbers.append(value)
        else:
            raise _Refused(f"{token!r} where a number belongs")
        self.depth -= 1
        return value

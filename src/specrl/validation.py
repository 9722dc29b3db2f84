"""Config classes validated from their field types: one scheme for every `*Config`.

A config is a frozen dataclass whose `__post_init__` calls `check_fields(self)`:

    mode: Literal["sync", "async"] = "sync"        a choice: the value must be one of the literals
    top_p: float = within(1.0, "(0, 1]")           a number: finite, inside the interval
    seed: int = 0                                  any finite value of its type

Intervals are written as in mathematics: "[1, inf)" means >= 1, "(0, 1]" means > 0 and <= 1.
An error names the field as users write it (`SECTION.field`, e.g. `rollout.top_p`), the
rule and the value. Checks that relate two fields stay in the class's own `__post_init__`.
"""
from __future__ import annotations

import dataclasses
import math
import typing

_INTERVAL = "interval"


def within(default, interval: str, alias: str = ""):
    """A dataclass field with `default` whose value must lie in `interval`, e.g. "[0, inf)";
    `alias` is the field's usual short name, shown in errors (e.g. "K")."""
    low_open, high_open = interval[0] == "(", interval[-1] == ")"
    low, high = (float(x) for x in interval[1:-1].split(","))
    if interval[0] not in "([" or interval[-1] not in ")]" or not low <= high:
        raise ValueError(f"bad interval {interval!r}")
    if math.isinf(high):  # "[1, inf)" reads better as ">= 1"
        rule = f"{'>' if low_open else '>='} {low:g}"
    else:
        rule = f"in {interval}"
    return dataclasses.field(default=default, metadata={_INTERVAL: (rule, low, high, low_open, high_open),
                                                        "alias": alias})


def choices(cls, name: str) -> tuple:
    """The Literal values a config field accepts (for CLI `choices=`)."""
    hint = typing.get_type_hints(cls)[name]
    options = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    if len(options) == 1 and typing.get_origin(options[0]) is typing.Literal:
        return typing.get_args(options[0])
    raise TypeError(f"{cls.__name__}.{name} is not a Literal field")


def _literal(hint) -> tuple | None:
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union:
        for arg in typing.get_args(hint):
            if typing.get_origin(arg) is typing.Literal:
                return typing.get_args(arg)
    return None


def check_fields(config) -> None:
    """Raise ValueError naming the first field of `config` whose value breaks its type's rule."""
    cls = type(config)
    section = getattr(cls, "SECTION", cls.__name__)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        name = f"{section}.{f.name}"
        allowed = _literal(hints[f.name])
        if allowed is not None and value not in allowed and value is not None:
            raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")
        if _INTERVAL in f.metadata:
            rule, low, high, low_open, high_open = f.metadata[_INTERVAL]
            above = value > low if low_open else value >= low
            below = value < high if high_open else value <= high
            if not (above and below):
                alias = f" ({f.metadata['alias']})" if f.metadata["alias"] else ""
                raise ValueError(f"{name}{alias} must be {rule}, got {value}")

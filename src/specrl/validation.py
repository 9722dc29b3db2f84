"""Config classes validated from their field types: one scheme for every `*Config`.

A config is a frozen dataclass whose `__post_init__` calls `check_fields(self)`:

    mode: Literal["sync", "async"] = "sync"        a choice: the value must be one of the literals
    top_p: float = within(1.0, "(0, 1]")           a number: finite, inside the interval
    seed: int = 0                                  any finite value of its type

Intervals are written as in mathematics: "[1, inf)" means >= 1, "(0, 1]" means > 0 and <= 1.
An error names the field as users write it (`SECTION.field`, e.g. `rollout.top_p`), the
rule and the value. Checks that relate two fields stay in the class's own `__post_init__`.

`build(cls, data)` makes a config from a mapping (a run's presets, JSON file and `key=value` overrides,
`parse_overrides`; a bench's flags), naming an unknown key or a value of the wrong type.
"""
from __future__ import annotations

import dataclasses
import json
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
    allowed = literal_choices(typing.get_type_hints(cls)[name])
    if allowed is None:
        raise TypeError(f"{cls.__name__}.{name} is not a Literal field")
    return allowed


def literal_choices(hint) -> tuple | None:
    """The values a `Literal[...]` or `Literal[...] | None` hint allows; None for any other hint."""
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
        allowed = literal_choices(hints[f.name])
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


_SCALARS = {int: (int,), float: (int, float), bool: (bool,), str: (str,), dict: (dict,)}


def _check_type(path: str, hint, value) -> None:
    """Scalars must have their field's type (an int is fine where a float is expected); a tuple field takes a
    list or tuple whose items have its item type."""
    options = (hint,) if typing.get_origin(hint) is tuple else typing.get_args(hint) or (hint,)
    if value is None and type(None) in options:
        return
    for option in options:
        if typing.get_origin(option) is tuple:
            if not isinstance(value, (list, tuple)):
                raise ValueError(f"config key '{path}' expects a list, got {value!r}")
            for element in value:
                _check_type(path, typing.get_args(option)[0], element)
            return
    accepted = tuple(t for option in options for t in _SCALARS.get(option, ()))
    if accepted and (not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted)):
        raise ValueError(f"config key '{path}' expects {hint}, got {value!r}")


def build(cls, data: dict, where: str = ""):
    """The dataclass `cls` built from `data` (nested dataclass fields from nested mappings), naming unknown keys
    and values of the wrong type; each class's own checks (`check_fields`) run as it is built."""
    if not isinstance(data, dict):
        raise ValueError(f"config section '{where or 'root'}' must be a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    prefix = f"{where}." if where else ""
    for key in unknown:  # a key a section dropped: say why, not just that it is unknown
        if key in getattr(cls, "REMOVED", {}):
            raise ValueError(f"config key '{prefix}{key}' was removed: {cls.REMOVED[key]}")
    if unknown:
        raise ValueError(f"unknown config key(s) {[prefix + k for k in unknown]}; known in "
                         f"'{where or 'root'}': {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        hint = hints[name]
        path = f"{prefix}{name}"
        if dataclasses.is_dataclass(hint):
            kwargs[name] = build(hint, value, path)
        else:
            _check_type(path, hint, value)
            kwargs[name] = tuple(value) if isinstance(value, list) and "tuple" in str(hint) else value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ValueError(f"invalid config '{where or 'root'}': {err}") from err


def parse_overrides(items) -> dict:
    """`["grpo.group_size=4", "run.steps=10"]` -> {"grpo": {"group_size": 4}, "run": {"steps": 10}}: each value
    read as JSON where it parses (numbers, true/false, null, lists), else kept as text."""
    data: dict = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value (e.g. grpo.group_size=4)")
        key, text = item.split("=", 1)
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        *sections, leaf = key.split(".")
        node = data
        for section in sections:
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r}: {section} is set to a value and used as a section")
        node[leaf] = value
    return data

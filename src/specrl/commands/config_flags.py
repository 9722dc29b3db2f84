"""A command's flags made from its config class: one flag per field, its help the comment on the field.

    add_config_flags(parser, RolloutBenchConfig, aliases=(Alias("--fixed-k", "adaptive", False, "..."),))
    config = config_from_args(RolloutBenchConfig, args)

A field `max_tokens: int | None = 128  # response cap` becomes `--max-tokens MAX_TOKENS` with that help and its default;
a bool field `hf` becomes `--hf / --no-hf`; a tuple field takes a comma-separated list; a Literal field lists its
choices; `none` gives None to an optional field. The command also takes `--config FILE` (JSON of the
fields; where the class has a field `config`, a job's config file, that field takes the flag) and `key=value`
overrides, applied in that order after the defaults: the flags are overrides too. The config is then built and
validated once, by the same rules as a run's config (`validation.build`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from pathlib import Path

from specrl.pipeline.config_reference import field_comments
from specrl.validation import build, literal_choices, parse_overrides

_PREFIX = "config_field:"  # the parsed flags' attribute names: apart from the command's own arguments


@dataclasses.dataclass(frozen=True)
class Alias:
    """A flag kept for a field under another name, setting it to `value` (a switch) or to the flag's argument
    (value None)."""
    flag: str
    field: str
    value: object = None
    help: str = ""


def _element_type(hint) -> type:
    """int for `int`, `int | None`, `tuple[int, ...]`; the same for float and str."""
    args = [a for a in typing.get_args(hint) if a is not type(None) and a is not Ellipsis] or [hint]
    inner = args[0]
    if typing.get_origin(inner) is tuple:
        return _element_type(inner)
    if typing.get_origin(inner) is typing.Literal:
        return type(typing.get_args(inner)[0])
    return inner if inner in (int, float, str) else str


def _is_tuple(hint) -> bool:
    return typing.get_origin(hint) is tuple or any(typing.get_origin(a) is tuple for a in typing.get_args(hint))


def _converter(name: str, hint):
    """Text -> the field's value: `none` for an optional field's None, commas for a tuple."""
    element, optional, many = _element_type(hint), type(None) in typing.get_args(hint), _is_tuple(hint)

    def convert(text: str):
        if optional and text.lower() == "none":
            return None
        try:
            return tuple(element(x) for x in text.split(",") if x) if many else element(text)
        except ValueError:
            kind = {int: "integer", float: "number"}.get(element, "value")
            kind = f"comma-separated {kind}s" if many else f"an {kind}" if kind == "integer" else f"a {kind}"
            raise argparse.ArgumentTypeError(f"{name} takes {kind}, got {text!r}") from None
    return convert


def _shown(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def add_config_flags(parser: argparse.ArgumentParser, cls, aliases: typing.Sequence[Alias] = ()) -> None:
    """`--config FILE`, `KEY=VALUE` overrides and one flag per field of the config class `cls`."""
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="field overrides, after --config and flags")
    comments, hints = field_comments(cls), typing.get_type_hints(cls)
    if "config" not in hints:  # a field of that name (a job's config file) takes the flag
        parser.add_argument("--config", dest=_PREFIX + "file", metavar="FILE", default=None,
                            help="JSON file of field values, applied before the flags")
    group = parser.add_argument_group("fields (each also as KEY=VALUE)")
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        hint, flag = hints[f.name], "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        text = f"{comments.get(f.name, '')} (default: {_shown(default)})".strip()
        if hint is bool:
            group.add_argument(flag, dest=_PREFIX + f.name, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=text)
            continue
        choices = literal_choices(hint)
        metavar = f.name.upper() if choices is None else "{" + ",".join(map(str, choices)) + "}"
        if choices is not None and type(None) in typing.get_args(hint):
            choices = (*choices, None)  # `none` reads as None
        group.add_argument(flag, dest=_PREFIX + f.name, default=argparse.SUPPRESS, type=_converter(flag, hint),
                           choices=choices, metavar=metavar, help=text)
    for alias in aliases:
        if alias.value is None:
            group.add_argument(alias.flag, dest=_PREFIX + alias.field, default=argparse.SUPPRESS, help=alias.help,
                               type=_converter(alias.flag, hints[alias.field]), metavar=alias.field.upper())
        else:
            group.add_argument(alias.flag, dest=_PREFIX + alias.field, action="store_const", const=alias.value,
                               default=argparse.SUPPRESS, help=alias.help)


def config_from_args(cls, args: argparse.Namespace):
    """The defaults of `cls`, then `--config FILE`, then the flags, then `key=value` overrides: built and
    validated once."""
    data: dict = {}
    file = getattr(args, _PREFIX + "file", None)
    if file is not None:
        try:
            data = json.loads(Path(file).read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"--config {file}: not valid JSON ({err})") from err
        if not isinstance(data, dict):
            raise ValueError(f"--config {file}: must hold a JSON object of field values, got {type(data).__name__}")
    flags = {name[len(_PREFIX):]: value for name, value in vars(args).items()
             if name.startswith(_PREFIX) and name != _PREFIX + "file"}
    return build(cls, {**data, **flags, **parse_overrides(getattr(args, "overrides", []))}, "")

"""Every config key of a run, with its default and what it does, read from the config classes themselves.

`config_keys(TrainConfig)` -> [(key, default, comment)]: each section's fields in order, the comment being
the one on the field's line (or the comment lines right above it) in the class's source. `specrl train
--help` prints them, so the reference a user reads is the code's own and cannot drift from it.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
import typing

_FIELD = re.compile(r"^\s+(\w+)\s*:\s*[^=#]+?(?:=.*?)?(?:#\s*(.*))?$")


def field_comments(cls) -> dict[str, str]:
    """{field name: its comment} from the source of `cls` and the dataclasses it extends (a comment block just
    above a field counts as its comment)."""
    comments = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            comments.update(_own_comments(base))
    return comments


def _own_comments(cls) -> dict[str, str]:
    comments, above = {}, []
    for line in inspect.getsource(cls).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# ").strip())
            continue
        match = _FIELD.match(line)
        if match and not stripped.startswith(("def ", "@", "return", "SECTION", "REMOVED")):
            name, inline = match.groups()
            inline = re.sub(r"^type:\s*ignore\[[^\]]*\]\s*(#\s*)?", "", inline or "").strip()
            comments[name] = " ".join(above + ([inline] if inline else []))
        above = []
    return comments


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def config_keys(root) -> list[tuple[str, object, str]]:
    """(section.key, default, comment) for every leaf field under the dataclass `root`."""
    out = []
    hints = typing.get_type_hints(root)
    for section in dataclasses.fields(root):
        cls = hints[section.name]
        comments = field_comments(cls)
        for f in dataclasses.fields(cls):
            if f.init:
                out.append((f"{section.name}.{f.name}", _default(f), comments.get(f.name, "")))
    return out


def keys_help(root) -> str:
    """The keys as an argparse epilog: one `section.key = default  comment` line each, sections apart."""
    lines, section = ["config keys (key=value; defaults before any preset):"], None
    for key, default, comment in config_keys(root):
        if key.split(".")[0] != section:
            section = key.split(".")[0]
            lines.append("")
        lines.append(f"  {key} = {default!r}" + (f"  # {comment}" if comment else ""))
    return "\n".join(lines)

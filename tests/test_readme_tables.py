"""The README's CLI table is checked against the parser, and its package table against the proposer registry,
so neither can drift: every command the parser has has its row and every row names a real command; every flag a
row shows is one its command takes, and every choice list a row shows (`--proposer none|ngram|...`) is exactly
the choices the parser offers; the `speculation/` row names every draft family's module."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from specrl.cli import build_parser
from specrl.speculation.proposer_registry import KINDS

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def table(header: str) -> list[list[str]]:
    """The rows of the README table that starts with `header`, as lists of cells."""
    lines = README[README.index(header):].split("\n\n")[0].splitlines()[2:]
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines]


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def commands() -> dict[str, argparse.ArgumentParser]:
    """'train', 'bench rollout', ...: every leaf command of the CLI, with its parser."""
    leaves = {}
    for name, sub in subparsers(build_parser()).items():
        kinds = subparsers(sub)
        leaves.update({f"{name} {kind}": p for kind, p in kinds.items()} if kinds else {name: sub})
    return leaves


def readme_commands() -> dict[str, str]:
    """Each CLI row's command ('bench rollout') -> its usage and the options its description shows (code spans
    that start with --), unescaped."""
    rows = {}
    for usage, what in table("| command | what it does |"):
        words = usage.strip("`").split()[1:]  # after "specrl"
        name = " ".join(words[:2]) if words[0] == "bench" else words[0]
        options = [span for span in re.findall(r"`([^`]*)`", what) if span.startswith("--")]
        rows[name] = " ".join([usage.strip("`"), *options]).replace("\\|", "|")
    return rows


def test_every_command_has_a_row_and_every_row_is_a_command():
    assert set(readme_commands()) == set(commands())


def test_every_flag_and_choice_list_a_row_shows_is_what_its_command_takes():
    parsers = commands()
    for name, usage in readme_commands().items():
        options = {s: a for a in parsers[name]._actions for s in a.option_strings}
        for flag, value in re.findall(r"(--[a-z-]+)(?: ([^\s\]`]+))?", usage):
            assert flag in options, f"README: `specrl {name}` shows {flag}, which it does not take"
            if value and "|" in value and options[flag].choices is not None:
                assert set(value.split("|")) == set(options[flag].choices), \
                    f"README: `specrl {name} {flag}` lists {value}, the parser offers {sorted(options[flag].choices)}"


def test_the_speculation_row_names_every_draft_familys_module():
    row = next(cells[1] for cells in table("| package (top of the stack first) |") if cells[0] == "`speculation/`")
    named = set(re.findall(r"`([a-z_0-9]+)`", row))
    modules = {plugin.build.__module__.rsplit(".", 1)[-1] for plugin in KINDS.values()}
    assert modules <= named, f"the README's speculation row lacks the family modules {sorted(modules - named)}"

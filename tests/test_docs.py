"""Commands printed in the README and docs/*.md work: each `specrl ...` command, in a code block or a code
span, parses with the real argument parser, and each `python -m specrl...` module exists and runs as a script.

Usage notation is read as usage: `[...]` marks optional parts, `a|b` alternatives (the first is parsed),
and an upper-case word (`B`, `RUN_DIR`, `FILE`) a value the reader fills in.
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from specrl.cli import build_parser, parse

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
SPAN = re.compile(r"`((?:\.venv/bin/)?specrl [^`]+)`")
PLACEHOLDER = re.compile(r"[A-Z][A-Z_]*")


def printed_commands(text: str) -> list[str]:
    """The arguments of every `specrl` command a page prints (line continuations joined, comments dropped)."""
    found = []
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            match = re.match(r"^(?:\S+=\S*\s+)*(?:\.venv/bin/)?specrl\s+(.*)$", line.split(" #")[0].strip())
            if match:
                found.append(match.group(1))
    found += [span.split("specrl ", 1)[1] for span in SPAN.findall(FENCE.sub("", text))]
    return [" ".join(command.split()) for command in found]


def usage_to_argv(command: str) -> list[str]:
    """`bench rollout --batch B [--k 3] --proposer a\\|b` -> ['bench', 'rollout', '--k', '3', '--proposer', 'a']:
    brackets and ellipses dropped, the first alternative kept, a placeholder after a flag dropped with its flag,
    and a positional placeholder filled with a dummy value."""
    text = command.replace("[", " ").replace("]", " ").replace("...", " ")
    text = re.sub(r"(\S+?)\\?\|\S+", r"\1", text)
    argv = []
    for token in shlex.split(text):
        if PLACEHOLDER.fullmatch(token):
            if argv and argv[-1].startswith("--"):
                argv.pop()
            else:
                argv.append("placeholder")
            continue
        argv.append(token)
    return argv


class _Refused(Exception):
    pass


def check_parses(argv: list[str]) -> None:
    parser = build_parser()

    def refuse(self, message):
        raise _Refused(message)

    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = refuse
    try:
        parse(parser, argv)
    finally:
        argparse.ArgumentParser.error = original


COMMANDS = [(page.name, command) for page in PAGES for command in printed_commands(page.read_text())]


def test_the_pages_print_commands_at_all():
    assert len(COMMANDS) > 50 and {"README.md", "tasks.md"} <= {page for page, _ in COMMANDS}


@pytest.mark.parametrize("page, command", COMMANDS, ids=[f"{p}: {c[:60]}" for p, c in COMMANDS])
def test_every_printed_specrl_command_parses(page, command):
    try:
        check_parses(usage_to_argv(command))
    except _Refused as err:
        pytest.fail(f"{page} prints `specrl {command}`, which the CLI refuses: {err}")


def test_a_stale_command_is_caught():
    with pytest.raises(_Refused, match="--no-such-flag"):
        check_parses(usage_to_argv("bench rollout --model tiny --no-such-flag 3"))
    with pytest.raises(_Refused, match="invalid choice"):
        check_parses(usage_to_argv("bench rollout --proposer nothing"))


MODULES = sorted({m for page in PAGES for m in re.findall(r"python -m (specrl[\w.]*)", page.read_text())})


@pytest.mark.parametrize("module", MODULES)
def test_every_printed_python_module_exists_and_runs_as_a_script(module):
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"`python -m {module}` is printed in the docs, and no such module exists"
    source = Path(spec.origin).read_text()
    assert 'if __name__ == "__main__"' in source or spec.submodule_search_locations, \
        f"`python -m {module}` is printed in the docs, and the module does nothing as a script"


def test_specrl_train_help_lists_every_config_key_with_its_default_and_comment():
    from specrl.pipeline.config import TrainConfig
    from specrl.pipeline.config_reference import config_keys

    keys = config_keys(TrainConfig)
    undocumented = [key for key, _, comment in keys if not comment]
    assert not undocumented, f"config keys without a comment to show in `specrl train --help`: {undocumented}"
    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for key, default, _ in keys:
        assert f"  {key} = {default!r}" in help_text
    assert "task.reward = None  # one reward, or {name: weight}" in help_text


def test_the_planners_reasons_table_is_the_planners_own():
    from specrl.speculation.planner import REASONS

    page = (ROOT / "docs" / "drafters.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z-]+)` \| (.+?) \|$", page[page.index("| reason | the step |"):], re.M))
    assert rows == REASONS


PACKAGE = ROOT / "src" / "specrl"
REPO_PATH = re.compile(r"`((?:src|tests|docs|examples|\.ci)/[\w./-]*|(?:%s)/[\w./-]*|test_\w+\.py)`|\]\(((?!https?:)[^)#\s]+)"
                       % "|".join(p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_")))
UNCOMMITTED = re.compile(r"runs/[\w./-]+\.(?:py|sh)\b|\bissue (?:#\d+|tracker)\b|\bthe issue's\b|\(#\d+\)")


def named_repository_paths(text: str, page: Path) -> list[str]:
    """Paths into the repository a page names (in code spans or as link targets) that do not exist: tried from
    the repository root, the page's folder and the package, and a test file by its name under tests/."""
    missing = []
    for span, link in REPO_PATH.findall(text):
        path = span or link
        module = path.rsplit(".", 1)[0] + ".py"  # `speculation/tree.verify_tree`: a name in a module
        found = any((base / p).exists() for base in (ROOT, page.parent, PACKAGE) for p in (path, module))
        if not found and not any((ROOT / "tests").glob(f"**/{path}")):  # a test file by its name
            missing.append(path)
    return missing


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_repository_path_a_page_names_exists(page):
    assert not named_repository_paths(page.read_text(), page), f"{page.name} names paths that do not exist"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_no_page_cites_an_uncommitted_script_or_the_issue_tracker(page):
    found = UNCOMMITTED.findall(page.read_text())
    assert not found, f"{page.name} cites what a reader cannot see: {found}"


def test_a_stale_path_and_an_uncommitted_script_are_caught():
    page = ROOT / "docs" / "planted.md"
    assert named_repository_paths("see `speculation/no_such_module.py` and [it](docs/nothing.md)", page) == \
        ["speculation/no_such_module.py", "docs/nothing.md"]
    assert named_repository_paths("see `speculation/planner.py`, `test_planner.py` and [d](drafters.md)", page) == []
    assert UNCOMMITTED.findall("measured by runs/s44/replay.py, as the issue's targets ask (issue #49)")

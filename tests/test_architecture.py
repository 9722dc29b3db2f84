"""The packages form a stack (README.md's package table, top first): a module imports only from its own row
or the rows below it. Every import is checked, lazy ones inside functions too, and every top-level package
or module must have its row, so a new one is placed on purpose."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "specrl"


def stack() -> dict[str, int]:
    """Top-level name -> its row's height (0 = the bottom row), read from the README's package table."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| package (top of the stack first) |"):].split("\n\n")[0].splitlines()[2:]
    rows = [re.findall(r"`([a-z_]+)(?:/|\.py)`", line.split("|")[1]) for line in table]
    return {name: len(rows) - 1 - height for height, names in enumerate(rows) for name in names}


def imports(path: Path) -> list[tuple[str, int]]:
    """The top-level specrl names a module imports, with the line of each import."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        modules = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
            [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        found += [(module.split(".")[1], node.lineno) for module in modules if module.startswith("specrl.")]
    return found


def upward_imports(rank: dict[str, int]) -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for name, line in imports(path):
            if name != own and rank[name] > rank[own]:
                found.append(f"{path.relative_to(ROOT)}:{line} imports specrl.{name} (a row above {own})")
    return found


def test_every_top_level_package_has_a_row_in_the_readme_table():
    names = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
             if (p.is_dir() and (p / "__init__.py").is_file()) or (p.suffix == ".py" and p.name != "__init__.py")}
    assert names - set(stack()) == set()


def test_no_module_imports_from_a_row_above_its_own():
    assert upward_imports(stack()) == []


def test_the_check_sees_an_upward_import_when_the_stack_is_turned_over():
    rank = stack()
    flipped = {name: -height for name, height in rank.items()}
    assert any("imports specrl.models" in line for line in upward_imports(flipped))

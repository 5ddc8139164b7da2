"""docs/architecture.md's module table lists exactly the product's Python modules.

The product packages are import-linter's `root_packages` (pyproject.toml), so a package added
there (e.g. `kube/`) is checked without editing this test. A module added, moved or removed
without its row in the table fails here, naming it.
"""

import re
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
TABLE_HEADING = "## Modules"


def product_packages() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages: list[str] = config["tool"]["importlinter"]["root_packages"]
    return packages


def modules_in_tree() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for package in product_packages()
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py"
    }


def modules_in_table(text: str) -> list[str]:
    """The first cell of each row of the table under `## Modules`, a `path.py` in backticks."""
    section = text.split(f"\n{TABLE_HEADING}\n", 1)[1].split("\n## ", 1)[0]
    return [
        match.group(1)
        for line in section.splitlines()
        if (match := re.match(r"\| `([\w/]+\.py)` \|", line))
    ]


def test_the_module_table_lists_every_product_module_once() -> None:
    listed = modules_in_table(ARCHITECTURE.read_text())
    duplicated = sorted({m for m in listed if listed.count(m) > 1})
    assert not duplicated, f"listed more than once in docs/architecture.md: {duplicated}"
    tree = modules_in_tree()
    assert sorted(tree - set(listed)) == [], "modules missing from docs/architecture.md"
    assert sorted(set(listed) - tree) == [], "docs/architecture.md lists modules that do not exist"


def test_the_table_parser_sees_rows() -> None:
    rows = ["| module | what |", "|---|---|", "| `api/a.py` | A |", ""]
    text = "\n".join(["x", TABLE_HEADING, "", *rows, "## Next", "| `b.py` | B |", ""])
    assert modules_in_table(text) == ["api/a.py"]

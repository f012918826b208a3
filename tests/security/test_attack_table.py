"""RELIABILITY.md's attack table names tests that exist: a row cannot claim a test that was
renamed or removed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CELL = re.compile(r"`(test_\w+\.py)::(test_\w+)`")


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def _file(name: str) -> Path:
    found = [p for p in (ROOT / "tests").rglob(name) if p.is_file()]
    assert len(found) == 1, f"{name}: {len(found)} files of that name under tests/"
    return found[0]


def test_every_test_the_attack_table_names_exists() -> None:
    text = (ROOT / "RELIABILITY.md").read_text(encoding="utf-8")
    table = text[text.index("## Attacks") :]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`test_" in line]
    assert len(rows) >= 30
    for row in rows:
        cells = CELL.findall(row)
        assert cells, f"a row names no test: {row[:80]}"
        for name, test in cells:
            assert test in _tests_in(_file(name)), f"{name}::{test} does not exist"


def test_the_command_that_runs_them_all_runs_every_test_the_table_names() -> None:
    """The table's "to run them all" command, as printed: every file a row names is under
    one of its paths (a row naming tests/test_real_fleet_e2e.py was left out of it)."""
    text = (ROOT / "RELIABILITY.md").read_text(encoding="utf-8")
    table = text[text.index("## Attacks") :]
    start = table.index("    .venv/bin/pytest ")
    command = table[start : table.index("\n\n", start)].replace("\\\n", " ").split()
    assert command[0] == ".venv/bin/pytest"
    paths = [ROOT / p for p in command[1:]]
    assert all(p.exists() for p in paths), [p for p in paths if not p.exists()]
    for name in {n for n, _ in CELL.findall(table)}:
        found = _file(name)
        assert any(found == p or p in found.parents for p in paths), f"{name} is not run"

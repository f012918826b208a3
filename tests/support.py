"""Shared test helpers: rulebooks from text, facts over healthy defaults."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from controller.engine import Engine
from controller.rulebook import Rulebook, load_texts
from controller.ruletest import DEFAULTS


def book_of(text: str, path: str = "rules/test.yaml") -> Rulebook:
    return load_texts([(path, text)])


def engine_of(text: str) -> Engine:
    return Engine(book_of(text))


def fact(kind: str, id: str | None = None, **fields: Any) -> dict[str, Any]:
    """A fact of `kind` over healthy defaults (a serving instance, an empty queue)."""
    default_id = {"fleet": "fleet", "demand": "demand:all"}.get(kind, f"{kind}-x")
    out = {"kind": kind, **DEFAULTS[kind], **fields}
    out["id"] = id or (f"sensor:{out['name']}" if kind == "sensor" else default_id)
    return out


# Data-file tests (tests/data/rules, tests/data/config): each bad file states what it expects in
# `# expect: LINE: TEXT` lines; a `# xfail: REASON` line marks a known, not yet fixed defect.
ROOT = Path(__file__).resolve().parents[1]
EXPECT = re.compile(r"^# expect: (\d+): (.+)$", re.MULTILINE)
XFAIL = re.compile(r"^# xfail: (.+)$", re.MULTILINE)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def cases(paths: Sequence[Path]) -> list[Any]:
    """One pytest param per data file, strictly xfailed where it names a known defect."""
    out = []
    for path in paths:
        known_bug = XFAIL.search(read(path))
        marks = [pytest.mark.xfail(strict=True, reason=known_bug[1])] if known_bug else []
        out.append(pytest.param(path, id=path.stem, marks=marks))
    return out

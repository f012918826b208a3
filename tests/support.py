"""Shared test helpers: rulebooks from text, facts over healthy defaults."""

from __future__ import annotations

from typing import Any

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

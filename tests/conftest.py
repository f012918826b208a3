"""Fixtures shared by test modules (helpers that are plain functions live in support.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """`cli.main` points the root logger at the (captured) stderr; put it back afterwards, in
    every test, so no later test logs to a capture that pytest has closed."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)

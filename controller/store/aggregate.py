"""What every part of the journal shares: the store it runs on, and how values are stored.

The journal is split by aggregate (`controller/store/journal.py`): each part owns a few tables,
declares them (`SCHEMA`, and `COLUMNS` added to them since they were first shipped), and reads
and writes only them, over the one store all parts share. JSON columns are written sorted, so
that equal values are equal strings.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from controller.store.backend import Row, Store, Tx

# json.dumps(..., sort_keys=True, default=str) without an encoder made per call (a tick
# writes many JSON columns)
_ENCODER = json.JSONEncoder(sort_keys=True, default=str)


def dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def loads(text: str | None, default: Any = None) -> Any:
    """A JSON column's value; `default` for NULL or empty."""
    return json.loads(text) if text else default


class Aggregate:
    """One part of the journal: a narrow interface over its own tables."""

    SCHEMA: ClassVar[str] = ""  # CREATE ... IF NOT EXISTS statements, `;`-separated
    COLUMNS: ClassVar[tuple[tuple[str, str, str], ...]] = ()  # (table, column, declaration)

    def __init__(self, store: Store) -> None:
        self.store = store

    def tx(self) -> AbstractContextManager[Tx]:
        """One atomic transaction."""
        return self.store.tx()

    def _all(self, sql: str, args: Iterable[Any] = ()) -> list[Row]:
        return self.store.query(sql, tuple(args))

    def _one(self, sql: str, args: Iterable[Any] = ()) -> Row | None:
        rows = self._all(sql, args)
        return rows[0] if rows else None

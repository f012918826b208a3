"""The journal: everything the controller did and remembers, in SQLite or PostgreSQL.

One store (`controller/store/backend.py`: the SQL is written once, portable), split by
aggregate, each a narrow interface over its own tables:

    journal.meta         ticks, rule reloads, the key/value store (pause switch, simulator state)
    journal.actions      intents and actions (fenced by the lease), launches, replacements
    journal.escalations  escalations and their deliveries
    journal.fleet        tracks, events, hosts; the history a tick decides from
    journal.llm          LLM calls and the budget's usage
    journal.rule_pending rules waiting out their `for:` (since when each condition has held)
    journal.demand       demand and its forecast per tick (what the forecast learns from)
    journal.totals       what retention deleted, as the metrics counted it (running totals)

The leader lease (`controller/store/lease.py`) and the instance records
(`controller/store/records.py`) work on the same store through `tx()`.

Opening a journal creates what is missing: every table and index (`CREATE ... IF NOT EXISTS`),
then every column added since a table first shipped (each part's `COLUMNS`), so a journal
written by an earlier version opens and is brought up to date in place. One written by a later
version that stores what this one cannot read (`controller.store.meta.FORMAT`) is refused.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

from controller.store import lease
from controller.store.actions import Actions
from controller.store.aggregate import Aggregate
from controller.store.backend import (
    WAIT_S,
    JournalError,
    SQLiteStore,
    StaleLeader,
    Store,
    Tx,
    statements,
)
from controller.store.demand import DemandHistory
from controller.store.escalations import Escalations
from controller.store.fleet import Fleet
from controller.store.llm_usage import LlmUsage
from controller.store.meta import Meta
from controller.store.rule_pending import RulePending
from controller.store.totals import Totals

__all__ = ["Journal", "JournalError", "StaleLeader"]


class Journal:
    """The store behind every record. All parts are safe from the scheduler and the CLI."""

    def __init__(self, where: str | Path | Store, *, read_only: bool = False,
                 wait_s: float = WAIT_S) -> None:  # fmt: skip
        """`read_only` opens an existing SQLite journal for reading only: nothing is created
        and any write fails (what `explain` runs on); `wait_s`, how long a statement on a
        SQLite journal waits for another connection's write."""
        if isinstance(where, str | Path):
            where = SQLiteStore(where, read_only=read_only, wait_s=wait_s)
        self.store: Store = where
        self.path: Path | None = getattr(self.store, "path", None)
        self.meta = Meta(self.store)
        self.actions = Actions(self.store)
        self.escalations = Escalations(self.store)
        self.fleet = Fleet(self.store)
        self.llm = LlmUsage(self.store)
        self.rule_pending = RulePending(self.store)
        self.demand = DemandHistory(self.store)
        self.totals = Totals(self.store)
        try:
            if not read_only:
                self._create((self.meta, self.actions, self.escalations, self.fleet, self.llm,
                              self.demand, self.rule_pending, self.totals))  # fmt: skip
            self.meta.check_format(mark=not read_only)  # a later release's: refused
        except JournalError:
            self.store.close()
            raise

    def _create(self, parts: tuple[Aggregate, ...]) -> None:
        self.store.create(statements("".join(p.SCHEMA for p in parts) + lease.SCHEMA))
        for part in parts:
            for table, column, decl in part.COLUMNS:
                self.store.add_column(table, column, decl)

    def tx(self) -> AbstractContextManager[Tx]:
        """One atomic transaction (inside one already open: a savepoint of it)."""
        return self.store.tx()

    def close(self) -> None:
        self.store.close()

"""Journal retention: rows older than `retention.days` are deleted, a small batch at a time.

At 1,000 instances a tick journals a few kB (the tick, its actions, the fleet's events, LLM
calls), gigabytes a year; nothing a tick decides from looks back further than a day (the
fleet's history: 3 h; the LLM budget: a day), so older rows are the record only. What is
deleted, by its time column, older than `now - days`:

    ticks, actions (finished ones; never an open intent, an unknown outcome, or a launch that
    rented an instance: those say which instances fleetgate owns), events, llm_calls,
    llm_usage, rule_reloads, deliveries, escalations no longer pending, outbox jobs done,
    demand_history.

Kept whatever their age: the fleet's tracks and hosts (current state), the key/value store,
the lease, replacements. `now` is the controller's clock (virtual on the simulator), passed in.

1. each table in turn: delete up to `batch` of its old rows in one short transaction (the
   controller's own writes wait at most one batch), until fewer than `batch` are left;
2. stop early when `budget_s` of wall time is spent: `Pruner` goes on at the next tick;
3. return the rows deleted per table (the service logs them; `fleetgate prune` prints them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from controller.store.backend import JournalError, Store

log = logging.getLogger(__name__)

DAY = 86_400.0

# (table, condition on the rows that may go; `?` is the cutoff)
RULES: tuple[tuple[str, str], ...] = (
    ("ticks", "started_at < ?"),
    ("actions", "at < ? AND status NOT IN ('intent', 'unknown') "
                "AND NOT (action = 'launch' AND status = 'ok' AND parent_id IS NOT NULL)"),
    ("events", "at < ?"),
    ("llm_calls", "at < ?"),
    ("llm_usage", "at < ?"),
    ("rule_reloads", "at < ?"),
    ("deliveries", "at < ?"),
    ("escalations", "created_at < ? AND status != 'pending'"),
    ("outbox", "done_at IS NOT NULL AND done_at < ?"),
    ("demand_history", "at < ?"),
)  # fmt: skip


class RetentionSettings(BaseModel):
    """How long the journal keeps its record (the `retention` section of the config)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    days: float | None = Field(
        90, ge=1, description="keep this many days of ticks, actions, events, LLM calls; "
        "null: keep everything (the shortest is 1: a tick reads a day back)"
    )  # fmt: skip
    every_s: float = Field(3600, gt=0, description="how often `run` prunes (real seconds)")
    batch: int = Field(500, ge=1, le=100_000, description="rows deleted per transaction")


def prune(
    store: Store,
    now: float,
    days: float,
    *,
    batch: int = 500,
    budget_s: float | None = None,
    monotonic: Callable[[], float] = time.monotonic,
) -> tuple[dict[str, int], bool]:
    """Steps 1 to 3: (rows deleted per table, whether everything old is gone)."""
    cutoff = now - days * DAY
    started = monotonic()
    deleted: dict[str, int] = {}
    for table, where in _present(store):
        while True:
            if budget_s is not None and monotonic() - started > budget_s:
                return deleted, False
            with store.tx() as db:
                n = db.execute(f"DELETE FROM {table} WHERE id IN "
                               f"(SELECT id FROM {table} WHERE {where} LIMIT ?)",
                               (cutoff, batch)).rowcount  # fmt: skip
            if n:
                deleted[table] = deleted.get(table, 0) + n
            if n < batch:
                break
    return deleted, True


def count(store: Store, now: float, days: float) -> dict[str, int]:
    """What `prune` would delete (for `fleetgate prune --dry-run`)."""
    cutoff = now - days * DAY
    out = {}
    for table, where in _present(store):
        rows = store.query(f"SELECT COUNT(*) AS n FROM {table} WHERE {where}", (cutoff,))
        if rows and rows[0]["n"]:
            out[table] = int(rows[0]["n"])
    return out


def _present(store: Store) -> list[tuple[str, str]]:
    """The rules whose table exists (the outbox's is created by its first user)."""
    out = []
    for table, where in RULES:
        try:
            store.query(f"SELECT 1 FROM {table} LIMIT 0", ())
        except JournalError:
            continue
        out.append((table, where))
    return out


@dataclass
class Pruner:
    """The service's retention: after a tick, at most once every `every_s` (wall clock),
    `budget_s` of deleting; a pass cut short goes on after the next tick."""

    store: Store
    settings: RetentionSettings
    budget_s: float = 0.5
    monotonic: Callable[[], float] = time.monotonic
    _due: float = field(default=0.0, init=False)

    def after_tick(self, now: float) -> dict[str, int]:
        days = self.settings.days
        if days is None or self.monotonic() < self._due:
            return {}
        deleted, done = prune(self.store, now, days, batch=self.settings.batch,
                              budget_s=self.budget_s, monotonic=self.monotonic)  # fmt: skip
        if done:
            self._due = self.monotonic() + self.settings.every_s
        if deleted:
            log.info("journal retention (%g days): deleted %s%s", days,
                     ", ".join(f"{n} {t}" for t, n in deleted.items()),
                     "" if done else "; more after the next tick",
                     extra={"deleted": deleted})  # fmt: skip
        return deleted

"""Journal retention: rows older than `retention.days` are deleted, a small batch at a time.

At 1,000 instances a tick journals a few kB (the tick, its actions, the fleet's events, LLM
calls), gigabytes a year; nothing a tick decides from looks back further than a day (the
fleet's history: 3 h; the LLM budget: a day), so older rows are the record only. What is
deleted, by its time column, older than `now - days`:

    ticks, actions (finished ones; never an open intent or an unknown outcome), events (not
    an autonomy demotion), llm_calls, llm_usage, rule_reloads, deliveries, escalations no
    longer pending, outbox jobs done, demand_history.

A launch that rented an instance says that fleetgate owns it (vast may list it with an empty
label), so it stays while the instance may still be listed: it goes once the instance's `gone`
event (destroyed, or confirmed gone by vast, which never reuses an id) is older than the
cutoff too (a launch row that names no instance says nothing and goes with the old rows).
Launches are pruned before events, so the `gone` event that lets one go is still there when
it is looked at; a launch whose instance's `gone` event is no longer in the journal stays.

What the deleted ticks, actions and LLM calls counted is added to the metrics' running totals
in the transaction that deletes them (controller/store/totals.py), so no counter goes down.

Kept whatever their age: the fleet's tracks and hosts (current state), the key/value store,
the lease, replacements, the autonomy demotions (events that hold until the gate changes).
`now` is the controller's clock (virtual on the simulator), passed in.

1. each table in turn: delete up to `batch` of its old rows in one short transaction (the
   controller's own writes wait at most one batch), until fewer than `batch` are left;
2. stop early when `budget_s` of wall time is spent: `Pruner` goes on at the next tick;
3. return the rows deleted per table (the service logs them; `fleetgate prune` prints them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from controller.store import totals
from controller.store.aggregate import loads
from controller.store.backend import JournalError, Store

log = logging.getLogger(__name__)

DAY = 86_400.0
LAUNCHES = "launches"  # not a table: the actions that rented an instance (see the docstring)
RENTED = ("SELECT id, result FROM actions WHERE action = 'launch' AND status = 'ok' "
          "AND parent_id IS NOT NULL AND at < ? AND id > ? ORDER BY id LIMIT ?")  # fmt: skip

# (table, condition on the rows that may go; `?` is the cutoff)
RULES: tuple[tuple[str, str], ...] = (
    ("ticks", "started_at < ?"),
    ("actions", "at < ? AND status NOT IN ('intent', 'unknown') "
                "AND NOT (action = 'launch' AND status = 'ok' AND parent_id IS NOT NULL)"),
    (LAUNCHES, ""),  # launches that rented an instance which went before the cutoff
    ("events", "at < ? AND kind != 'autonomy_demoted'"),  # held until the gate changes
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

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True, strict=True)

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

    def out_of_time() -> bool:
        return budget_s is not None and monotonic() - started > budget_s

    for table, where in _present(store):
        if table == LAUNCHES:
            if not _prune_launches(store, cutoff, batch, deleted, out_of_time):
                return deleted, False
            continue
        while True:
            if out_of_time():
                return deleted, False
            n = _delete(store, table, f"SELECT id FROM {table} WHERE {where} LIMIT ?",
                        (cutoff, batch))  # fmt: skip
            if n:
                deleted[table] = deleted.get(table, 0) + n
            if n < batch:
                break
    return deleted, True


def count(store: Store, now: float, days: float) -> dict[str, int]:
    """What `prune` would delete (for `fleetgate prune --dry-run`)."""
    cutoff = now - days * DAY
    out: dict[str, int] = {}
    for table, where in _present(store):
        if table == LAUNCHES:
            went = sum(len(ids) for ids in _went(store, cutoff, 500))
            if went:
                out["actions"] = out.get("actions", 0) + went
            continue
        rows = store.query(f"SELECT COUNT(*) AS n FROM {table} WHERE {where}", (cutoff,))
        if rows and rows[0]["n"]:
            out[table] = int(rows[0]["n"])
    return out


def _prune_launches(store: Store, cutoff: float, batch: int, deleted: dict[str, int],
                    out_of_time: Callable[[], bool]) -> bool:  # fmt: skip
    """Delete the launches whose instance went before `cutoff`, a page of `batch` old
    launches at a time; False when the budget ran out first."""
    for ids in _went(store, cutoff, batch):
        if out_of_time():
            return False
        if ids:
            n = _delete(store, "actions", ", ".join("?" * len(ids)), ids)
            deleted["actions"] = deleted.get("actions", 0) + n
    return True


def _delete(store: Store, table: str, ids: str, args: Sequence[Any]) -> int:
    """Delete the rows of `table` whose id is in `ids` (a SELECT or a list of `?`), in one
    transaction that adds what they counted to the metrics' totals; how many went."""
    returning = totals.RETURNING.get(table)
    sql = f"DELETE FROM {table} WHERE id IN ({ids})"
    with store.tx() as db:
        if returning is None:
            return db.execute(sql, args).rowcount
        rows = db.execute(f"{sql} RETURNING {returning}", args).fetchall()
        totals.fold(db, table, rows)
        return len(rows)


def _went(store: Store, cutoff: float, batch: int) -> Iterator[list[int]]:
    """Per page of `batch` launches older than `cutoff` that rented an instance (by id), the
    ids of those whose instance has a `gone` event before `cutoff`, or that name none."""
    after = 0
    while True:
        rows = store.query(RENTED, (cutoff, after, batch))
        if not rows:
            return
        after = int(rows[-1]["id"])
        owner = {int(r["id"]): str(loads(r["result"], {}).get("instance") or "") for r in rows}
        named = sorted({i for i in owner.values() if i})
        gone: set[str] = set()
        if named:
            marks = ", ".join("?" * len(named))
            gone = {str(r["instance_id"]) for r in store.query(
                "SELECT DISTINCT instance_id FROM events WHERE kind = 'gone' AND at < ? "
                f"AND instance_id IN ({marks})", (cutoff, *named))}  # fmt: skip
        yield [a for a, i in owner.items() if not i or i in gone]
        if len(rows) < batch:
            return


def _present(store: Store) -> list[tuple[str, str]]:
    """The rules whose table exists (the outbox's is created by its first user)."""
    out = []
    for table, where in RULES:
        try:
            store.query(f"SELECT 1 FROM {'actions' if table == LAUNCHES else table} LIMIT 0", ())
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

"""What retention deleted, kept as running totals, so the metrics' counters never go down.

`GET /metrics` (controller/service/metrics.py) counts ticks, actions and LLM calls from their
rows at each scrape. Retention (controller/store/retention.py) deletes old rows; without these
totals every `_total` and every histogram would drop at a prune, which Prometheus reads as a
counter reset (`rate()` and `increase()` then count the whole remaining value again). So each
retention batch that deletes such rows adds what they counted to `metric_totals`, in the same
transaction, and the metrics add the totals to what the rows still count.

Totals are kept by the label values the metrics expose (`name_label`, `proposer_class`: a
bounded set), never by free text from a row. Table: `metric_totals(metric, labels, value)`.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from controller.store.aggregate import Aggregate
from controller.store.backend import Row, Tx

# a proposer's class; anything else: other
PROPOSERS = ("rule", "llm", "human", "deadline", "controller")
TICK_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
LLM_BUCKETS_S = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,47}$")  # a name the controller chose

# what a deleted row of each table must return for its totals (`DELETE ... RETURNING`)
RETURNING = {
    "ticks": "id, started_at, finished_at",
    "actions": "action, status, proposer",
    "llm_calls": "status, tokens, latency_ms",
}
UPSERT = (
    "INSERT INTO metric_totals(metric, labels, value) VALUES (?, ?, ?) ON CONFLICT(metric, "
    "labels) DO UPDATE SET value = metric_totals.value + excluded.value"
)


def proposer_class(proposer: str) -> str:
    """`rule:restart-frozen` -> rule; a proposer of no known class -> other."""
    head = str(proposer).split(":", 1)[0]
    return head if head in PROPOSERS else "other"


def name_label(value: Any) -> str:
    """A label value from a column the controller writes names to; free text -> other."""
    text = "" if value is None else str(value)
    return text if _NAME.match(text) else "other"


def bound_label(bound: float) -> str:
    """A histogram bucket's key among the totals: its upper bound (`0.25`), not its place."""
    return f"{bound:g}"


def _labels(*values: str) -> str:
    return json.dumps(list(values))


def _histogram(out: defaultdict[tuple[str, str], float], name: str, buckets: Sequence[float],
               values: Sequence[float]) -> None:  # fmt: skip
    out[(f"{name}.count", "")] += len(values)
    out[(f"{name}.sum", "")] += sum(values)
    for b in buckets:  # keyed by the bound, so buckets added later start from what they saw
        out[(f"{name}.le", bound_label(b))] += sum(1 for v in values if v <= b)


def contributions(db: Tx, table: str, rows: Sequence[Row]) -> defaultdict[tuple[str, str], float]:
    """What `rows`, just deleted from `table` in `db`'s transaction, counted: (metric,
    labels) -> value. A tick that never finished counts as failed only when a tick after it
    finished (as the metric counts it)."""
    out: defaultdict[tuple[str, str], float] = defaultdict(float)
    if table == "ticks":
        done = [float(r["finished_at"]) - float(r["started_at"]) for r in rows
                if r["finished_at"] is not None]  # fmt: skip
        _histogram(out, "tick", TICK_BUCKETS_S, done)
        open_ids = [int(r["id"]) for r in rows if r["finished_at"] is None]
        if open_ids:
            kept = db.execute("SELECT MAX(id) AS id FROM ticks WHERE finished_at IS NOT NULL"
                              ).fetchone()  # fmt: skip
            ids = [int(r["id"]) for r in rows if r["finished_at"] is not None]
            if kept is not None and kept["id"] is not None:
                ids.append(int(kept["id"]))
            last_done = max(ids, default=0)
            out[("tick.failed", "")] += sum(1 for i in open_ids if i < last_done)
    elif table == "actions":
        for r in rows:
            key = _labels(name_label(r["action"]), name_label(r["status"]),
                          proposer_class(r["proposer"]))  # fmt: skip
            out[("actions", key)] += 1
    elif table == "llm_calls":
        for r in rows:
            out[("llm.calls", name_label(r["status"]))] += 1
            out[("llm.tokens", "")] += int(r["tokens"] or 0)
        secs = [float(r["latency_ms"]) / 1000.0 for r in rows if r["latency_ms"] is not None]
        _histogram(out, "llm.latency", LLM_BUCKETS_S, secs)
    return out


def fold(db: Tx, table: str, rows: Sequence[Row]) -> None:
    """Add what `rows` (deleted from `table` in `db`'s transaction) counted to the totals."""
    if table not in RETURNING or not rows:
        return
    adds = [(m, lab, float(v)) for (m, lab), v in sorted(contributions(db, table, rows).items())
            if v]  # fmt: skip
    if adds:
        db.executemany(UPSERT, adds)


class Totals(Aggregate):
    """The running totals retention folded deleted rows into."""

    SCHEMA = """
CREATE TABLE IF NOT EXISTS metric_totals (
  metric TEXT NOT NULL, labels TEXT NOT NULL, value REAL NOT NULL, PRIMARY KEY (metric, labels)
);
"""

    def read(self) -> dict[tuple[str, str], float]:
        """(metric, labels) -> the total folded in so far."""
        rows = self._all("SELECT metric, labels, value FROM metric_totals")
        return {(str(r["metric"]), str(r["labels"])): float(r["value"]) for r in rows}

    @staticmethod
    def action_labels(labels: str) -> tuple[str, str, str] | None:
        """An `actions` total's (action, status, proposer) labels; None if not three names."""
        try:
            value = json.loads(labels)
        except ValueError:
            return None
        if not isinstance(value, list) or len(value) != 3:
            return None
        return (name_label(value[0]), name_label(value[1]), proposer_class(value[2]))

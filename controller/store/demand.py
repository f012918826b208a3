"""The demand history: per tick, each task's demand (pending + running) and its forecast.

Table `demand_history`: one row per task name read that tick (`all` always, other names while
they have tasks; a name missing from a tick that has an `all` row had none), with the forecast
made at that tick (`controller.core.forecast`) and its horizon. A forecast reads a few windows
of it (the last hour, a day and a week back); `simulate` scores the forecasts against it.

Bounded: rows older than `KEEP_S` (15 days: the forecast looks back a week) are deleted every
`PRUNE_EVERY` records, whatever the retention setting; retention removes them sooner when it
keeps less.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.core.forecast import Forecast
from controller.core.model import Demand
from controller.store.aggregate import Aggregate
from controller.store.backend import JournalError, Store, Tx

KEEP_S = 15 * 86_400.0
PRUNE_EVERY = 1000

Sample = tuple[float, float]


Row = tuple[float, str, float]  # at, task, demand


@dataclass
class Window:
    """The demand history's rows from the earliest span a forecast reads on, in memory, by
    (at, id), and the last row id read: each read fetches only the rows written since. The
    rows before the earliest span asked for are dropped (spans only move forward)."""

    last_id: int = 0
    ats: list[float] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    # The series over the whole window, kept as rows come (`series`): the ticks (the `at`
    # of each `all` row), each task's sample at every tick (0 where it has no row), and the
    # times of each task's own rows. `exact` turns off for good when rows come out of order
    # or two ticks share a time: the series is then built from the rows every read.
    ticks: list[float] = field(default_factory=list)
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    own: dict[str, list[float]] = field(default_factory=dict)
    exact: bool = True
    kept_at: float = -math.inf  # the time of the last rows kept

    def series(self, store: Store, spans: Sequence[tuple[float, float]]) -> dict[str, list[Sample]]:
        """`DemandHistory.series(spans)` from the window, brought up to date first; slices
        of the kept series rather than a pass over every row within the spans."""
        rows = self.rows_within(store, spans)
        if not self.exact:
            return _series(rows)
        ranges, last = [], 0  # the ticks within the spans, each once, in order
        for lo, hi in sorted(spans):
            first = max(bisect_left(self.ticks, lo), last)
            end = bisect_right(self.ticks, hi)
            if end > first:
                ranges.append((first, end))
            last = max(last, end)
        out: dict[str, list[Sample]] = {}
        for task, times in self.own.items():
            if not any((i := bisect_left(times, lo)) < len(times) and times[i] <= hi
                       for lo, hi in spans):  # fmt: skip
                continue  # no row of its own within the spans: not in the series
            kept, picked = self.samples[task], []
            for a, b in ranges:
                picked += kept[a:b]
            out[task] = picked
        return out

    def _keep(self, fresh: list[Row]) -> None:
        """The kept series, with `fresh` (rows after every row kept, by time)."""
        ticks, samples, own = self.ticks, self.samples, self.own
        k = 0
        while k < len(fresh):
            at = fresh[k][0]
            group = []
            while k < len(fresh) and fresh[k][0] == at:
                group.append(fresh[k])
                k += 1
            if at <= self.kept_at:  # rows of a time already kept (a second tick at it)
                self.exact = False
                return
            self.kept_at = at
            for _, task, _ in group:
                if task not in own:
                    own[task] = []
                    samples[task] = [(t, 0.0) for t in ticks]
                own[task].append(at)
            if not any(task == "all" for _, task, _ in group):
                continue
            ticks.append(at)
            for series in samples.values():
                series.append((at, 0.0))
            for _, task, demand in group:
                samples[task][-1] = (at, demand)

    def _drop(self, start: float) -> None:
        """The kept series without what lies before `start`."""
        cut = bisect_left(self.ticks, start)
        if cut:
            del self.ticks[:cut]
            for series in self.samples.values():
                del series[:cut]
        for task in list(self.own):
            times = self.own[task]
            del times[: bisect_left(times, start)]
            if not times:
                del self.own[task], self.samples[task]

    def rows_within(self, store: Store, spans: Sequence[tuple[float, float]]) -> list[Row]:
        start = min(lo for lo, _ in spans)
        arg: float = self.last_id or start  # after the last read by id (not the `at` index)
        # the first read by the `at` index (`+id`: not a walk of the table in id order)
        where = "id > ? ORDER BY id" if self.last_id else "at >= ? ORDER BY +id"
        new = store.query(f"SELECT id, at, task, demand FROM demand_history WHERE {where}",
                          (arg,))  # fmt: skip
        self.last_id = max([self.last_id, *(int(r["id"]) for r in new)])
        fresh = sorted(((float(r["at"]), str(r["task"]), float(r["demand"])) for r in new
                        if float(r["at"]) >= start), key=lambda r: r[0])  # fmt: skip
        if fresh and self.ats and fresh[0][0] < self.ats[-1]:  # written out of order
            self.rows = sorted(self.rows + fresh, key=lambda r: r[0])  # stable: by id
            self.ats = [r[0] for r in self.rows]
            self.exact = False
        elif fresh:
            self.rows.extend(fresh)
            self.ats.extend(r[0] for r in fresh)
            if self.exact:
                self._keep(fresh)
        drop = bisect_left(self.ats, start)
        if drop:
            del self.ats[:drop], self.rows[:drop]
        if self.exact:
            self._drop(start)
        picked: list[Row] = []
        last = 0  # spans that overlap give each row once
        for lo, hi in sorted(spans):
            first = max(bisect_left(self.ats, lo), last)
            end = bisect_right(self.ats, hi)
            picked.extend(self.rows[first:end])
            last = max(last, end)
        return picked


class DemandHistory(Aggregate):
    """Demand and forecasts per tick, per task name."""

    SCHEMA = """
CREATE TABLE IF NOT EXISTS demand_history (
  id INTEGER PRIMARY KEY, at REAL NOT NULL, task TEXT NOT NULL, demand INTEGER NOT NULL,
  forecast REAL, horizon_s REAL
);
CREATE INDEX IF NOT EXISTS demand_history_at ON demand_history(at);
"""

    _records = 0

    def record(self, now: float, demand: Sequence[Demand], forecasts: Mapping[str, Forecast],
               db: Tx | None = None) -> None:  # fmt: skip
        """This tick's readings (and forecasts); the oldest rows go every PRUNE_EVERY calls.
        In `db`, the caller's open transaction, when given."""
        rows = []
        for d in demand:
            value = d.pending + d.running
            if value == 0 and d.task != "all":
                continue
            f = forecasts.get(d.task)
            rows.append((now, d.task, value, round(f.pending, 3) if f else None,
                         f.horizon_s if f else None))  # fmt: skip
        self._records += 1
        if db is None:
            with self.tx() as own:
                self._write(own, now, rows)
        else:
            self._write(db, now, rows)

    def _write(self, db: Tx, now: float, rows: list[tuple[Any, ...]]) -> None:
        db.executemany("INSERT INTO demand_history(at, task, demand, forecast, horizon_s) "
                       "VALUES (?, ?, ?, ?, ?)", rows)  # fmt: skip
        if self._records % PRUNE_EVERY == 0:
            db.execute("DELETE FROM demand_history WHERE at < ?", (now - KEEP_S,))

    def series(self, spans: Sequence[tuple[float, float]],
               window: Window | None = None) -> dict[str, list[Sample]]:  # fmt: skip
        """(at, demand) per task within any of `spans` ([from, to], inclusive), by `at`; a
        tick with an `all` row and no row for a task gives that task 0.

        With `window`, the rows come from it, brought up to date with the rows written since
        it last read (the same answer as reading them all; a tick's forecast reads a week of
        rows and a controller keeps them rather than read them again every tick)."""
        if not spans:
            return {}
        try:
            if window is not None:
                return window.series(self.store, spans)
            else:
                where = " OR ".join("(at >= ? AND at <= ?)" for _ in spans)
                args = [x for span in spans for x in span]
                rows = [(float(r["at"]), str(r["task"]), float(r["demand"])) for r in
                        self.store.query("SELECT at, task, demand FROM demand_history "
                                         f"WHERE {where} ORDER BY at, id", args)]  # fmt: skip
        except JournalError:
            if not getattr(self.store, "read_only", False):
                raise
            return {}  # a journal from before the demand history, opened read-only (explain)
        return _series(rows)

    def scored(self, task: str = "all") -> list[tuple[float, float, float | None, float | None]]:
        """(at, demand, forecast, horizon_s) of `task` at every tick kept, by `at`."""
        rows = self.store.query(
            "SELECT at, demand, forecast, horizon_s FROM demand_history WHERE task = ? "
            "ORDER BY at", (task,))  # fmt: skip
        return [(float(r["at"]), float(r["demand"]),
                 None if r["forecast"] is None else float(r["forecast"]),
                 None if r["horizon_s"] is None else float(r["horizon_s"]))
                for r in rows]  # fmt: skip


def _series(rows: Sequence[Row]) -> dict[str, list[Sample]]:
    """Each task's (at, demand) at every tick among `rows` (the `at` of each `all` row), 0
    where it has no row; the tasks with a row among them."""
    ticks: list[float] = []
    seen: dict[str, dict[float, float]] = defaultdict(dict)
    for at, task, demand in rows:
        if task == "all":
            ticks.append(at)
        seen[task][at] = demand
    return {task: [(at, values.get(at, 0.0)) for at in ticks] for task, values in seen.items()}

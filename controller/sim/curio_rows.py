"""Curio's tables as the simulated world fills them, answered below the wire.

`SimCurio(world, now).connect` stands in for `controller.fleet.curio.connect`: the production
`CurioDemand` runs unchanged against it and reads, at the world's virtual now, the rows Curio's
tables would hold (addresses from `controller.sim.addresses`):

    harmony_task      the queue's tasks: owner_id is the owning instance's harmony id (the
                      instance id as an int), NULL while pending or once the owner's machine
                      row is gone (ON DELETE SET NULL); posted_time and retries as queued;
                      update_time is posted_time (tasks go back to pending here only with
                      their node: Curio's recovery and ON DELETE SET NULL leave update_time)
    harmony_machines  the operator's nodes 1..operator_nodes (always heartbeating, owning no
                      tasks), then each live instance whose sidecar has been up and was last
                      seen at most curio_machine_timeout_s ago (Curio deletes silent machines):
                      last_contact = its sidecar_seen_at, unschedulable = its drained flag
    harmony_task_history  the world's `completed` runs (all successful), each by the node of
                      the instance that ran it; work_start/work_end are claim and finish
                      times. Durations come from the demand (trace or synthetic) scaled by
                      the instance's bench rate, so here the measured rate follows that rate

A query is recognised by its exact text, compared with the sensor's own templates rendered for
the settings' schema; any other query raises `UnknownQuery`, so a new sensor query cannot get
wrong rows silently. Transactions never roll back: each of CurioDemand's writes is alone in one.

Must not decide anything, parse SQL, or copy the queue; no sockets; no wall clock.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import psycopg
from psycopg import sql

from controller.fleet.curio import (
    _DEMAND,
    _LIVENESS,
    _MACHINES,
    _MATCHING,
    _SET_UNSCHEDULABLE,
    _TIMINGS,
    Connection,
    CurioSettings,
)
from controller.sim.addresses import curio_node, operator_node
from controller.sim.instance import SimInstance
from controller.sim.queue import Task
from controller.sim.world import World

if TYPE_CHECKING:
    from controller.sim.simulation import Simulation

Row = tuple[Any, ...]
TaskRow = tuple[str, int | None, float, int]  # name, owner_id, posted_time, retries
Kind = Literal[
    "timeout",
    "demand",
    "machines",
    "liveness",
    "timings",
    "set id",
    "set host_and_port",
    "count id",
    "count host_and_port",
]

TEXTS_CACHED = 64  # rendered query texts kept (the sensor has a handful of fixed queries)
# CurioDemand._transaction sends this one as plain text, not from a template
_TIMEOUT = "SELECT set_config('statement_timeout', %s, true)"


class UnknownQuery(Exception):
    """A query SimCurio cannot answer; not a psycopg.Error, so no SensorError hides it."""


@dataclass(frozen=True)
class MachineRow:
    """One `harmony_machines` row (the columns fleetgate reads) and what stands behind it."""

    id: int
    host_and_port: str
    last_contact: float  # virtual epoch seconds
    unschedulable: bool
    instance_id: str | None  # the world's instance; None for an operator node (not a column)


class SimCurio:
    """Curio's database for one simulated world; `connect` is a `curio.Connect`."""

    def __init__(self, world: World, now: Callable[[], float]) -> None:
        self._world = world
        self._now = now
        self.calls: Counter[str] = Counter()  # queries answered, by kind
        self._texts: dict[int, tuple[object, str]] = {}  # a composed query's text, by identity

    @classmethod
    def of(cls, sim: Simulation) -> SimCurio:
        """Curio's database for `sim`'s world at `sim.now()`."""
        return cls(sim.world, sim.now)

    def connect(self, settings: CurioSettings) -> Connection:
        """A connection-like object answering CurioDemand's queries (it quacks, hence the cast)."""
        return cast(Connection, _SimConnection(self, settings.schema_name))

    # --- the tables

    def machines(self) -> list[MachineRow]:
        """`harmony_machines` now, by id: operator nodes first, then listed instances."""
        now, world = self._now(), self._world
        rows = [
            MachineRow(n, operator_node(n), now, n in world.drained_operators, None)
            for n in range(1, world.config.operator_nodes + 1)
        ]
        for inst, seen in self._listed(now):
            node = _node(inst.id, inst.machine_id)
            rows.append(MachineRow(int(inst.id), node, seen, inst.drained, inst.id))
        return rows

    def tasks(self) -> Iterator[TaskRow]:
        """`harmony_task` now, as (name, owner_id, posted_time, retries); times virtual
        (update_time is posted_time)."""
        listed = {inst.id for inst, _ in self._listed(self._now())}
        for task in _queued(self._world):
            owner = task.owner if task.owner in listed else None
            yield task.name, None if owner is None else int(owner), task.posted, task.retries

    def _listed(self, now: float) -> Iterator[tuple[SimInstance, float]]:
        """(instance, last seen), by id, of each with a row: seen up, not silent too long."""
        timeout = self._world.config.curio_machine_timeout_s
        for inst in self._world.live_instances():
            seen = inst.sidecar_seen_at
            if seen is not None and now - seen <= timeout:
                yield inst, seen

    # --- the queries

    def _text(self, query: object) -> object:
        """The SQL text of a query; a composed one is rendered once (the sensor reuses its
        fixed queries; at most TEXTS_CACHED are kept, so a long run holds no query it sent)."""
        if not isinstance(query, sql.Composable):
            return query
        cached = self._texts.get(id(query))
        if cached is not None and cached[0] is query:
            return cached[1]
        text = query.as_string(None)
        if len(self._texts) >= TEXTS_CACHED:  # a drain's query is composed anew each time
            self._texts.clear()
        self._texts[id(query)] = (query, text)
        return text

    def answer(
        self, schema: str, query: object, params: Sequence[Any] | None, *, read_only: bool
    ) -> tuple[list[Row], int]:
        """(rows, rowcount) for `query` over the tables above; UnknownQuery if not ours."""
        text = self._text(query)
        kind = _known(schema).get(text) if isinstance(text, str) else None
        if kind is None:
            shown = " ".join(str(text).split())[:300]
            raise UnknownQuery(f"SimCurio has no answer for this query (teach curio_rows): {shown}")
        self.calls[kind] += 1
        args = list(params or [])
        if kind == "timeout":
            rows = [tuple(_args(args, 1))]
        elif kind == "demand":
            rows = self._demand(_args(args, 1)[0])
        elif kind == "machines":
            rows = self._machine_counts()
        elif kind == "liveness":
            rows = [self._liveness()]
        elif kind == "timings":
            window_s, names, limit = _args(args, 3)
            rows = self._timings(float(window_s), names, int(limit))
        elif kind.startswith("count "):
            (key,) = _args(args, 1)
            rows = [(self._matching(kind.removeprefix("count "), key),)]
        else:
            if read_only:
                raise psycopg.errors.ReadOnlySqlTransaction("UPDATE in a read-only transaction")
            value, key = _args(args, 2)
            return [], self._set_unschedulable(kind.removeprefix("set "), key, bool(value))
        return rows, len(rows)

    def _demand(self, names: Sequence[str]) -> list[Row]:
        """_DEMAND: per wanted name with tasks, pending/running, oldest pending age, max retries.

        The rows of `tasks()`, read in one tight pass (this runs on every tick of a replay).
        """
        now, wanted, groups = self._now(), set(names), dict[str, _Group]()
        listed = {inst.id for inst, _ in self._listed(now)}
        for task in _queued(self._world):
            if task.name not in wanted:
                continue
            group = groups.get(task.name) or groups.setdefault(task.name, _Group())
            if task.owner in listed:
                group.running += 1
            else:  # pending, or its node's row is gone (owner_id set NULL)
                group.pending += 1
                if task.posted < group.oldest:
                    group.oldest = task.posted
                if task.retries > group.retries:
                    group.retries = task.retries
        return [
            (name, g.pending, g.running, max(0.0, now - g.oldest) if g.pending else 0.0, g.retries)
            for name, g in groups.items()
        ]

    def _machine_counts(self) -> list[Row]:
        """_MACHINES: each machine with its heartbeat age, cordon and tasks owned."""
        now, owned = self._now(), self._world.queue.owned_counts()
        return [
            (m.id, m.host_and_port, max(0.0, now - m.last_contact), m.unschedulable,
             owned[m.instance_id] if m.instance_id else 0)
            for m in self.machines()
        ]  # fmt: skip

    def _liveness(self) -> Row:
        """_LIVENESS: how many machines, seconds since the newest contact (NULL when none)."""
        now, operators = self._now(), self._world.config.operator_nodes
        seen = [when for _, when in self._listed(now)]
        if not operators and not seen:
            return (0, None)
        return (operators + len(seen), now - (now if operators else max(seen)))

    def _timings(self, window_s: float, names: Sequence[str], limit: int) -> list[Row]:
        """_TIMINGS: per node and wanted name, the runs finished in the window, their mean
        seconds and the node's working seconds they cover (each run past the ones before)."""
        since, wanted = self._now() - window_s, set(names)
        by_node: dict[str, list[tuple[float, float, int, str]]] = {}
        for done in self._world.completed:
            if done.work_end < since or done.name not in wanted or done.work_end <= done.work_start:
                continue
            node = _node(done.instance_id, done.machine_id)
            by_node.setdefault(node, []).append(
                (done.work_start, done.work_end, done.task_id, done.name)
            )
        acc: dict[tuple[str, str], list[float]] = {}  # -> [runs, seconds, covered]
        for node, runs in by_node.items():
            reach: float | None = None
            for start, end, _, name in sorted(runs):
                a = acc.setdefault((node, name), [0, 0.0, 0.0])
                a[0] += 1
                a[1] += end - start
                a[2] += max(0.0, end - max(start, start if reach is None else reach))
                reach = end if reach is None else max(reach, end)
        return [(node, name, int(n), total / n, covered)
                for (node, name), (n, total, covered) in sorted(acc.items())][:limit]  # fmt: skip

    def _matching(self, column: str, key: object) -> int:
        """_MATCHING: how many listed machines have `column = key`."""
        return sum(1 for row in self.machines()
                   if (row.id if column == "id" else row.host_and_port) == key)  # fmt: skip

    def _set_unschedulable(self, column: str, key: object, value: bool) -> int:
        """_SET_UNSCHEDULABLE on the listed machines matching `column = key`; rows matched."""
        changed = 0
        for row in self.machines():
            if (row.id if column == "id" else row.host_and_port) != key:
                continue
            changed += 1
            if row.instance_id is None:
                self._world.drain_operator(row.id, value)
            elif value:
                self._world.drain(row.instance_id)
            else:
                self._world.undrain(row.instance_id)
        return changed


@dataclass
class _Group:
    pending: int = 0
    running: int = 0
    oldest: float = math.inf
    retries: int = 0


# pure; it runs per node per query; room for more nodes than the largest world benched
_node = functools.lru_cache(maxsize=1 << 16)(curio_node)


def _queued(world: World) -> Iterator[Task]:
    """The queue's tasks, read in place (TaskQueue has no public view of them)."""
    return iter(world.queue._tasks.values())


def _args(args: list[Any], expected: int) -> list[Any]:
    if len(args) != expected:
        raise psycopg.ProgrammingError(
            f"the query has {expected} placeholders but {len(args)} parameters were passed"
        )
    return args


@functools.lru_cache(maxsize=16)
def _known(schema: str) -> dict[str, Kind]:
    """Each query CurioDemand sends for `schema`, rendered as it renders them -> its kind."""
    ident = sql.Identifier(schema)

    def render(template: str, **parts: sql.Composable) -> str:
        return sql.SQL(template).format(schema=ident, **parts).as_string(None)

    known: dict[str, Kind] = {
        _TIMEOUT: "timeout",
        render(_DEMAND): "demand",
        render(_MACHINES): "machines",
        render(_LIVENESS): "liveness",
        render(_TIMINGS): "timings",
    }
    for column in ("id", "host_and_port"):
        match = sql.SQL("{} = %s").format(sql.Identifier(column))
        known[render(_SET_UNSCHEDULABLE, match=match)] = cast(Kind, f"set {column}")
        known[render(_MATCHING, match=match)] = cast(Kind, f"count {column}")
    return known


class _SimConnection:
    """The part of a psycopg 3 connection CurioDemand uses."""

    def __init__(self, curio: SimCurio, schema: str) -> None:
        self.curio, self.schema = curio, schema
        self.read_only: bool | None = None
        self.closed = False

    def __enter__(self) -> _SimConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True

    @contextmanager
    def transaction(self) -> Iterator[None]:
        yield

    def cursor(self) -> _SimCursor:
        return _SimCursor(self)


class _SimCursor:
    """A cursor: `execute` answers through SimCurio and keeps the rows to fetch."""

    def __init__(self, conn: _SimConnection) -> None:
        self._conn = conn
        self._rows: list[Row] = []
        self._next = 0
        self.rowcount = -1

    def __enter__(self) -> _SimCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def execute(self, query: object, params: Sequence[Any] | None = None) -> _SimCursor:
        c = self._conn
        self._rows, self.rowcount = c.curio.answer(
            c.schema, query, params, read_only=bool(c.read_only)
        )
        self._next = 0
        return self

    def fetchone(self) -> Row | None:
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]

    def fetchall(self) -> list[Row]:
        rest = self._rows[self._next :]
        self._next = len(self._rows)
        return rest

"""The Curio demand sensor: the proving queue read from Curio's database (DOMAIN.md).

Reads `harmony_task` (pending = `owner_id IS NULL`, running = `owner_id` set; a pending task
has waited since it was posted or last given back to the queue, whichever is later),
`harmony_machines`, and `harmony_task_history` (the recent successful runs per node: how fast
each node proves, as Curio timed it, not as the instance claims); writes only
`harmony_machines.unschedulable` (drain/undrain), and only when the config allows it. Every age
is computed by the database clock, never this machine's.

Must not: string-format SQL (schema names go through `psycopg.sql.Identifier`, values are
parameters), keep a connection between calls, decide anything, or put the DSN or its password
in a message. Every failure is a `SensorError`: the reading is unknown, never "empty".
"""

from __future__ import annotations

import ipaddress
import logging
import math
import re
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any, LiteralString, TypeVar
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from pydantic import BaseModel, ConfigDict, Field, field_validator

from controller.core.fields import Secret
from controller.core.model import Demand
from controller.fleet.base import SensorError, StaleReading
from controller.store.backend import with_keepalives

log = logging.getLogger(__name__)

GPU_TASKS = ("PoRep", "UpdateProve", "PSProve", "WdPost", "WinPost")
# A transaction the database could not serialize (40001: YugabyteDB's read restart, a conflict
# with a concurrent write; 40P01: a deadlock) is run again, at most this many times in all:
# clients are to retry these, as Curio's own database layer does.
SERIALIZATION_ATTEMPTS = 3
_TRANSIENT = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)
_T = TypeVar("_T")


class CurioSettings(BaseModel):
    """Where Curio's database is and which of its tasks are proving demand."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True, strict=True)

    dsn: Secret = Field(description="libpq connection string or URI (a secret)")
    schema_name: str = Field(
        "curio", min_length=1, max_length=63, description="the schema holding harmony_*"
    )
    tasks: dict[str, float] = Field(
        default_factory=lambda: dict.fromkeys(GPU_TASKS, 1.0),
        description="task name -> weight: how much proving capacity one such task needs",
    )
    statement_timeout_ms: int = Field(5000, ge=1, description="per query, set in the transaction")
    connect_timeout_s: int = Field(5, ge=2, description="libpq rounds anything lower up to 2")
    heartbeat_stale_s: float = Field(
        600.0, gt=0, description="a machine silent this long is stale (Curio drops it at ~10 min)"
    )
    allow_drain: bool = Field(False, description="may fleetgate set harmony_machines.unschedulable")
    protected_nodes: tuple[str, ...] = Field(
        (),
        description="Curio nodes (host:port or machine id) fleetgate never drains, undrains "
        "or takes for a fleet instance's node, whatever an instance claims",
    )

    node_networks: tuple[str, ...] = Field(
        (),
        description="networks (CIDR) whose addresses an agent's --host-and-port may name "
        "although the instance's public address is another: what Curio nodes announce behind "
        "vast's port mapping (the container's address) or on an overlay network. A node named "
        "by two instances is neither's; keep the operator's own nodes off these networks or "
        "in protected_nodes",
    )

    measure_window_s: float = Field(
        6 * 3600.0, gt=0, le=7 * 86_400.0,
        description="how far back harmony_task_history is read to time each node's tasks",
    )  # fmt: skip
    measure_max_rows: int = Field(
        5000, ge=1, le=100_000, description="at most this many (node, task) rows per read"
    )
    measure_every_s: float = Field(
        300.0, ge=0, description="read the task history at most this often (0: every tick)"
    )

    @field_validator("protected_nodes", "node_networks", mode="before")
    @classmethod
    def _as_tuple(cls, items: object) -> object:
        return tuple(items) if isinstance(items, list) else items  # YAML gives lists (strict)

    @field_validator("protected_nodes")
    @classmethod
    def _protected(cls, nodes: tuple[str, ...]) -> tuple[str, ...]:
        for node in nodes:
            if not node.strip() or len(node) > 300:
                raise ValueError(f"protected node {node!r}: give a host:port or a machine id")
        return tuple(node.strip() for node in nodes)

    @field_validator("node_networks")
    @classmethod
    def _networks(cls, networks: tuple[str, ...]) -> tuple[str, ...]:
        for network in networks:
            try:
                ipaddress.ip_network(network.strip(), strict=False)
            except ValueError:
                raise ValueError(f"node network {network!r}: give a CIDR such as "
                                 "100.64.0.0/10") from None  # fmt: skip
        return tuple(network.strip() for network in networks)

    def on_node_network(self, host: str) -> bool:
        """Whether `host` (an IP address) lies in one of `node_networks`."""
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in ipaddress.ip_network(n, strict=False) for n in self.node_networks)

    def protects(self, machine_id: int | None, host_and_port: str | None) -> bool:
        """Whether the config lists this Curio node (by its id or its host_and_port)."""
        listed = set(self.protected_nodes)
        return (machine_id is not None and str(machine_id) in listed) or (
            host_and_port is not None and host_and_port in listed
        )

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, tasks: dict[str, float]) -> dict[str, float]:
        if not tasks:
            raise ValueError("name at least one Curio task")
        for name, weight in tasks.items():
            if not 1 <= len(name) <= 16:
                raise ValueError(f"task name {name!r}: Curio task names are 1-16 characters")
            if name == "all":
                raise ValueError("task name 'all' is reserved for the weighted total")
            if not (math.isfinite(weight) and weight > 0):
                raise ValueError(f"task {name!r}: weight must be a positive number, got {weight}")
        return tasks


@dataclass(frozen=True)
class CurioMachine:
    """One Curio node as `harmony_machines` sees it."""

    id: int
    host_and_port: str
    last_contact_age_s: float  # by the database clock
    unschedulable: bool  # Curio's cordon: takes no new tasks
    running_tasks: int  # tasks of any name this node owns
    stale: bool  # silent for at least heartbeat_stale_s


@dataclass(frozen=True)
class TaskTiming:
    """One node's successful runs of one task in the measure window (`harmony_task_history`)."""

    host_and_port: str  # completed_by_host_and_port
    task: str
    tasks: int
    mean_s: float  # mean of work_end - work_start
    covered_s: float  # of the node's working time, the seconds these runs cover (see _TIMINGS)


@dataclass(frozen=True)
class NodeRate:
    """A node's measured proving rate over all its timed tasks (see `node_rates`)."""

    host_and_port: str
    tasks: int
    busy_s: float  # the seconds the node was working on them (side by side counted once)
    rate: float  # weighted tasks per hour of working time


Connection = psycopg.Connection[tuple[Any, ...]]
Connect = Callable[[CurioSettings], Connection]


def connect(settings: CurioSettings) -> Connection:
    """A fresh autocommit connection (transactions are explicit), bounded by connect_timeout_s;
    a server that stops answering mid-query is dropped by keepalives (the statement timeout is
    the server's own: it never arrives from a server that went silent)."""
    return psycopg.connect(
        with_keepalives(settings.dsn.get_secret_value()),
        autocommit=True,
        connect_timeout=settings.connect_timeout_s,
        fallback_application_name="fleetgate",
    )


# A pending task waits since it last entered the queue: Curio keeps posted_time when a node
# gives a failed or preempted task back, or when a person restarts a failed one, and stamps
# update_time then (a claim leaves it alone; a new task gets both at once).
_DEMAND = """
SELECT name,
       count(*) FILTER (WHERE owner_id IS NULL),
       count(*) FILTER (WHERE owner_id IS NOT NULL),
       coalesce(greatest(0, extract(epoch FROM now() - min(greatest(posted_time, update_time))
           FILTER (WHERE owner_id IS NULL)))::float8, 0),
       coalesce(max(retries) FILTER (WHERE owner_id IS NULL), 0)
FROM {schema}.harmony_task
WHERE name = ANY(%s)
GROUP BY name
"""

_MACHINES = """
SELECT m.id, m.host_and_port,
       greatest(0, extract(epoch FROM now() - m.last_contact))::float8,
       coalesce(m.unschedulable, false), count(t.id)
FROM {schema}.harmony_machines m
LEFT JOIN {schema}.harmony_task t ON t.owner_id = m.id
GROUP BY m.id, m.host_and_port, m.last_contact, m.unschedulable
ORDER BY m.id
"""

# Curio's nodes heartbeat into harmony_machines once a minute: when none has for
# heartbeat_stale_s, the queue we read is not being worked or not current (a stopped cluster,
# a lagging replica), and its numbers must not drive scaling.
_LIVENESS = """
SELECT count(*), extract(epoch FROM now() - max(last_contact))::float8
FROM {schema}.harmony_machines
"""

# The successful runs per node and task finished in the window, by the database clock (a run
# that ended before it started, a node's clock stepping, is no measurement), and the seconds
# of the node's working time each name's runs cover: runs in start order, each counting only
# what it adds past the runs before it, so tasks run side by side are not counted twice and
# idle time not at all. Curio indexes history by (work_end DESC, completed_by_host_and_port,
# name, result): a range scan.
_TIMINGS = """
WITH runs AS (
    SELECT completed_by_host_and_port AS node, name, work_start, work_end,
           max(work_end) OVER (PARTITION BY completed_by_host_and_port
                               ORDER BY work_start, work_end, id
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
    FROM {schema}.harmony_task_history
    WHERE work_end >= now() - make_interval(secs => %s) AND result
      AND work_end > work_start AND name = ANY(%s)
)
SELECT node, name, count(*), avg(extract(epoch FROM work_end - work_start))::float8,
       sum(greatest(0, extract(epoch FROM
           work_end - greatest(work_start, coalesce(reach, work_start)))))::float8
FROM runs
GROUP BY node, name
ORDER BY node, name
LIMIT %s
"""

_SET_UNSCHEDULABLE = "UPDATE {schema}.harmony_machines SET unschedulable = %s WHERE {match}"
_MATCHING = "SELECT count(*) FROM {schema}.harmony_machines WHERE {match}"
# A protected node is matched by id or by host_and_port, in the same statement that writes:
# asking for one by the other's name changes nothing either.
_PROTECTED = """
SELECT id, host_and_port FROM {schema}.harmony_machines
WHERE {match} AND (id::text = ANY(%s) OR host_and_port = ANY(%s))
"""


class CurioDemand:
    """`DemandSensor` over Curio's database; one short-lived connection per call."""

    def __init__(self, settings: CurioSettings, connect: Connect = connect) -> None:
        self.settings = settings
        self._connect = connect
        self._queries: dict[str, sql.Composed] = {}  # the fixed queries, composed once

    def demand(self) -> list[Demand]:
        """Pending/running per configured task name (zeros included), then the weighted `all`."""
        names = list(self.settings.tasks)

        def read(cur: psycopg.Cursor[Any]) -> tuple[list[tuple[Any, ...]], tuple[Any, ...] | None]:
            rows = cur.execute(self._sql(_DEMAND), [names]).fetchall()
            return rows, cur.execute(self._sql(_LIVENESS)).fetchone()

        rows, live = self._run("demand query", read, read_only=True)
        nodes, newest_age = (int(live[0]), live[1]) if live else (0, None)
        limit = self.settings.heartbeat_stale_s
        if nodes and newest_age is not None and float(newest_age) >= limit:
            raise StaleReading(
                f"Curio's queue looks stale: none of its {nodes} node(s) has checked in for "
                f"{float(newest_age):.0f} s (heartbeat_stale_s={limit:g}); the task table may "
                "not be current (a stopped cluster or a lagging replica)"
            )
        return summarize(self.settings.tasks, rows)

    def machines(self) -> list[CurioMachine]:
        rows = self._run("machines query", lambda cur: cur.execute(self._sql(_MACHINES)).fetchall(),
                         read_only=True)  # fmt: skip
        stale_s = self.settings.heartbeat_stale_s
        return [
            CurioMachine(int(i), str(hp), float(age), bool(u), int(n), stale=age >= stale_s)
            for i, hp, age, u, n in rows
        ]

    def task_timings(self) -> list[TaskTiming]:
        """Each node's successful runs per configured task in the last `measure_window_s`
        (at most `measure_max_rows` rows): how many, and their mean duration."""
        s = self.settings
        params = [s.measure_window_s, list(s.tasks), s.measure_max_rows]
        rows = self._run("task history query",
                         lambda cur: cur.execute(self._sql(_TIMINGS), params).fetchall(),
                         read_only=True)  # fmt: skip
        return [TaskTiming(str(hp), str(name), int(n), float(mean), float(covered))
                for hp, name, n, mean, covered in rows
                if hp and mean is not None and covered is not None]  # fmt: skip

    def drain(self, machine: int | str) -> int:
        """Set `unschedulable` on a machine (by id, or by host_and_port); returns rows matched.
        Only that one row: when several machines have that host_and_port, nothing changes."""
        return self._set_unschedulable(machine, True)

    def undrain(self, machine: int | str) -> int:
        """Clear `unschedulable` on a machine (by id, or by host_and_port); returns rows matched.
        Only that one row: a node the operator cordoned elsewhere stays as it is."""
        return self._set_unschedulable(machine, False)

    def _set_unschedulable(self, machine: int | str, value: bool) -> int:
        verb = "drain" if value else "undrain"
        if not self.settings.allow_drain:
            raise SensorError(
                f"{verb} of Curio machine {machine!r} refused: "
                "draining is not allowed by the config (allow_drain is false)"
            )
        column, key = _machine_key(machine)
        if self.settings.protects(key if isinstance(key, int) else None,
                                  key if isinstance(key, str) else None):  # fmt: skip
            raise SensorError(f"{verb} of Curio machine {machine!r} refused: it is protected")
        match = sql.SQL("{} = %s").format(sql.Identifier(column))
        query = self._sql(_SET_UNSCHEDULABLE, match=match)

        def write(cur: psycopg.Cursor[Any]) -> int:
            protected = list(self.settings.protected_nodes)
            if protected and cur.execute(self._sql(_PROTECTED, match=match),
                                         [key, protected, protected]).fetchone():  # fmt: skip
                raise SensorError(f"{verb} of Curio machine {machine!r} refused: it is protected")
            row = cur.execute(self._sql(_MATCHING, match=match), [key]).fetchone()
            if row is not None and int(row[0]) > 1:  # nodes announcing one address: whose?
                raise SensorError(f"{verb} of Curio machine {machine!r} refused: {row[0]} "
                                  f"machines have {column} {key!r}, and only one is the "
                                  "instance's")  # fmt: skip
            changed = cur.execute(query, [value, key]).rowcount
            if changed == 0:
                raise SensorError(
                    f"no Curio machine with {column} {key!r} in schema "
                    f"{self.settings.schema_name!r} ({verb} changed nothing)"
                )
            return int(changed)

        changed = self._run(f"{verb} of machine {machine!r}", write, read_only=False)
        log.info("Curio machine %r: unschedulable=%s (%d row(s))", machine, value, changed)
        return changed

    def _sql(self, template: LiteralString, **parts: sql.Composable) -> sql.Composed:
        if not parts and template in self._queries:
            return self._queries[template]
        schema = sql.Identifier(self.settings.schema_name)
        query = sql.SQL(template).format(schema=schema, **parts)
        if not parts:
            self._queries[template] = query
        return query

    def _run(self, what: str, work: Callable[[psycopg.Cursor[Any]], _T], *,
             read_only: bool) -> _T:  # fmt: skip
        """`work` in one transaction (`_transaction`), run again in a fresh one when the
        database could not serialize it (YugabyteDB's read restart, a write racing a node's
        heartbeat of the same row): such a failure is transient, and nothing of it was kept."""
        for attempt in range(1, SERIALIZATION_ATTEMPTS + 1):
            try:
                with self._transaction(what, read_only=read_only) as cur:
                    return work(cur)
            except SensorError as exc:
                if attempt == SERIALIZATION_ATTEMPTS or not isinstance(exc.__cause__, _TRANSIENT):
                    raise
                log.warning("%s (attempt %d of %d); running it again", exc, attempt,
                            SERIALIZATION_ATTEMPTS)  # fmt: skip
        raise AssertionError("unreachable")

    @contextmanager
    def _transaction(self, what: str, *, read_only: bool) -> Iterator[psycopg.Cursor[Any]]:
        """One connection, one transaction with the statement timeout; psycopg errors -> ours."""
        try:
            conn = self._connect(self.settings)
        except psycopg.Error as exc:
            # libpq quotes pieces of an unparsable DSN, which may be pieces of the password
            reason = self._scrub(str(exc)) if self._params() else "not a valid connection string"
            raise SensorError(
                f"cannot connect to the Curio database {self._where()}: {reason} (check "
                "curio.dsn, and that the server runs)"
            ) from exc
        try:
            with conn:
                conn.read_only = read_only
                with conn.transaction(), conn.cursor() as cur:
                    timeout = str(self.settings.statement_timeout_ms)
                    cur.execute("SELECT set_config('statement_timeout', %s, true)", [timeout])
                    yield cur
        except psycopg.Error as exc:
            raise SensorError(self._explain(what, exc)) from exc

    def _explain(self, what: str, exc: psycopg.Error) -> str:
        schema = self.settings.schema_name
        if isinstance(exc, psycopg.errors.QueryCanceled):
            limit = self.settings.statement_timeout_ms
            return (
                f"Curio {what} timed out after statement_timeout_ms={limit} (a lock or overload?)"
            )
        if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
            detail = exc.diag.message_primary or type(exc).__name__
            return (
                f"Curio {what} failed: {self._scrub(detail)}; "
                f"is curio.schema_name {schema!r} right and is this Curio's database?"
            )
        detail = exc.diag.message_primary or str(exc)
        return f"Curio {what} failed ({self._where()}): {type(exc).__name__}: {self._scrub(detail)}"

    def _params(self) -> dict[str, Any]:
        try:
            return conninfo_to_dict(self.settings.dsn.get_secret_value())
        except psycopg.Error:
            return {}

    def _where(self) -> str:
        """host:port/dbname as user: nothing secret, enough to find the database."""
        p = self._params()
        if not p:
            return "(unparsable DSN)"
        where = f"{p.get('host', 'localhost')}:{p.get('port', 5432)}/{p.get('dbname', '')}"
        return f"{where} as {p['user']}" if p.get("user") else where

    def _scrub(self, text: str) -> str:
        password = str(self._params().get("password") or "")
        dsn = self.settings.dsn.get_secret_value()
        for secret in (dsn, password, quote(password, safe="")):
            if secret:
                text = text.replace(secret, "***")
        return " ".join(text.split())


def summarize(weights: dict[str, float], rows: list[tuple[Any, ...]]) -> list[Demand]:
    """Rows of (name, pending, running, oldest_pending_s, max_retries) -> Demand per name + all.

    Every configured name gets an entry (zeros when absent); rows for other names are ignored.
    `all` holds the weighted pending/running sums rounded up (a task of any weight counts: one
    pending task of weight 0.3 is 1, never 0), the oldest and the max.
    """
    by_name = {str(r[0]): r for r in rows}
    per_task = []
    for name in weights:
        _, pending, running, oldest, retries = by_name.get(name, (name, 0, 0, 0.0, 0))
        per_task.append(Demand(name, int(pending), int(running), float(oldest), int(retries)))
    total = Demand(
        task="all",
        pending=_ceil(sum(weights[d.task] * d.pending for d in per_task)),
        running=_ceil(sum(weights[d.task] * d.running for d in per_task)),
        oldest_pending_s=max(d.oldest_pending_s for d in per_task),
        max_retries=max(d.max_retries for d in per_task),
    )
    return [*per_task, total]


def node_rates(weights: dict[str, float], timings: list[TaskTiming]) -> dict[str, NodeRate]:
    """host_and_port -> its rate: the weighted tasks it finished per hour of working time.

    Working time is when the node ran at least one of these tasks (idle time is no evidence of
    speed; tasks run side by side count once), so the rate is the node's throughput under
    load, comparable to a benchmark's proofs/hour. Tasks are weighted as in demand (how much
    proving capacity one needs), so a node that ran only light tasks is not ranked as fast as
    one that ran heavy ones in the same time; names not in `weights` are ignored."""
    work: dict[str, list[float]] = {}  # host -> [tasks, weighted tasks, working seconds]
    for t in timings:
        weight = weights.get(t.task)
        if weight is None or t.tasks <= 0 or not math.isfinite(t.covered_s):
            continue
        acc = work.setdefault(t.host_and_port, [0.0, 0.0, 0.0])
        acc[0] += t.tasks
        acc[1] += weight * t.tasks
        acc[2] += max(0.0, t.covered_s)
    return {
        host: NodeRate(host, int(n), busy, 3600.0 * weighted / busy)
        for host, (n, weighted, busy) in sorted(work.items())
        if busy > 0
    }


def task_seconds(weights: dict[str, float], timings: Iterable[TaskTiming],
                 hosts: Collection[str]) -> dict[str, float]:  # fmt: skip
    """Task name -> the mean seconds one of its runs took on the nodes `hosts`, and `all` ->
    the mean seconds of work per weighted task (as demand weighs them), over the timed runs.
    Names not in `weights` and nodes not in `hosts` are left out; a name nobody ran is absent."""
    runs: dict[str, list[float]] = {}  # name -> [runs, seconds]
    for t in timings:
        if t.task not in weights or t.host_and_port not in hosts or t.tasks <= 0:
            continue
        if not (math.isfinite(t.mean_s) and t.mean_s > 0):
            continue
        acc = runs.setdefault(t.task, [0.0, 0.0])
        acc[0] += t.tasks
        acc[1] += t.tasks * t.mean_s
    out = {name: seconds / n for name, (n, seconds) in sorted(runs.items())}
    weighted = sum(weights[name] * n for name, (n, _) in runs.items())
    if weighted > 0:
        out["all"] = sum(seconds for _, seconds in runs.values()) / weighted
    return out


_CEIL_EPSILON = 1e-6  # float noise in a weighted sum, far below any weight's share


def _ceil(weighted: float) -> int:
    """Round a weighted sum up, forgiving float noise (0.1 summed 30 times is 3, not 4)."""
    return math.ceil(weighted - _CEIL_EPSILON)


def _machine_key(machine: int | str) -> tuple[str, int | str]:
    """An int or a string of digits is a machine id; anything else is a host_and_port."""
    if isinstance(machine, int):
        return "id", machine
    if re.fullmatch(r"\d{1,9}", machine):
        return "id", int(machine)
    return "host_and_port", machine


def create_schema(conn: Connection, schema_name: str) -> None:
    """Create `schema_name` with Curio's tables (curio_schema.sql). Tests and local dev only."""
    text = (
        resources.files("controller.fleet").joinpath("curio_schema.sql").read_text(encoding="utf-8")
    )
    schema = sql.Identifier(schema_name)
    with conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
        conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(schema))
        conn.execute(sql.SQL(text))  # a file of ours, never user input

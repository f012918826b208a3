"""A Curio task queue in a real PostgreSQL: a fresh schema per use, dropped after.

`CurioDB` plays the Curio nodes: it posts tasks, claims them for a machine, finishes them (row
deleted, history written), releases them (retries + 1) or restarts failed ones, and moves
heartbeats, with every time taken from the database clock (`now() - age`). Schema names are
random (`curio_t_<hex>`), so tests can run side by side in one database.
"""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql

from controller.fleet.curio import create_schema


class CurioDB:
    def __init__(self, conninfo: str, schema: str | None = None) -> None:
        self.conninfo = conninfo
        self.schema = schema or f"curio_t_{secrets.token_hex(6)}"
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self._started: dict[int, Any] = {}  # task id -> when claim() gave it to a node

    def __enter__(self) -> CurioDB:
        self._conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5)
        try:
            create_schema(self._conn, self.schema)
        except BaseException:
            self._conn.close()
            raise
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        try:
            self.drop()
        finally:
            self.conn.close()

    @property
    def conn(self) -> psycopg.Connection[tuple[Any, ...]]:
        assert self._conn is not None, "use CurioDB as a context manager"
        return self._conn

    def _exec(self, template: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        query = sql.SQL(template).format(s=sql.Identifier(self.schema))
        cur = self.conn.execute(query, params)
        return cur.fetchall() if cur.description else []

    def add_machine(
        self, host_and_port: str, last_contact_age_s: float = 0, unschedulable: bool = False
    ) -> int:
        rows = self._exec(
            "INSERT INTO {s}.harmony_machines (host_and_port, cpu, ram, gpu, unschedulable,"
            " last_contact) VALUES (%s, 32, 274877906944, 1, %s,"
            " now() - make_interval(secs => %s)) RETURNING id",
            [host_and_port, unschedulable, last_contact_age_s],
        )
        return int(rows[0][0])

    def post(self, name: str, n: int = 1, age_s: float = 0, retries: int = 0) -> list[int]:
        """New tasks, posted `age_s` ago: update_time is posted_time, as when Curio adds one."""
        rows = self._exec(
            "INSERT INTO {s}.harmony_task (name, posted_time, update_time, added_by, retries)"
            " SELECT %s, now() - make_interval(secs => %s), now() - make_interval(secs => %s),"
            " 0, %s FROM generate_series(1, %s) RETURNING id",
            [name, age_s, age_s, retries, n],
        )
        return [int(r[0]) for r in rows]

    def claim(self, task_ids: Sequence[int], machine_id: int) -> None:
        """A node takes the tasks: only owner_id changes, as in Curio's claim."""
        self._exec(
            "UPDATE {s}.harmony_task SET owner_id = %s WHERE id = ANY(%s)",
            [machine_id, list(task_ids)],
        )
        (started,) = self._exec("SELECT now()")[0]
        self._started.update(dict.fromkeys(task_ids, started))

    def finish(self, task_ids: Sequence[int], result: bool = True, err: str = "") -> None:
        """Delete the tasks and write one history row each, as a Curio node does on completion
        (work_start: when it was claimed here, else when it was posted)."""
        ids = list(task_ids)
        self._exec(
            "WITH done AS (DELETE FROM {s}.harmony_task WHERE id = ANY(%s)"
            "  RETURNING id, name, posted_time, owner_id)"
            " INSERT INTO {s}.harmony_task_history (task_id, name, posted, work_start, work_end,"
            "  result, err, completed_by_host_and_port)"
            " SELECT d.id, d.name, d.posted_time, coalesce(s.started, d.posted_time), now(),"
            "  %s, %s, coalesce(m.host_and_port, '')"
            " FROM done d LEFT JOIN {s}.harmony_machines m ON m.id = d.owner_id"
            " LEFT JOIN unnest(%s::int[], %s::timestamptz[]) AS s(id, started) ON s.id = d.id",
            [ids, result, err, ids, [self._started.get(i) for i in ids]],
        )
        for i in ids:
            self._started.pop(i, None)

    def restart(self, task_id: int, name: str, posted_age_s: float) -> None:
        """Put a failed task back under its own id and posted_time, as Curio's restart of a
        failed task does (update_time now, no owner, no retries)."""
        self._exec(
            "INSERT INTO {s}.harmony_task (id, update_time, posted_time, added_by, name)"
            " VALUES (%s, now(), now() - make_interval(secs => %s), 0, %s)",
            [task_id, posted_age_s, name],
        )

    def release(self, task_ids: Sequence[int]) -> None:
        """Give failed tasks back to the queue: no owner, one more retry."""
        self._exec(
            "UPDATE {s}.harmony_task SET owner_id = NULL, retries = retries + 1,"
            " update_time = now() WHERE id = ANY(%s)",
            [list(task_ids)],
        )

    def heartbeat(self, machine_id: int, age_s: float = 0) -> None:
        self._exec(
            "UPDATE {s}.harmony_machines SET last_contact = now() - make_interval(secs => %s)"
            " WHERE id = %s",
            [age_s, machine_id],
        )

    def remove_machine(self, machine_id: int) -> None:
        """What Curio does to a silent node: delete it; its tasks go back to pending."""
        self._exec("DELETE FROM {s}.harmony_machines WHERE id = %s", [machine_id])

    def count(self, table: str) -> int:
        query = sql.SQL("SELECT count(*) FROM {}.{}").format(
            sql.Identifier(self.schema), sql.Identifier(table)
        )
        row = self.conn.execute(query).fetchone()
        assert row is not None
        return int(row[0])

    def machine(self, machine_id: int) -> dict[str, Any]:
        rows = self._exec(
            "SELECT host_and_port, unschedulable FROM {s}.harmony_machines WHERE id = %s",
            [machine_id],
        )
        return {"host_and_port": rows[0][0], "unschedulable": rows[0][1]}

    @contextmanager
    def locked(self, table: str) -> Iterator[None]:
        """Hold an ACCESS EXCLUSIVE lock on `table` from another connection for the block."""
        with psycopg.connect(self.conninfo, connect_timeout=5) as other:
            other.execute(
                sql.SQL("LOCK TABLE {}.{} IN ACCESS EXCLUSIVE MODE").format(
                    sql.Identifier(self.schema), sql.Identifier(table)
                )
            )
            yield
            other.rollback()

    def drop(self) -> None:
        self.conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema))
        )


class SilentServer:
    """A TCP port whose kernel completes the handshake but nobody ever answers: a hung server."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)  # never accept(): connections wait in the backlog
        self.port: int = self._sock.getsockname()[1]

    def __enter__(self) -> SilentServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()

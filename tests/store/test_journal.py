"""The journal as a whole: one store under every part, a schema created where it is missing
(a journal written before a column was added opens and is brought up to date), reads that see
one snapshot, and the config that puts it on PostgreSQL."""

from __future__ import annotations

import os
import socket
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from support import BACKENDS, PG_DSN, peer, pg_store

from controller.service.assemble import open_journal
from controller.service.config import ConfigError, parse_config
from controller.store.backend import JournalError, PostgresStore, SQLiteStore, Store, statements
from controller.store.journal import Journal
from controller.store.lease import Lease

# `actions` as first shipped: no `token` column (the lease's fencing token came later)
ACTIONS_BEFORE_TOKEN = """
CREATE TABLE actions (
  id INTEGER PRIMARY KEY, tick_id INTEGER, at REAL NOT NULL, action TEXT NOT NULL,
  target TEXT NOT NULL, params TEXT NOT NULL, proposer TEXT NOT NULL, reason TEXT NOT NULL,
  confidence REAL, verdict TEXT NOT NULL, why TEXT NOT NULL, guard TEXT, status TEXT NOT NULL,
  result TEXT, finished_at REAL, key TEXT UNIQUE, escalation_id INTEGER, parent_id INTEGER
);
CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@contextmanager
def bare_store(kind: str, tmp_path: Path) -> Iterator[Store]:
    """An empty store of `kind`, no journal opened on it yet."""
    if kind == "sqlite":
        yield SQLiteStore(tmp_path / "journal.db")
        return
    store = pg_store()
    try:
        yield store
    finally:
        store.drop()
        store.close()


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_journal_from_before_a_column_was_added_opens_and_is_brought_up_to_date(
    kind: str, tmp_path: Path
) -> None:
    with bare_store(kind, tmp_path) as store:
        store.create(statements(ACTIONS_BEFORE_TOKEN))
        with store.tx() as db:
            db.execute("INSERT INTO actions(at, action, target, params, proposer, reason, "
                       "verdict, why, status) VALUES (1.0, 'reboot', 'instance:7', '{}', 'p', "
                       "'r', 'act', 'w', 'ok')")  # fmt: skip
            db.execute("INSERT INTO kv(key, value) VALUES ('paused', 'true')")
        j = Journal(store)
        [old] = j.actions.recent()
        assert (old["target"], old["token"], old["params"]) == ("instance:7", None, {})
        assert j.meta.get("paused") is True
        lease = Lease(j, "a", ttl_s=60)
        assert lease.renew()
        j.actions.record(tick_id=None, now=2.0, action="reboot", target="instance:8",
                         params={}, proposer="p", reason="r", confidence=1.0, verdict="act",
                         why="w", status="intent")  # fmt: skip
        assert [r["token"] for r in j.actions.recent()] == [None, 1]
        assert j.fleet.history(3.0).last_acted == {"reboot:instance:7": 1.0,
                                                   "reboot:instance:8": 2.0}  # fmt: skip
        lease.release()
        Journal(store)  # opening again changes nothing


def test_every_part_shares_the_journal_store_and_its_transaction(j: Journal) -> None:
    parts = (j.meta, j.actions, j.escalations, j.fleet, j.llm)
    assert all(p.store is j.store for p in parts)
    with pytest.raises(RuntimeError), j.tx():
        j.meta.put("paused", True)
        j.llm.add_llm_usage(1.0, 10)
        raise RuntimeError("rolled back")
    assert j.meta.get("paused") is None and j.llm.llm_usage_since(0.0) == (0, 0)


def test_a_snapshot_reads_one_committed_state(j: Journal) -> None:
    j.meta.put("k", 1)
    other = peer(j)
    with j.store.snapshot() as db:
        before = db.execute("SELECT value FROM kv WHERE key = ?", ("k",)).rows
        other.meta.put("k", 2)  # committed by another connection while the snapshot is open
        again = db.execute("SELECT value FROM kv WHERE key = ?", ("k",)).rows
    assert before == again == [{"value": "1"}] and j.meta.get("k") == 2
    other.close()


def test_a_snapshot_on_postgresql_refuses_writes(tmp_path: Path) -> None:
    store = pg_store()
    try:
        j = Journal(store)
        with pytest.raises(JournalError, match="read-only"), store.snapshot() as db:
            db.execute("INSERT INTO kv(key, value) VALUES ('k', '1')")
        assert j.meta.get("k") is None
    finally:
        store.drop()
        store.close()


def test_the_config_puts_the_journal_on_postgresql(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = "fg_test_cfg_" + os.urandom(4).hex()
    text = f"journal:\n  dsn: {{env: FG_TEST_JOURNAL_DSN}}\n  schema_name: {schema}\n"
    monkeypatch.delenv("FG_TEST_JOURNAL_DSN", raising=False)
    with pytest.raises(ConfigError, match="journal.dsn"):  # the variable is not set
        open_journal(parse_config("c.yaml", text), tmp_path)
    monkeypatch.setenv("FG_TEST_JOURNAL_DSN", PG_DSN)
    j = open_journal(parse_config("c.yaml", text), tmp_path)
    try:
        assert isinstance(j.store, PostgresStore) and j.store.schema == schema
        assert "password" not in j.store.where and schema in j.store.where
        j.meta.put("k", 1)
        assert not (tmp_path / "journal.db").exists() and j.meta.get("k") == 1
    finally:
        assert isinstance(j.store, PostgresStore)
        j.store.drop()
        j.close()


def test_a_postgresql_statement_blocked_elsewhere_fails_in_bounded_time() -> None:
    """A lock held by another session (a migration, an operator's open transaction) held the
    lease's renewal, and with it the tick and /healthz sharing the connection, until it was
    released: now the statement times out as a journal error, and the connection goes on."""
    schema = "fg_test_lock_" + os.urandom(4).hex()
    store = PostgresStore(PG_DSN, schema, statement_timeout_s=0.5)
    try:
        lease = Lease(Journal(store), "a", ttl_s=5, margin_s=1)
        assert lease.renew()
        with psycopg.connect(PG_DSN, autocommit=True) as other, other.transaction():
            other.execute(f'LOCK TABLE "{schema}".leases IN ACCESS EXCLUSIVE MODE')
            with pytest.raises(JournalError, match="statement timeout"):
                lease.renew()
        assert lease.renew()  # the same term: the lock gone, it renews
    finally:
        store.drop()
        store.close()


def test_a_postgresql_schema_change_at_start_is_not_bounded_by_the_statement_timeout() -> None:
    """An index added to a large journal at an upgrade's first start takes as long as it
    takes: bounded like a tick's statements, it failed every start. The bound holds again
    after it (set for the schema change's transaction only)."""
    schema = "fg_test_slow_ddl_" + os.urandom(4).hex()
    store = PostgresStore(PG_DSN, schema, statement_timeout_s=0.2)
    try:
        store.create(["SELECT pg_sleep(0.5)", "CREATE TABLE IF NOT EXISTS slow (id INTEGER)"])
        store.add_column("slow", "note", "TEXT")
        with pytest.raises(JournalError, match="statement timeout"):
            store.query("SELECT pg_sleep(0.5)", ())
    finally:
        store.drop()
        store.close()


def test_a_postgresql_journal_drops_a_silent_server_within_a_minute() -> None:
    """A server gone without a word (a partition, a host powered off) left the connection
    waiting for an answer forever (the system's keepalive starts after two hours): libpq's
    keepalives and TCP_USER_TIMEOUT now end it, unless the DSN sets its own."""
    store = pg_store()
    try:
        fd = os.dup(store._connect().fileno())
        with socket.socket(fileno=fd) as sock:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            idle = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
            interval = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
            count = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
            assert idle + interval * count <= 60
            assert 0 < sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) <= 60_000
        own = PostgresStore(PG_DSN + " keepalives_idle=42", store.schema)
        with socket.socket(fileno=os.dup(own._connect().fileno())) as sock:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 42
        own.close()
    finally:
        store.drop()
        store.close()


def test_a_corrupt_sqlite_journal_is_an_error_naming_its_file(tmp_path: Path) -> None:
    """A page overwritten in the middle of the file: the error says which journal is broken
    (it said `journal (journal)`, whatever --state or the config had named)."""
    path = tmp_path / "journal.db"
    j = Journal(path)
    for n in range(400):
        j.meta.finish_tick(j.meta.start_tick(float(n), "r" * 200), float(n) + 1, {"n": n})
    j.close()
    with sqlite3.connect(path) as db:  # a leaf page of `ticks`, not one of the schema's
        size = db.execute("PRAGMA page_size").fetchone()[0]
        [page] = db.execute("SELECT max(pageno) FROM dbstat WHERE name = 'ticks' AND "
                            "pagetype = 'leaf'").fetchone()  # fmt: skip
    with path.open("r+b") as f:
        f.seek((page - 1) * size + 8)  # past the page header: garbage where its cells point
        f.write(b"\xde\xad\xbe\xef" * (size // 8))
    again = SQLiteStore(path)
    with pytest.raises(JournalError, match="malformed") as caught, again.tx() as db:
        db.execute("SELECT count(*) FROM ticks WHERE summary LIKE '%n%'")
    again.close()
    assert str(path) in str(caught.value) and "journal (journal)" not in str(caught.value)

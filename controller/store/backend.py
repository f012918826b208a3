"""Where the journal lives: SQLite (one file, the default) or PostgreSQL (shared, for HA).

One small interface, two backends. The journal and the lifecycle store write one portable SQL:
`?` placeholders, `INSERT ... ON CONFLICT ... DO UPDATE`, `INTEGER PRIMARY KEY` ids, `REAL`
times. The PostgreSQL backend translates placeholders and column types once per statement
(`REAL` becomes `DOUBLE PRECISION`: a float4 time would be wrong by minutes). Rows come back
as dicts. Every database error leaves as a `JournalError`, a duplicate key as `DuplicateKey`,
and neither names a password.

PostgreSQL also means Curio's own YugabyteDB (its YSQL API speaks the same protocol). The
tables go in their own schema (`fleetgate` unless configured), created on first use under an
advisory lock so that controllers starting together do not race.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Protocol

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row

Row = dict[str, Any]


class JournalError(Exception):
    """The journal's database failed; the message names the store, never a password."""


class DuplicateKey(JournalError):
    """A row with this unique key (a launch label, say) already exists."""


class StaleLeader(JournalError):
    """An action from a controller whose lease expired or was taken over: refused."""


class JournalLost(JournalError):
    """The journal this process opened is gone or was replaced under it (a deleted or swapped
    SQLite file, a PostgreSQL journal whose identity row changed): nothing may act on it."""


class Result:
    """What one statement returned: its rows (dicts) and how many rows it changed."""

    def __init__(self, rows: list[Row], rowcount: int) -> None:
        self.rows, self.rowcount = rows, rowcount

    def fetchone(self) -> Row | None:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Row]:
        return self.rows


class Tx(Protocol):
    """One open transaction."""

    lock_rows: str  # appended to a SELECT that must lock what it read (" FOR UPDATE" or "")

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Result: ...
    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...
    def insert(self, sql: str, args: Sequence[Any] = ()) -> int:
        """Run an INSERT into a table with an `id INTEGER PRIMARY KEY`; the new id."""
        ...

    def clock(self) -> float:
        """The store's own clock (epoch seconds): one clock for every controller sharing it."""
        ...


class Store(Protocol):
    kind: str  # "sqlite" | "postgres"
    where: str  # for messages: a path, or host/database/schema (never a password)

    def tx(self) -> AbstractContextManager[Tx]: ...
    def snapshot(self) -> AbstractContextManager[Tx]:
        """A read-only transaction: every statement in it sees the same committed state."""
        ...

    def query(self, sql: str, args: Sequence[Any] = ()) -> list[Row]: ...
    def vanished(self) -> str | None:
        """Why the database this store opened is no longer the one at its address (None: it
        is): what the journal's identity check (`Meta.check_identity`) asks first."""
        ...

    def others_version(self) -> int | None:
        """A number that changes whenever another connection commits to the database (None:
        this backend has none): while it stays, nothing this process did not write changed."""
        ...

    def create(self, ddl: Sequence[str]) -> None: ...
    def add_column(self, table: str, column: str, decl: str) -> None: ...
    def close(self) -> None: ...


def statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


# ---- SQLite ------------------------------------------------------------------------------------


def _dicts(cur: sqlite3.Cursor) -> list[Row]:
    rows = cur.fetchall()
    if not rows:
        return []
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in rows]


class _SQLiteTx:
    lock_rows = ""  # BEGIN IMMEDIATE already holds the write lock

    def __init__(self, db: sqlite3.Connection, clock: Callable[[], float] = time.time,
                 where: str = "journal") -> None:  # fmt: skip
        self._db = db
        self._clock = clock
        self._where = where  # the file, for messages

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Result:
        with _sqlite_errors(self._where):
            cur = self._db.execute(sql, tuple(args))
            return Result(_dicts(cur), cur.rowcount)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with _sqlite_errors(self._where):
            self._db.executemany(sql, rows)

    def insert(self, sql: str, args: Sequence[Any] = ()) -> int:
        with _sqlite_errors(self._where):
            return int(self._db.execute(sql, tuple(args)).lastrowid or 0)

    def clock(self) -> float:
        return self._clock()


def _file_id(path: Path | str) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`; None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


# How long the controller's statements wait for another connection's write (a person's
# answer, `prune`): a tick should fail and come again rather than stall. A person's command
# waits longer (`PERSON_WAIT_S`): it has nothing else to do, and the tick's writes are short.
WAIT_S = 5.0
_BUSY = ("database is locked", "database is busy", "database table is locked")
PERSON_WAIT_S = 30.0


class _sqlite_errors:  # noqa: N801 - used as a function: `with _sqlite_errors(where):`
    """SQLite's errors as the journal's (a class, not a generator: it wraps every statement)."""

    __slots__ = ("where",)

    def __init__(self, where: str) -> None:
        self.where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> Literal[False]:  # fmt: skip
        if exc is None or not isinstance(exc, sqlite3.Error):
            return False
        where = self.where
        if isinstance(exc, sqlite3.IntegrityError):
            if "UNIQUE" in str(exc):
                raise DuplicateKey(f"journal ({where}): {exc}") from exc
            raise JournalError(f"journal ({where}): {exc}") from exc
        if isinstance(exc, sqlite3.OperationalError) and str(exc) in _BUSY:
            raise JournalError(
                f"journal ({where}): another connection held a write on it past the wait (a "
                "fleetgate writing, or a program with a transaction open on the file); "
                "nothing was changed: try again") from exc  # fmt: skip
        raise JournalError(f"journal ({where}): {type(exc).__name__}: {exc}") from exc


class _SQLiteTransaction:
    """One `SQLiteStore.tx()` or `snapshot()`, holding the store's lock throughout: a
    transaction of its own; inside this thread's open one, a savepoint of it (a snapshot
    inside one is that one's already: nothing to undo). A failed COMMIT rolls back.
    (A class, not a generator: a tick opens several.)"""

    __slots__ = ("store", "begin", "mode")

    def __init__(self, store: SQLiteStore, begin: str) -> None:
        self.store, self.begin, self.mode = store, begin, ""

    def __enter__(self) -> Tx:
        store = self.store
        db = store._db
        store._lock.acquire()
        try:
            if not db.in_transaction:
                with _sqlite_errors(store.where):
                    db.execute(self.begin)
                self.mode = "own"
            elif self.begin == "BEGIN DEFERRED":
                self.mode = "inner"
            else:
                with _sqlite_errors(store.where):
                    db.execute("SAVEPOINT nested")
                self.mode = "savepoint"
        except BaseException:
            store._lock.release()
            raise
        return _SQLiteTx(db, store._clock, store.where)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> Literal[False]:  # fmt: skip
        store = self.store
        db = store._db
        try:
            if self.mode == "own":
                if exc is not None:
                    db.execute("ROLLBACK")
                    return False
                try:
                    with _sqlite_errors(store.where):
                        db.execute("COMMIT")
                except JournalError:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
            elif self.mode == "savepoint":
                if exc is not None:
                    db.execute("ROLLBACK TO nested")
                    db.execute("RELEASE nested")
                    return False
                with _sqlite_errors(store.where):
                    db.execute("RELEASE nested")
        finally:
            store._lock.release()
        return False


class SQLiteStore:
    """One file; one connection guarded by a lock; WAL so readers never block the controller."""

    kind = "sqlite"

    def __init__(self, path: str | Path, *, read_only: bool = False,
                 clock: Callable[[], float] = time.time,
                 wait_s: float = WAIT_S) -> None:  # fmt: skip
        """`clock` is the store's clock (`Tx.clock`): the host's wall clock. `wait_s`: how
        long a statement waits for another connection's write to end before it fails."""
        self.path = Path(path)
        wait = f"PRAGMA busy_timeout={max(1, round(wait_s * 1000))}"
        self._clock = clock
        self.where = str(self.path)
        self.read_only = read_only
        self._lock = threading.RLock()
        if read_only:  # the file must exist; any write is an error
            with _sqlite_errors(self.where):
                uri = f"{self.path.resolve().as_uri()}?mode=ro"
                self._db = sqlite3.connect(uri, uri=True, check_same_thread=False,
                                           isolation_level=None)  # fmt: skip
                self._db.execute(wait)
            self._file = _file_id(self.path)
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # /proc/x, a read-only mount: one line, not a traceback
            raise JournalError(f"state directory {str(self.path.parent)!r} is not writable: "
                               f"{exc.strerror or exc}") from exc  # fmt: skip
        with _sqlite_errors(self.where):
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(wait)
        self._file = _file_id(self.path)
        self._wal: tuple[int, int] | None = None  # the -wal file's id, once seen

    def vanished(self) -> str | None:
        """The file was deleted, or another file put in its place, since it was opened (the
        connection would go on writing to the old one, which nobody reads); or so was its
        write-ahead log, which holds the commits since the last checkpoint: the connection
        goes on committing into the deleted one, other readers fail on the new one, and a
        crash loses what it held. (SQLite deletes the log only when the last connection
        closes, and this one stays open.)"""
        now = _file_id(self.where)  # (a str: checked before every tick acts)
        if now is None:
            return f"the journal file {self.where} is missing"
        if self._file is not None and now != self._file:
            return f"the journal file {self.where} was replaced by another file"
        if self._file is None or self.read_only:
            return None
        wal = _file_id(self.where + "-wal")
        if self._wal is None:
            self._wal = wal  # (none before the first transaction: taken when first seen)
        elif wal is None:
            return f"the journal's write-ahead log {self.where}-wal is missing"
        elif wal != self._wal:
            return f"the journal's write-ahead log {self.where}-wal was replaced by another file"
        return None

    def others_version(self) -> int | None:
        """SQLite's `PRAGMA data_version`: it moves when another connection commits."""
        with self._lock, _sqlite_errors(self.where):
            return int(self._db.execute("PRAGMA data_version").fetchone()[0])

    def tx(self) -> AbstractContextManager[Tx]:
        return _SQLiteTransaction(self, "BEGIN IMMEDIATE")

    def snapshot(self) -> AbstractContextManager[Tx]:
        return _SQLiteTransaction(self, "BEGIN DEFERRED")  # a WAL reader: never waits for a writer

    def query(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        with self._lock, _sqlite_errors(self.where):
            return _dicts(self._db.execute(sql, tuple(args)))

    def create(self, ddl: Sequence[str]) -> None:
        with self.tx() as db:
            for statement in ddl:
                db.execute(statement)

    def add_column(self, table: str, column: str, decl: str) -> None:
        names = {r["name"] for r in self.query(f"PRAGMA table_info({table})")}
        if column not in names:
            with self.tx() as db:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")

    def close(self) -> None:
        with self._lock:
            self._db.close()


# ---- PostgreSQL --------------------------------------------------------------------------------

_TYPES = (
    (re.compile(r"\bINTEGER PRIMARY KEY\b"), "BIGSERIAL PRIMARY KEY"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
)


@lru_cache(maxsize=512)
def pg_sql(statement: str) -> str:
    """The PostgreSQL spelling of one portable statement."""
    if "%" in statement:
        raise ValueError(f"journal SQL must not contain '%': {statement[:80]!r}")
    for pattern, replacement in _TYPES:
        statement = pattern.sub(replacement, statement)
    return statement.replace("?", "%s")


class _PgTx:
    lock_rows = " FOR UPDATE"

    def __init__(self, conn: psycopg.Connection[Row], where: str) -> None:
        self._conn, self._where = conn, where

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Result:
        with _pg_errors(self._where):
            cur = self._conn.execute(pg_sql(sql), tuple(args))
            rows = cur.fetchall() if cur.description else []
            return Result(rows, cur.rowcount)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with _pg_errors(self._where), self._conn.cursor() as cur:
            cur.executemany(pg_sql(sql), [tuple(r) for r in rows])

    def insert(self, sql: str, args: Sequence[Any] = ()) -> int:
        row = self.execute(sql + " RETURNING id", args).fetchone()
        return int(row["id"]) if row else 0

    def clock(self) -> float:
        row = self.execute("SELECT extract(epoch FROM clock_timestamp())::float8 AS t").fetchone()
        return float(row["t"]) if row else time.time()


@contextmanager
def _pg_errors(where: str) -> Iterator[None]:
    try:
        yield
    except psycopg.errors.UniqueViolation as exc:
        raise DuplicateKey(f"journal ({where}): {exc.diag.message_primary or exc}") from exc
    except psycopg.Error as exc:
        detail = exc.diag.message_primary if getattr(exc, "diag", None) else None
        raise JournalError(f"journal ({where}): {type(exc).__name__}: {detail or exc}") from exc


# How long one statement may take, and when a silent peer counts as gone (libpq's keepalives
# and TCP_USER_TIMEOUT, unless the DSN sets them; Curio's sensor uses them too): the tick, the
# lease thread and /healthz share the one connection, and without these a lock held elsewhere
# or a server that vanished without a word (a partition, a host powered off) held all three
# forever, the lease never renewed.
STATEMENT_TIMEOUT_S = 30.0
KEEPALIVES = {"keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5",
              "keepalives_count": "3", "tcp_user_timeout": "30000"}  # fmt: skip


def with_keepalives(dsn: str) -> str:
    """`dsn` with the keepalive parameters it does not set itself (its own win)."""
    given = psycopg.conninfo.conninfo_to_dict(dsn)
    extra = {k: v for k, v in KEEPALIVES.items() if k not in given}
    return psycopg.conninfo.make_conninfo(dsn, **extra)


class PostgresStore:
    """A PostgreSQL (or YugabyteDB) schema. One connection, reopened after a failure; every
    statement on it bounded by `statement_timeout_s`, a silent peer dropped by keepalives."""

    kind = "postgres"

    def __init__(self, dsn: str, schema: str = "fleetgate", connect_timeout_s: int = 5,
                 statement_timeout_s: float = STATEMENT_TIMEOUT_S) -> None:  # fmt: skip
        self._dsn, self.schema, self._timeout = dsn, schema, connect_timeout_s
        self._statement_ms = str(max(1, round(statement_timeout_s * 1000)))
        self._lock = threading.RLock()
        self._conn: psycopg.Connection[Row] | None = None
        self.where = self.where_of(dsn, schema)
        self._connect()

    @staticmethod
    def where_of(dsn: str, schema: str) -> str:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        return (f"postgresql {info.get('host', 'localhost')}:{info.get('port', 5432)}"
                f"/{info.get('dbname', '')} schema {schema}")  # fmt: skip

    @staticmethod
    def holds_journal(dsn: str, schema: str, connect_timeout_s: int = 5) -> bool:
        """Whether `schema` holds a journal (its ticks table), asked without creating anything:
        the commands that only read or answer never create one."""
        where = PostgresStore.where_of(dsn, schema)
        with _pg_errors(where), psycopg.connect(
            dsn, autocommit=True, connect_timeout=connect_timeout_s,
            fallback_application_name="fleetgate",
        ) as conn:  # fmt: skip
            row = conn.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = %s "
                               "AND table_name = 'ticks'", (schema,)).fetchone()  # fmt: skip
        return row is not None

    def _connect(self) -> psycopg.Connection[Row]:
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        with _pg_errors(self.where):
            conn = psycopg.connect(with_keepalives(self._dsn), autocommit=True,
                                   row_factory=dict_row, connect_timeout=self._timeout,
                                   fallback_application_name="fleetgate")  # fmt: skip
            conn.execute("SELECT set_config('statement_timeout', %s, false)",
                         (self._statement_ms,))  # fmt: skip
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('fleetgate schema'))")
                conn.execute(pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}")
                             .format(pgsql.Identifier(self.schema)))  # fmt: skip
            conn.execute(pgsql.SQL("SET search_path TO {}").format(pgsql.Identifier(self.schema)))
        self._conn = conn
        return conn

    def tx(self) -> AbstractContextManager[Tx]:
        return self._transaction(None)

    def snapshot(self) -> AbstractContextManager[Tx]:
        return self._transaction("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    @contextmanager
    def _transaction(self, first: str | None) -> Iterator[Tx]:
        with self._lock:
            conn = self._connect()
            outer = conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
            try:
                with conn.transaction():  # inside this thread's own: a savepoint of it
                    tx = _PgTx(conn, self.where)
                    if first is not None and not outer:
                        tx.execute(first)
                    yield tx
            except psycopg.Error as exc:  # raised by COMMIT itself
                raise JournalError(f"journal ({self.where}): {type(exc).__name__}: {exc}") from exc

    def query(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        with self._lock:
            return _PgTx(self._connect(), self.where).execute(sql, args).rows

    # Schema changes run once, at start, without the statement bound: an index added to a
    # journal of millions of rows, or another controller holding the schema lock while it
    # builds one, may take longer, and a bounded one would fail every start after an upgrade.
    UNBOUNDED = "SELECT set_config('statement_timeout', '0', true)"

    def create(self, ddl: Sequence[str]) -> None:
        with self.tx() as db:
            db.execute(self.UNBOUNDED)
            db.execute("SELECT pg_advisory_xact_lock(hashtext('fleetgate schema'))")
            for statement in ddl:
                db.execute(statement)

    def add_column(self, table: str, column: str, decl: str) -> None:
        with self.tx() as db:
            db.execute(self.UNBOUNDED)
            db.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {decl}")

    def others_version(self) -> int | None:
        return None  # (no cheap equivalent: the identity row is read every time)

    def vanished(self) -> str | None:
        """None: a schema has no file to lose; its identity row (`Meta.check_identity`)
        tells whether it is still the journal this process opened."""
        return None

    def drop(self) -> None:
        """Drop the whole schema (tests and `fleetgate` tooling only)."""
        with self._lock, _pg_errors(self.where):
            self._connect().execute(pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
                                    .format(pgsql.Identifier(self.schema)))  # fmt: skip

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

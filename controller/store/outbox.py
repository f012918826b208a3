"""The escalation outbox: what the tick leaves for the escalation worker to do.

Table `outbox`, one row per job: `read_and_deliver` (ask the LLM about an escalation, then tell
people if it may not act) or `resolve` (end the channels' open alerts of an escalation that was
answered, expired or resolved). The tick only writes rows; the worker (escalation/outbox.py)
takes the due ones, in order, and records what came of each. A row survives a restart: work
written and not yet done is done by the next worker.

Columns: the escalation, the kind, when it was queued (`created_at`), tries so far
(`attempts`), when it is due (`next_at`), when it was finished (`done_at`) and how (`outcome`),
the last failure (`last_error`); the progress a retry keeps (`routed`: what the LLM made of
it, so a retry does not ask again; `sent`: the channels that already have it); the LLM's valid
targets (`targets`); who holds it (`taken_by`, `taken_until`, by the store's clock, so a worker
that died lets go). One job of each kind per escalation: queuing it again changes nothing.

Times other than `taken_until` are the controller's (virtual in the simulator). Must not: call
an LLM or a channel, or decide anything about an escalation (the worker does).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from controller.store.aggregate import Aggregate, dumps, loads
from controller.store.backend import Row, Store, statements

READ_AND_DELIVER = "read_and_deliver"
RESOLVE = "resolve"
KINDS = (READ_AND_DELIVER, RESOLVE)

_MINE = " WHERE id = ? AND taken_by = ?"
_RELEASE = "taken_by = NULL, taken_until = NULL"


def _list(values: Sequence[str] | None) -> str | None:
    return dumps(list(values)) if values is not None else None


@dataclass(frozen=True)
class Job:
    """One row of the outbox, decoded."""

    id: int
    escalation_id: int
    kind: str
    created_at: float
    attempts: int
    next_at: float
    targets: tuple[str, ...]
    routed: dict[str, Any] | None
    sent: tuple[str, ...]
    last_error: str | None = None

    @classmethod
    def of(cls, row: Row) -> Job:
        return cls(
            id=int(row["id"]), escalation_id=int(row["escalation_id"]), kind=str(row["kind"]),
            created_at=float(row["created_at"]), attempts=int(row["attempts"]),
            next_at=float(row["next_at"]), targets=tuple(loads(row["targets"], [])),
            routed=loads(row["routed"]), sent=tuple(loads(row["sent"], [])),
            last_error=row["last_error"],
        )  # fmt: skip


class OutboxStore(Aggregate):
    """The outbox table, on the journal's store (SQLite or PostgreSQL); created when missing."""

    SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
  id INTEGER PRIMARY KEY, escalation_id INTEGER NOT NULL, kind TEXT NOT NULL,
  created_at REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, next_at REAL NOT NULL,
  done_at REAL, outcome TEXT, last_error TEXT, targets TEXT, routed TEXT, sent TEXT,
  taken_by TEXT, taken_until REAL
);
CREATE UNIQUE INDEX IF NOT EXISTS outbox_once ON outbox(escalation_id, kind);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox(done_at, next_at);
"""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        store.create(statements(self.SCHEMA))

    def add(self, escalation_id: int, kind: str, now: float, *, targets: Collection[str] = (),
            routed: dict[str, Any] | None = None) -> int | None:  # fmt: skip
        """Queue a job, due at once; None if this escalation already has one of this kind.
        Inside the transaction that raised the escalation, the two are written together."""
        if kind not in KINDS:
            raise ValueError(f"outbox job kind {kind!r} is not one of {', '.join(KINDS)}")
        with self.tx() as db:
            cur = db.execute(
                "INSERT INTO outbox(escalation_id, kind, created_at, next_at, targets, routed) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(escalation_id, kind) DO NOTHING",
                (escalation_id, kind, now, now, dumps(sorted(targets)) if targets else None,
                 dumps(routed) if routed is not None else None),
            )  # fmt: skip
            if cur.rowcount != 1:
                return None
            row = db.execute("SELECT id FROM outbox WHERE escalation_id = ? AND kind = ?",
                             (escalation_id, kind)).fetchone()  # fmt: skip
        return int(row["id"]) if row else None

    def take(self, now: float, worker: str, hold_s: float) -> Job | None:
        """The first due job nobody holds, now held by `worker` for `hold_s` (store clock)."""
        with self.tx() as db:
            held = db.clock()
            row = db.execute(
                "SELECT * FROM outbox WHERE done_at IS NULL AND next_at <= ? AND "
                "(taken_until IS NULL OR taken_until < ?) ORDER BY id LIMIT 1" + db.lock_rows,
                (now, held),
            ).fetchone()
            if row is None:
                return None
            db.execute("UPDATE outbox SET taken_by = ?, taken_until = ? WHERE id = ?",
                       (worker, held + hold_s, row["id"]))  # fmt: skip
        return Job.of(row)

    def routed(self, job: Job, worker: str, routed: dict[str, Any]) -> bool:
        """Keep what the LLM made of it (a retry does not ask again); False if `worker` no
        longer holds the job."""
        with self.tx() as db:
            cur = db.execute("UPDATE outbox SET routed = ?" + _MINE,
                             (dumps(routed), job.id, worker))  # fmt: skip
            return cur.rowcount == 1

    def retry(self, job: Job, worker: str, *, next_at: float, error: str,
              sent: Sequence[str] | None = None) -> bool:  # fmt: skip
        """One more try made and failed: due again at `next_at`, let go."""
        with self.tx() as db:
            cur = db.execute(
                "UPDATE outbox SET attempts = attempts + 1, next_at = ?, last_error = ?, "
                f"sent = COALESCE(?, sent), {_RELEASE}" + _MINE,
                (next_at, error[:2000], _list(sent), job.id, worker),
            )
            return cur.rowcount == 1

    def finish(self, job: Job, worker: str, now: float, outcome: str, *,
               error: str | None = None, sent: Sequence[str] | None = None) -> bool:  # fmt: skip
        """Done (delivered, approved, skipped, or given up on): never taken again."""
        with self.tx() as db:
            cur = db.execute(
                "UPDATE outbox SET attempts = attempts + 1, done_at = ?, outcome = ?, "
                f"last_error = COALESCE(?, last_error), sent = COALESCE(?, sent), {_RELEASE}"
                + _MINE,
                (now, outcome[:2000], error[:2000] if error else None, _list(sent), job.id,
                 worker),
            )  # fmt: skip
            return cur.rowcount == 1

    def release(self, job: Job, worker: str, *, next_at: float, error: str,
                routed: dict[str, Any] | None = None) -> bool:  # fmt: skip
        """A worker that stops mid-job lets it go (counted as a try), for the next worker."""
        with self.tx() as db:
            cur = db.execute(
                "UPDATE outbox SET attempts = attempts + 1, next_at = ?, last_error = ?, "
                f"routed = COALESCE(?, routed), {_RELEASE}" + _MINE,
                (next_at, error[:2000], dumps(routed) if routed is not None else None, job.id,
                 worker),
            )  # fmt: skip
            return cur.rowcount == 1

    def jobs(self, escalation_id: int | None = None, *, undone: bool = False) -> list[Row]:
        """Rows (JSON columns decoded), oldest first: of one escalation, or all; only undone."""
        where, args = ["1 = 1"], []
        if escalation_id is not None:
            where, args = [*where, "escalation_id = ?"], [escalation_id]
        if undone:
            where.append("done_at IS NULL")
        rows = self._all(f"SELECT * FROM outbox WHERE {' AND '.join(where)} ORDER BY id", args)
        for r in rows:
            for k in ("targets", "routed", "sent"):
                r[k] = loads(r[k])
        return rows

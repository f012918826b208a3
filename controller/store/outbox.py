"""The escalation outbox: what the tick leaves for the escalation worker to do.

Table `outbox`, one row per job: `read_and_deliver` (ask the LLM about an escalation, then tell
people if it may not act), `resolve` (end the channels' open alerts of an escalation that was
answered, expired or resolved), or a notice (`notice:<source>`: a message for people that asks
nothing, such as a `notify` action or guards that trimmed an approved answer; `notice` holds
it, `delivered` each channel's outcome). A notice of no escalation has escalation id 0.
The tick only writes rows; the worker (escalation/outbox.py)
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
NOTICE = "notice:"  # + its source ("action:17", "llm", "guarded"): once per escalation
NO_ESCALATION = 0  # the escalation id of a notice about none

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
    notice: dict[str, Any] | None = None

    @property
    def is_notice(self) -> bool:
        return self.kind.startswith(NOTICE)

    @classmethod
    def of(cls, row: Row) -> Job:
        return cls(
            id=int(row["id"]), escalation_id=int(row["escalation_id"]), kind=str(row["kind"]),
            created_at=float(row["created_at"]), attempts=int(row["attempts"]),
            next_at=float(row["next_at"]), targets=tuple(loads(row["targets"], [])),
            routed=loads(row["routed"]), sent=tuple(loads(row["sent"], [])),
            last_error=row["last_error"], notice=loads(row.get("notice")),
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
    COLUMNS = (("outbox", "notice", "TEXT"), ("outbox", "delivered", "TEXT"))

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        store.create(statements(self.SCHEMA))
        for table, column, decl in self.COLUMNS:
            store.add_column(table, column, decl)

    def add(self, escalation_id: int, kind: str, now: float, *, targets: Collection[str] = (),
            routed: dict[str, Any] | None = None) -> int | None:  # fmt: skip
        """Queue a job, due at once; None if this escalation already has one of this kind.
        Inside the transaction that raised the escalation, the two are written together."""
        if kind not in KINDS:
            raise ValueError(f"outbox job kind {kind!r} is not one of {', '.join(KINDS)}")
        return self._add(escalation_id, kind, now, targets, routed, None)

    def add_notice(self, escalation_id: int | None, source: str, notice: dict[str, Any],
                   now: float) -> int | None:  # fmt: skip
        """Queue a notice, due at once; None if that escalation already has one from `source`
        (a notice of an action row: `action:<id>`, once)."""
        if not source or not isinstance(notice.get("text"), str):
            raise ValueError(f"a notice needs a source and a text, got {source!r}, {notice!r}")
        esc = NO_ESCALATION if escalation_id is None else escalation_id
        return self._add(esc, NOTICE + source, now, (), None, notice)

    def _add(self, escalation_id: int, kind: str, now: float, targets: Collection[str],
             routed: dict[str, Any] | None,
             notice: dict[str, Any] | None) -> int | None:  # fmt: skip
        with self.tx() as db:
            cur = db.execute(
                "INSERT INTO outbox(escalation_id, kind, created_at, next_at, targets, routed, "
                "notice) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(escalation_id, kind) DO NOTHING",
                (escalation_id, kind, now, now, dumps(sorted(targets)) if targets else None,
                 dumps(routed) if routed is not None else None,
                 dumps(notice) if notice is not None else None),
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

    def delivered(self, job: Job, outcomes: Sequence[dict[str, Any]]) -> None:
        """Add each channel's outcome of one try of a notice to its row (`delivered`)."""
        with self.tx() as db:
            row = db.execute("SELECT delivered FROM outbox WHERE id = ?", (job.id,)).fetchone()
            kept = loads(row["delivered"], []) if row else []
            db.execute("UPDATE outbox SET delivered = ? WHERE id = ?",
                       (dumps([*kept, *outcomes]), job.id))  # fmt: skip

    def notices(self, escalation_id: int | None = None) -> list[Row]:
        """Notices (JSON columns decoded), oldest first: of one escalation (0: of none), or all."""
        return [r for r in self.jobs(escalation_id) if str(r["kind"]).startswith(NOTICE)]

    def jobs(self, escalation_id: int | None = None, *, undone: bool = False) -> list[Row]:
        """Rows (JSON columns decoded), oldest first: of one escalation, or all; only undone."""
        where, args = ["1 = 1"], []
        if escalation_id is not None:
            where, args = [*where, "escalation_id = ?"], [escalation_id]
        if undone:
            where.append("done_at IS NULL")
        rows = self._all(f"SELECT * FROM outbox WHERE {' AND '.join(where)} ORDER BY id", args)
        for r in rows:
            for k in ("targets", "routed", "sent", "notice", "delivered"):
                r[k] = loads(r.get(k))
        return rows

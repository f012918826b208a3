"""Escalations (what the rules could not decide, put to a person) and their deliveries.

Tables: `escalations`, `deliveries`. An escalation is answered once: by a person, by the
default when its deadline passes, or not at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controller.store.aggregate import Aggregate, dumps, loads
from controller.store.backend import Row


def _decoded(r: Row) -> Row:
    for k in ("situation", "default_action", "answer"):
        r[k] = loads(r.get(k))
    return r


class Escalations(Aggregate):
    """Each escalation, its status and answer; each attempt to deliver it on a channel."""

    SCHEMA = """
CREATE TABLE IF NOT EXISTS escalations (
  id INTEGER PRIMARY KEY, fingerprint TEXT NOT NULL, kind TEXT NOT NULL, subject TEXT NOT NULL,
  summary TEXT NOT NULL, created_at REAL NOT NULL, deadline REAL NOT NULL, status TEXT NOT NULL,
  situation TEXT NOT NULL, default_action TEXT NOT NULL, answered_by TEXT, answered_at REAL,
  answer TEXT, executed_action_id INTEGER
);
CREATE INDEX IF NOT EXISTS escalations_fp ON escalations(fingerprint, created_at);
CREATE INDEX IF NOT EXISTS escalations_status ON escalations(status);
CREATE INDEX IF NOT EXISTS escalations_answered ON escalations(answered_at);
CREATE TABLE IF NOT EXISTS deliveries (
  id INTEGER PRIMARY KEY, escalation_id INTEGER NOT NULL, channel TEXT NOT NULL, at REAL NOT NULL,
  ok INTEGER NOT NULL, detail TEXT
);
"""

    # ---- escalations -----------------------------------------------------------------------
    def add_escalation(
        self,
        *,
        fingerprint: str,
        kind: str,
        subject: str,
        summary: str,
        now: float,
        deadline: float,
        situation: dict[str, Any],
        default_action: dict[str, Any],
    ) -> int:
        """A new pending escalation; its id."""
        with self.tx() as db:
            return db.insert(
                "INSERT INTO escalations(fingerprint, kind, subject, summary, created_at, "
                "deadline, status, situation, default_action) "
                "VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?)",
                (fingerprint, kind, subject, summary, now, deadline, dumps(situation),
                 dumps(default_action)),
            )  # fmt: skip

    def last_escalation(self, fingerprint: str) -> Row | None:
        """The latest escalation of this fingerprint, as stored (JSON columns not decoded)."""
        return self._one(
            "SELECT * FROM escalations WHERE fingerprint = ? ORDER BY id DESC LIMIT 1",
            (fingerprint,),
        )

    def earlier(self, fingerprint: str, before_id: int, limit: int = 5) -> list[Row]:
        """The last `limit` escalations of this fingerprint raised before escalation
        `before_id`, oldest first, decoded: how the same situation went before."""
        rows = self._all(
            "SELECT * FROM escalations WHERE fingerprint = ? AND id < ? ORDER BY id DESC LIMIT ?",
            (fingerprint, before_id, max(0, limit)),
        )
        return [_decoded(r) for r in rows[::-1]]

    def recent(self, status: str | None = None, limit: int = 200) -> list[Row]:
        """The last `limit` escalations (of `status`, if given), oldest first, decoded."""
        where, args = ("WHERE status = ?", [status]) if status else ("", [])
        rows = self._all(
            f"SELECT * FROM escalations {where} ORDER BY id DESC LIMIT ?", [*args, limit]
        )
        return [_decoded(r) for r in rows[::-1]]

    def by_status(self, statuses: Sequence[str], limit: int = 200) -> dict[str, list[Row]]:
        """The last `limit` escalations of each of `statuses`, oldest first, decoded, in one
        read (a tick reads the pending and the approved ones)."""
        one = ("SELECT * FROM (SELECT * FROM escalations WHERE status = ? ORDER BY id DESC "
               "LIMIT ?) AS s{}")  # fmt: skip
        rows = self._all(" UNION ALL ".join(one.format(n) for n in range(len(statuses))),
                         [x for status in statuses for x in (status, limit)])  # fmt: skip
        out: dict[str, list[Row]] = {status: [] for status in statuses}
        for r in sorted(rows, key=lambda r: int(r["id"])):
            out[str(r["status"])].append(_decoded(r))
        return out

    def escalation(self, esc_id: int) -> Row | None:
        row = self._one("SELECT * FROM escalations WHERE id = ?", (esc_id,))
        return _decoded(row) if row else None

    def answer(
        self, esc_id: int, *, status: str, by: str, now: float, answer: dict[str, Any] | None
    ) -> bool:
        """Answer a pending escalation; False if it was not pending (answered or expired)."""
        with self.tx() as db:
            cur = db.execute(
                "UPDATE escalations SET status = ?, answered_by = ?, answered_at = ?, "
                "answer = ? WHERE id = ? AND status = 'pending'",
                (status, by, now, dumps(answer) if answer else None, esc_id),
            )
            return cur.rowcount == 1

    def set_escalation_status(self, esc_id: int, status: str, action_id: int | None = None) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE escalations SET status = ?, executed_action_id = ? WHERE id = ?",
                (status, action_id, esc_id),
            )

    # ---- deliveries ------------------------------------------------------------------------
    def add_delivery(self, esc_id: int, channel: str, now: float, ok: bool, detail: str) -> None:
        with self.tx() as db:
            db.execute(
                "INSERT INTO deliveries(escalation_id, channel, at, ok, detail) "
                "VALUES (?, ?, ?, ?, ?)",
                (esc_id, channel, now, int(ok), detail),
            )

    def deliveries(self, esc_id: int) -> list[Row]:
        return self._all(
            "SELECT channel, at, ok, detail FROM deliveries WHERE escalation_id = ? ORDER BY id",
            (esc_id,),
        )

    # ---- what answers teach: learned rules, the autonomy track record ----------------------
    # The track record reads the actions people's answers carried out, and journals autonomy
    # demotions as events (kind AUTONOMY_EVENT in the fleet's `events` table).
    AUTONOMY_EVENT = "autonomy_demoted"

    def history(self, since: float | None = None) -> list[Row]:
        """Every escalation (raised at or after `since`, if given), oldest first, decoded."""
        where, args = ("WHERE created_at >= ?", [since]) if since is not None else ("", [])
        return [_decoded(r) for r in self._all(f"SELECT * FROM escalations {where} ORDER BY id",
                                               args)]  # fmt: skip

    def answered_since(self, since: float) -> list[Row]:
        """Escalations answered (by anyone, the deadline included) at or after `since`, oldest
        first, decoded."""
        rows = self._all("SELECT * FROM escalations WHERE answered_at >= ? ORDER BY +id",
                         (since,))  # fmt: skip
        return [_decoded(r) for r in rows]

    def answers_signature(self, since: float) -> str:
        """Changes whenever an escalation answered since `since` is answered, carried out,
        vetoed or voided: whether the track record needs reading again."""
        rows = self._all(  # `+id`: else SQLite walks the whole table in id order
            "SELECT id, status FROM escalations WHERE answered_at >= ? ORDER BY +id", (since,)
        )
        return dumps([[r["id"], r["status"]] for r in rows])

    _EXECUTED = (
        "SELECT a.id, a.at, a.action, a.target, a.proposer, a.escalation_id, "
        "e.kind AS kind FROM actions a LEFT JOIN escalations e ON e.id = a.escalation_id "
        "WHERE a.verdict = 'act' AND a.status = 'ok' AND a.parent_id IS NULL AND "
    )

    def executed_by_people(self, since: float) -> list[Row]:
        """Actions carried out (`ok`) at or after `since` that a person's answer asked for,
        each with its escalation's `kind`; oldest first."""
        people = "substr(a.proposer, 1, 6) = 'human:'"  # no LIKE: '%' is the driver's
        return self._all(self._EXECUTED + f"a.at >= ? AND {people} ORDER BY a.id", (since,))

    def executed_between(self, since: float, before: float, actions: tuple[str, ...]
                         ) -> list[Row]:  # fmt: skip
        """Actions named `actions` carried out (`ok`) in [since, before), each with its
        escalation's `kind` (None: none); oldest first."""
        marks = ", ".join("?" * len(actions))
        return self._all(self._EXECUTED + f"a.at >= ? AND a.at < ? AND a.action IN ({marks}) "
                         "ORDER BY a.id", (since, before, *actions))  # fmt: skip

    def add_autonomy_event(self, now: float, detail: dict[str, Any]) -> None:
        with self.tx() as db:
            db.execute("INSERT INTO events(instance_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                       ("autonomy", now, self.AUTONOMY_EVENT, dumps(detail)))  # fmt: skip

    def autonomy_events(self) -> list[Row]:
        """Every autonomy demotion journaled, oldest first, `detail` decoded."""
        rows = self._all("SELECT id, at, detail FROM events WHERE kind = ? ORDER BY id",
                         (self.AUTONOMY_EVENT,))  # fmt: skip
        for r in rows:
            r["detail"] = loads(r["detail"], {})
        return rows

"""Rules waiting out their `for:`: since when each (rule, subject) condition has held.

Table: `rule_pending` (rule, subject, since, last_seen), brought to what `controller.rules.hold`
worked out by each tick: a condition no longer holding is gone from it, so it never grows past
the conditions holding now; a hold that goes on costs only its `last_seen`. A controller
restarted on the same journal reads it back and keeps each hold's clock.
"""

from __future__ import annotations

from collections.abc import Mapping

from controller.store.aggregate import Aggregate
from controller.store.backend import JournalError

Key = tuple[str, str]  # (rule name, subject), as `controller.rules.hold` names a hold
Since = tuple[float, float]  # (since, last_seen)


class RulePending(Aggregate):
    """Per (rule, subject): since when its condition has held, and when a tick last saw it."""

    _left_empty = False  # this process's last save emptied the table

    SCHEMA = """
CREATE TABLE IF NOT EXISTS rule_pending (
  rule TEXT NOT NULL, subject TEXT NOT NULL, since REAL NOT NULL, last_seen REAL NOT NULL,
  PRIMARY KEY (rule, subject)
);
"""

    def load(self) -> dict[Key, Since]:
        """Every hold in progress. A journal opened for reading only that an earlier version
        wrote has no such table yet: nothing is in progress there."""
        try:
            rows = self._all("SELECT rule, subject, since, last_seen FROM rule_pending")
        except JournalError:
            if not getattr(self.store, "read_only", False):
                raise
            return {}
        return {(str(r["rule"]), str(r["subject"])): (float(r["since"]), float(r["last_seen"]))
                for r in rows}  # fmt: skip

    def save(self, pending: Mapping[Key, Since]) -> None:
        """Make the table `pending` (what the tick saw hold): holds that ended are deleted,
        new ones inserted, and every one's `last_seen` set (a tick sees all it keeps at once).
        Once this process has left the table empty, an empty `pending` writes nothing (the
        leader alone writes it)."""
        if not pending and self._left_empty:
            return
        with self.tx() as db:
            rows = db.execute("SELECT rule, subject FROM rule_pending").fetchall()
            stored = {(str(r["rule"]), str(r["subject"])) for r in rows}
            db.executemany("DELETE FROM rule_pending WHERE rule = ? AND subject = ?",
                           sorted(stored - set(pending)))  # fmt: skip
            db.executemany(
                "INSERT INTO rule_pending(rule, subject, since, last_seen) VALUES (?, ?, ?, ?)",
                [(*key, *pending[key]) for key in sorted(set(pending) - stored)],
            )
            seen = {s[1] for s in pending.values()}
            if len(seen) == 1:  # a tick's: every hold it keeps was seen at its `now`
                db.execute("UPDATE rule_pending SET last_seen = ?", (seen.pop(),))
            else:
                db.executemany("UPDATE rule_pending SET last_seen = ? WHERE rule = ? AND "
                               "subject = ?", [(s[1], *k) for k, s in pending.items()])  # fmt: skip
        self._left_empty = not pending

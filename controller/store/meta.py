"""Ticks, rule reloads and the key/value store (the pause switch, the simulator's state).

Tables: `ticks`, `rule_reloads`, `kv`. The key/value table is shared by name: the tracks and
hosts (`controller/store/fleet.py`) keep their version stamps in it under keys of their own.

The journal's identity is a random id under `journal_id`, written once: a controller notes it
and checks before acting (`check_identity`) that the journal it writes to is still that one
and still the one at its address (a SQLite file deleted or swapped, a schema dropped and made
again, the row deleted), or it stops acting.
"""

from __future__ import annotations

import secrets
from typing import Any

from controller.store.aggregate import Aggregate, dumps, loads
from controller.store.backend import JournalError, JournalLost, Tx

IDENTITY = "journal_id"
FORMAT_KEY = "journal_format"
# What this release stores that an earlier one cannot read, counted: raised with each such
# change (2: a track's `started` and `died`), so that an earlier release opening a later one's
# journal refuses it in one line, where it would fail every tick. A journal without the mark
# is of format 1.
FORMAT = 2
MAX_PROBLEMS_CHARS = 20_000  # of a failed reload's problems, as stored

UPSERT_KV = ("INSERT INTO kv(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET "
             "value = excluded.value")  # fmt: skip


class Meta(Aggregate):
    """Each tick's start, end and summary; each rules reload; named values."""

    SCHEMA = """
CREATE TABLE IF NOT EXISTS ticks (
  id INTEGER PRIMARY KEY, started_at REAL NOT NULL, finished_at REAL, rules TEXT,
  summary TEXT
);
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rule_reloads (
  id INTEGER PRIMARY KEY, at REAL NOT NULL, ok INTEGER NOT NULL, digest TEXT NOT NULL,
  problems TEXT
);
"""

    _verified: tuple[int, str] | None = None  # (`others_version`, id) when it last matched

    # ---- key/value -------------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        row = self._one("SELECT value FROM kv WHERE key = ?", (key,))
        return loads(row["value"]) if row else default

    def put(self, key: str, value: Any) -> None:
        with self.tx() as db:
            db.execute(UPSERT_KV, (key, dumps(value)))

    # ---- format ----------------------------------------------------------------------------
    def check_format(self, *, mark: bool) -> None:
        """`JournalError` if a later release wrote this journal (its format is above
        `FORMAT`); else, with `mark`, note this release's format in it."""
        row = self._one("SELECT value FROM kv WHERE key = ?", (FORMAT_KEY,))
        stored = int(loads(row["value"])) if row else 1
        if stored > FORMAT:
            where = getattr(self.store, "where", "the journal")
            raise JournalError(f"journal ({where}): written by a later fleetgate (journal format "
                               f"{stored}; this release reads formats up to {FORMAT}): run "
                               "that release, or this one on a copy of the journal from "
                               "before the upgrade")  # fmt: skip
        if mark and stored < FORMAT:
            self.put(FORMAT_KEY, FORMAT)

    # ---- identity --------------------------------------------------------------------------
    def identity(self) -> str:
        """This journal's id, made on first use."""
        with self.tx() as db:
            row = db.execute("SELECT value FROM kv WHERE key = ?", (IDENTITY,)).fetchone()
            if row is not None:
                return str(loads(row["value"]))
            made = secrets.token_hex(16)
            db.execute(UPSERT_KV, (IDENTITY, dumps(made)))
            return made

    def check_identity(self, expected: str) -> None:
        """Raise `JournalLost` unless this is still the journal whose id is `expected`. The
        identity row is read again only when another connection committed since it last
        matched (this process never changes it once made)."""
        why = self.store.vanished()
        stamp = self.store.others_version() if why is None else None
        if why is None and (stamp is None or (stamp, expected) != self._verified):
            try:
                found = self.get(IDENTITY)
            except JournalError as exc:
                if "no such table" not in str(exc) and "does not exist" not in str(exc):
                    raise
                found = None
            if found is None:
                why = f"the journal at {self.store.where} has no identity row any more"
            elif found != expected:
                why = f"the journal at {self.store.where} is another journal now"
        if why is not None:
            self._verified = None
            raise JournalLost(why)
        self._verified = (stamp, expected) if stamp is not None else None

    # ---- ticks -----------------------------------------------------------------------------
    def start_tick(self, now: float, rules: str, db: Tx | None = None) -> int:
        """A new tick's row (its id); in `db`, the caller's open transaction, when given."""
        sql = "INSERT INTO ticks(started_at, rules) VALUES (?, ?)"
        if db is not None:
            return db.insert(sql, (now, rules))
        with self.tx() as own:
            return own.insert(sql, (now, rules))

    def finish_tick(self, tick_id: int, now: float, summary: dict[str, Any]) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE ticks SET finished_at = ?, summary = ? WHERE id = ?",
                (now, dumps(summary), tick_id),
            )

    def ticks(self, limit: int = 20) -> list[dict[str, Any]]:
        """The last `limit` ticks, newest first, their summaries decoded."""
        rows = self._all("SELECT * FROM ticks ORDER BY id DESC LIMIT ?", (limit,))
        for r in rows:
            r["summary"] = loads(r["summary"])
        return rows

    def last_started(self) -> float | None:
        """When the newest tick (by id) started: one row by its key (`last_now`'s MAX over
        `started_at` reads every tick's row)."""
        row = self._one("SELECT started_at FROM ticks WHERE id = (SELECT MAX(id) FROM ticks)")
        return float(row["started_at"]) if row else None

    def last_now(self) -> float | None:
        """When the last tick started (None before the first)."""
        row = self._one("SELECT MAX(started_at) AS t FROM ticks")
        return float(row["t"]) if row and row["t"] is not None else None

    # ---- rule reloads ----------------------------------------------------------------------
    def add_reload(self, now: float, ok: bool, digest: str, problems: str = "") -> None:
        with self.tx() as db:
            db.execute("INSERT INTO rule_reloads(at, ok, digest, problems) VALUES (?, ?, ?, ?)",
                       (now, int(ok), digest, problems[:MAX_PROBLEMS_CHARS]))  # fmt: skip

    def reloads(self) -> list[dict[str, Any]]:
        return self._all("SELECT * FROM rule_reloads ORDER BY id")

"""The journal: everything the controller did and remembers, in SQLite or PostgreSQL.

Ticks; actions (intent written before acting, result after, who proposed it and why);
escalations and their deliveries; per-instance tracks and events (stage changes, deaths,
restarts); hosts (benchmark rates, failures, blocks); replacements in flight; a small key/value
store (pause switch, simulator state); the leader lease (controller/store/lease.py). The SQL is
written once, portable; `controller/store/backend.py` runs it on either database.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from controller.core.track import Event, History, Track
from controller.store.backend import JournalError, SQLiteStore, StaleLeader, Store, Tx, statements

__all__ = ["Journal", "JournalError", "StaleLeader"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS ticks (
  id INTEGER PRIMARY KEY, started_at REAL NOT NULL, finished_at REAL, rules TEXT,
  summary TEXT
);
CREATE TABLE IF NOT EXISTS actions (
  id INTEGER PRIMARY KEY, tick_id INTEGER, at REAL NOT NULL, action TEXT NOT NULL,
  target TEXT NOT NULL, params TEXT NOT NULL, proposer TEXT NOT NULL, reason TEXT NOT NULL,
  confidence REAL, verdict TEXT NOT NULL, why TEXT NOT NULL, guard TEXT, status TEXT NOT NULL,
  result TEXT, finished_at REAL, key TEXT UNIQUE, escalation_id INTEGER, parent_id INTEGER
);
CREATE INDEX IF NOT EXISTS actions_at ON actions(at);
CREATE INDEX IF NOT EXISTS actions_status ON actions(status);
CREATE INDEX IF NOT EXISTS actions_kind ON actions(action, status, at);
CREATE INDEX IF NOT EXISTS actions_target ON actions(target, at);
CREATE TABLE IF NOT EXISTS escalations (
  id INTEGER PRIMARY KEY, fingerprint TEXT NOT NULL, kind TEXT NOT NULL, subject TEXT NOT NULL,
  summary TEXT NOT NULL, created_at REAL NOT NULL, deadline REAL NOT NULL, status TEXT NOT NULL,
  situation TEXT NOT NULL, default_action TEXT NOT NULL, answered_by TEXT, answered_at REAL,
  answer TEXT, executed_action_id INTEGER
);
CREATE INDEX IF NOT EXISTS escalations_fp ON escalations(fingerprint, created_at);
CREATE INDEX IF NOT EXISTS escalations_status ON escalations(status);
CREATE TABLE IF NOT EXISTS deliveries (
  id INTEGER PRIMARY KEY, escalation_id INTEGER NOT NULL, channel TEXT NOT NULL, at REAL NOT NULL,
  ok INTEGER NOT NULL, detail TEXT
);
CREATE TABLE IF NOT EXISTS tracks (id TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY, instance_id TEXT NOT NULL, at REAL NOT NULL, kind TEXT NOT NULL,
  detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_at ON events(at);
CREATE INDEX IF NOT EXISTS events_kind ON events(kind, at);
CREATE TABLE IF NOT EXISTS hosts (
  machine_id TEXT PRIMARY KEY, bench_rate REAL, bench_at REAL, failures INTEGER DEFAULT 0,
  blocked_until REAL, block_reason TEXT
);
CREATE TABLE IF NOT EXISTS replacements (
  old_id TEXT PRIMARY KEY, new_label TEXT NOT NULL, new_id TEXT, created_at REAL NOT NULL,
  deadline REAL NOT NULL, state TEXT NOT NULL, action_id INTEGER
);
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS llm_calls (
  id INTEGER PRIMARY KEY, escalation_id INTEGER, at REAL NOT NULL, model TEXT NOT NULL,
  prompt_digest TEXT, status TEXT NOT NULL, action TEXT, params TEXT, confidence REAL,
  rationale TEXT, error TEXT, tokens INTEGER NOT NULL DEFAULT 0, latency_ms REAL,
  routed TEXT
);
CREATE INDEX IF NOT EXISTS llm_calls_at ON llm_calls(at);
CREATE TABLE IF NOT EXISTS rule_reloads (
  id INTEGER PRIMARY KEY, at REAL NOT NULL, ok INTEGER NOT NULL, digest TEXT NOT NULL,
  problems TEXT
);
CREATE TABLE IF NOT EXISTS llm_usage (id INTEGER PRIMARY KEY, at REAL NOT NULL, tokens INTEGER);
CREATE INDEX IF NOT EXISTS llm_usage_at ON llm_usage(at);
CREATE TABLE IF NOT EXISTS leases (
  name TEXT PRIMARY KEY, holder TEXT NOT NULL, token INTEGER NOT NULL, acquired_at REAL NOT NULL,
  expires_at REAL NOT NULL
);
"""

HISTORY_WINDOW_S = 3 * 3600
TRACKS_VERSION = "tracks.version"  # changes with every save: whose tracks are stored
HOSTS_VERSION = "hosts.version"  # likewise for hosts
UPTIME_EVERY = 10  # saves between writes of tracks whose only change is the daemon's uptime


assert Track._fields[-1] == "uptime", "save_tracks compares tracks without their last field"


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


class Fence:
    """The lease an acting controller holds: every action it records must still match it."""

    def __init__(self, name: str, holder: str, token: int) -> None:
        self.name, self.holder, self.token = name, holder, token


class Journal:
    """The store behind every record. All methods are safe from the scheduler and the CLI."""

    def __init__(self, where: str | Path | Store) -> None:
        self.store: Store = SQLiteStore(where) if isinstance(where, str | Path) else where
        self.path: Path | None = getattr(self.store, "path", None)
        self.fence: Fence | None = None  # set while this process leads (controller/store/lease.py)
        self._tracks: dict[str, Track] | None = None  # as this process last saved or read them
        self._tracks_version: str | None = None
        self._saves = 0
        self._hosts: dict[str, dict[str, Any]] | None = None  # machine_id -> row
        self._hosts_version: str | None = None
        self.store.create(statements(SCHEMA))
        self.store.add_column("actions", "token", "INTEGER")

    def close(self) -> None:
        self.store.close()

    @contextmanager
    def tx(self) -> Iterator[Tx]:
        """One atomic transaction."""
        with self.store.tx() as db:
            yield db

    def _all(self, sql: str, args: Iterable[Any] = ()) -> list[dict[str, Any]]:
        return self.store.query(sql, tuple(args))

    def _one(self, sql: str, args: Iterable[Any] = ()) -> dict[str, Any] | None:
        rows = self._all(sql, args)
        return rows[0] if rows else None

    # ---- key/value -------------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        row = self._one("SELECT value FROM kv WHERE key = ?", (key,))
        return json.loads(row["value"]) if row else default

    def put(self, key: str, value: Any) -> None:
        with self.tx() as db:
            db.execute(
                "INSERT INTO kv(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET "
                "value = excluded.value",
                (key, _dumps(value)),
            )

    # ---- ticks -----------------------------------------------------------------------------
    def start_tick(self, now: float, rules: str) -> int:
        with self.tx() as db:
            return db.insert("INSERT INTO ticks(started_at, rules) VALUES (?, ?)", (now, rules))

    def finish_tick(self, tick_id: int, now: float, summary: dict[str, Any]) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE ticks SET finished_at = ?, summary = ? WHERE id = ?",
                (now, _dumps(summary), tick_id),
            )

    def ticks(self, limit: int = 20) -> list[dict[str, Any]]:
        rows = self._all("SELECT * FROM ticks ORDER BY id DESC LIMIT ?", (limit,))
        for r in rows:
            r["summary"] = json.loads(r["summary"]) if r["summary"] else None
        return rows

    def last_now(self) -> float | None:
        row = self._one("SELECT MAX(started_at) AS t FROM ticks")
        return float(row["t"]) if row and row["t"] is not None else None

    # ---- actions ---------------------------------------------------------------------------
    def record(
        self,
        *,
        tick_id: int | None,
        now: float,
        action: str,
        target: str,
        params: dict[str, Any],
        proposer: str,
        reason: str,
        confidence: float | None,
        verdict: str,
        why: str,
        guard: str = "",
        status: str,
        key: str | None = None,
        escalation_id: int | None = None,
        parent_id: int | None = None,
    ) -> int:
        """Write one decision. For `act`, status is `intent`: written before the provider call.

        While this process leads (`fence` set), an action to execute is written only if the
        lease is still this process's and unexpired, by the store's clock, in the same
        transaction; otherwise `StaleLeader` and nothing is written or done."""
        with self.tx() as db:
            token = self._check_fence(db) if verdict == "act" else None
            return db.insert(
                "INSERT INTO actions(tick_id, at, action, target, params, proposer, reason, "
                "confidence, verdict, why, guard, status, key, escalation_id, parent_id, token) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    tick_id,
                    now,
                    action,
                    target,
                    _dumps(params),
                    proposer,
                    reason,
                    confidence,
                    verdict,
                    why,
                    guard,
                    status,
                    key,
                    escalation_id,
                    parent_id,
                    token,
                ),
            )

    def _check_fence(self, db: Tx) -> int | None:
        fence = self.fence
        if fence is None:
            return None
        row = db.execute(
            "SELECT holder, token, expires_at FROM leases WHERE name = ?" + db.lock_rows,
            (fence.name,),
        ).fetchone()
        now = db.clock()
        if row is None or int(row["token"]) != fence.token or row["holder"] != fence.holder:
            held = f"{row['holder']} (token {row['token']})" if row else "nobody"
            raise StaleLeader(f"lease {fence.name!r} is held by {held}, not by {fence.holder} "
                              f"(token {fence.token}): action refused")  # fmt: skip
        if float(row["expires_at"]) <= now:
            raise StaleLeader(f"lease {fence.name!r} of {fence.holder} (token {fence.token}) "
                              f"expired {now - float(row['expires_at']):.1f} s ago: "
                              "action refused")  # fmt: skip
        return fence.token

    def finish(self, action_id: int, now: float, status: str, result: dict[str, Any]) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE actions SET status = ?, result = ?, finished_at = ? WHERE id = ?",
                (status, _dumps(result), now, action_id),
            )

    def actions(self, limit: int = 100, *, executed_only: bool = False) -> list[dict[str, Any]]:
        where = "WHERE verdict = 'act'" if executed_only else ""
        rows = self._all(f"SELECT * FROM actions {where} ORDER BY id DESC LIMIT ?", (limit,))
        for r in rows:
            r["params"] = json.loads(r["params"])
            r["result"] = json.loads(r["result"]) if r["result"] else None
        return rows[::-1]

    def in_flight(self) -> list[dict[str, Any]]:
        return self._all("SELECT * FROM actions WHERE status = 'intent' ORDER BY id")

    def recent_for(self, target: str, since: float) -> list[dict[str, Any]]:
        rows = self._all(
            "SELECT at, action, params, status, proposer FROM actions WHERE target = ? "
            "AND verdict = 'act' AND at >= ? ORDER BY id",
            (target, since),
        )
        for r in rows:
            r["params"] = json.loads(r["params"])
        return rows

    # ---- escalations -----------------------------------------------------------------------
    def last_escalation(self, fingerprint: str) -> dict[str, Any] | None:
        return self._one(
            "SELECT * FROM escalations WHERE fingerprint = ? ORDER BY id DESC LIMIT 1",
            (fingerprint,),
        )

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
        with self.tx() as db:
            return db.insert(
                "INSERT INTO escalations(fingerprint, kind, subject, summary, created_at, "
                "deadline, "
                "status, situation, default_action) VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?)",
                (
                    fingerprint,
                    kind,
                    subject,
                    summary,
                    now,
                    deadline,
                    _dumps(situation),
                    _dumps(default_action),
                ),
            )

    def escalations(self, status: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
        where, args = ("WHERE status = ?", [status]) if status else ("", [])
        rows = self._all(
            f"SELECT * FROM escalations {where} ORDER BY id DESC LIMIT ?", [*args, limit]
        )
        return [self._decode_esc(r) for r in rows[::-1]]

    def escalation(self, esc_id: int) -> dict[str, Any] | None:
        row = self._one("SELECT * FROM escalations WHERE id = ?", (esc_id,))
        return self._decode_esc(row) if row else None

    @staticmethod
    def _decode_esc(r: dict[str, Any]) -> dict[str, Any]:
        for k in ("situation", "default_action", "answer"):
            r[k] = json.loads(r[k]) if r.get(k) else None
        return r

    def answer(
        self, esc_id: int, *, status: str, by: str, now: float, answer: dict[str, Any] | None
    ) -> bool:
        """Answer a pending escalation; False if it was not pending (answered or expired)."""
        with self.tx() as db:
            cur = db.execute(
                "UPDATE escalations SET status = ?, answered_by = ?, answered_at = ?, "
                "answer = ? WHERE id = ? AND status = 'pending'",
                (status, by, now, _dumps(answer) if answer else None, esc_id),
            )
            return cur.rowcount == 1

    def set_escalation_status(self, esc_id: int, status: str, action_id: int | None = None) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE escalations SET status = ?, executed_action_id = ? WHERE id = ?",
                (status, action_id, esc_id),
            )

    def add_delivery(self, esc_id: int, channel: str, now: float, ok: bool, detail: str) -> None:
        with self.tx() as db:
            db.execute(
                "INSERT INTO deliveries(escalation_id, channel, at, ok, detail) "
                "VALUES (?, ?, ?, ?, ?)",
                (esc_id, channel, now, int(ok), detail),
            )

    def deliveries(self, esc_id: int) -> list[dict[str, Any]]:
        return self._all(
            "SELECT channel, at, ok, detail FROM deliveries WHERE escalation_id = ? ORDER BY id",
            (esc_id,),
        )

    # ---- tracks, events, hosts, replacements -------------------------------------------------
    def save_tracks(self, tracks: dict[str, Track], events: list[Event]) -> None:
        """Store this tick's tracks and events.

        Only what changed is written: new and vanished instances, and tracks whose stage,
        status, health or their times changed. A daemon's uptime changes every tick and is
        written with the rest every `UPTIME_EVERY` saves; in between, this process reads its
        own tracks from memory (`history`), so it always compares against the latest uptime.
        Another process (a CLI, a new leader) reads the stored ones: their uptime is at most
        `UPTIME_EVERY` ticks old, and they are otherwise exact.
        """
        cached = self._tracks if self._tracks_version == self._stored_version() else None
        self._saves += 1
        full = cached is None or self._saves % UPTIME_EVERY == 0
        if full:
            changed = list(tracks.values())
            gone: list[str] = []
        else:
            assert cached is not None
            changed = [t for k, t in tracks.items()
                       if (old := cached.get(k)) is None or old[:-1] != t[:-1]]  # fmt: skip
            gone = [k for k in cached if k not in tracks]
        version = uuid.uuid4().hex
        with self.tx() as db:
            if full:
                db.execute("DELETE FROM tracks")
                db.executemany("INSERT INTO tracks(id, data) VALUES (?, ?)",
                               [(t.id, _dumps(t._asdict())) for t in changed])  # fmt: skip
            else:
                db.executemany("DELETE FROM tracks WHERE id = ?", [(k,) for k in gone])
                db.executemany(
                    "INSERT INTO tracks(id, data) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET "
                    "data = excluded.data",
                    [(t.id, _dumps(t._asdict())) for t in changed],
                )
            db.execute(
                "INSERT INTO kv(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET "
                "value = excluded.value", (TRACKS_VERSION, _dumps(version)))  # fmt: skip
            db.executemany(
                "INSERT INTO events(instance_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                [(e.instance_id, e.at, e.kind, _dumps(e.detail)) for e in events],
            )
            benched = [e for e in events if e.kind == "bench" and e.detail.get("rate") is not None]
            db.executemany(
                "INSERT INTO hosts(machine_id, bench_rate, bench_at) VALUES (?, ?, ?) "
                "ON CONFLICT(machine_id) DO UPDATE SET bench_rate = excluded.bench_rate, "
                "bench_at = excluded.bench_at",
                [(e.detail["machine_id"], e.detail["rate"], e.at) for e in benched],
            )
            if benched:
                self._hosts_changed(db, [str(e.detail["machine_id"]) for e in benched])

        self._tracks, self._tracks_version = dict(tracks), version

    def tracks(self) -> dict[str, Track]:
        """The tracks: from memory when this process wrote the stored ones last."""
        stored = self._stored_version()
        if self._tracks is None or stored != self._tracks_version:
            rows = self._all("SELECT data FROM tracks")
            self._tracks = {t.id: t for t in (Track(**json.loads(r["data"])) for r in rows)}
            self._tracks_version = stored
        return dict(self._tracks)

    def _stored_version(self) -> str | None:
        row = self._one("SELECT value FROM kv WHERE key = ?", (TRACKS_VERSION,))
        return str(json.loads(row["value"])) if row else None

    def events(self, instance_id: str | None = None, limit: int = 500) -> list[dict[str, Any]]:
        where, args = ("WHERE instance_id = ?", [instance_id]) if instance_id else ("", [])
        rows = self._all(f"SELECT * FROM events {where} ORDER BY id DESC LIMIT ?", [*args, limit])
        for r in rows:
            r["detail"] = json.loads(r["detail"])
        return rows[::-1]

    def block_host(self, machine_id: str, until: float, reason: str) -> None:
        with self.tx() as db:
            db.execute(
                "INSERT INTO hosts(machine_id, failures, blocked_until, block_reason) "
                "VALUES (?, 1, ?, ?) ON CONFLICT(machine_id) DO UPDATE SET "
                "failures = hosts.failures + 1, blocked_until = excluded.blocked_until, "
                "block_reason = excluded.block_reason",
                (machine_id, until, reason),
            )
            self._hosts_changed(db, [machine_id])

    def _hosts_changed(self, db: Tx, machine_ids: list[str]) -> None:
        """After a write to `hosts`, in its transaction: a new version, and this process's copy
        brought up to date (or dropped, when another process wrote since it was read)."""
        prior = db.execute("SELECT value FROM kv WHERE key = ?", (HOSTS_VERSION,)).fetchone()
        version = uuid.uuid4().hex
        db.execute("INSERT INTO kv(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET "
                   "value = excluded.value", (HOSTS_VERSION, _dumps(version)))  # fmt: skip
        cache = self._hosts
        if cache is None or prior is None or json.loads(prior["value"]) != self._hosts_version:
            self._hosts, self._hosts_version = None, None
            return
        ids = sorted(set(machine_ids))
        marks = ", ".join("?" * len(ids))
        for row in db.execute(f"SELECT * FROM hosts WHERE machine_id IN ({marks})", ids).rows:
            cache[str(row["machine_id"])] = row
        self._hosts_version = version

    def hosts(self) -> list[dict[str, Any]]:
        """Every host we know of, by machine id."""
        cache = self._host_rows()
        return [dict(cache[k]) for k in sorted(cache)]

    def _host_rows(self) -> dict[str, dict[str, Any]]:
        """The hosts table: from memory while this process wrote it last (read-only rows)."""
        row = self._one("SELECT value FROM kv WHERE key = ?", (HOSTS_VERSION,))
        stored = json.loads(row["value"]) if row else None
        if self._hosts is None or stored != self._hosts_version:
            rows = self._all("SELECT * FROM hosts")
            self._hosts, self._hosts_version = {str(r["machine_id"]): r for r in rows}, stored
        return self._hosts

    def add_replacement(
        self, old_id: str, new_label: str, now: float, deadline: float, action_id: int
    ) -> None:
        with self.tx() as db:
            db.execute(
                "INSERT INTO replacements(old_id, new_label, created_at, deadline, state, "
                "action_id) VALUES (?, ?, ?, ?, 'waiting', ?) ON CONFLICT(old_id) DO UPDATE SET "
                "new_label = excluded.new_label, new_id = NULL, created_at = excluded.created_at, "
                "deadline = excluded.deadline, state = 'waiting', action_id = excluded.action_id",
                (old_id, new_label, now, deadline, action_id),
            )

    def replacements(self, state: str = "waiting") -> list[dict[str, Any]]:
        return self._all("SELECT * FROM replacements WHERE state = ? ORDER BY created_at", (state,))

    def set_replacement(self, old_id: str, state: str, new_id: str | None = None) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE replacements SET state = ?, new_id = COALESCE(?, new_id) WHERE old_id = ?",
                (state, new_id, old_id),
            )

    def history(self, now: float) -> History:
        """Everything one tick's decision reads, as plain data."""
        since = now - HISTORY_WINDOW_S
        tracks = self.tracks()
        events = tuple(
            Event(r["instance_id"], r["at"], r["kind"], json.loads(r["detail"]))
            for r in self._all(
                "SELECT * FROM events WHERE at >= ? AND kind IN ('death', 'restart') ORDER BY id",
                (since,),
            )
        )
        hosts = list(self._host_rows().values())  # read only
        acted = self._all(  # the window first (else a planner may walk the whole table)
            "WITH recent AS MATERIALIZED (SELECT action, target, at FROM actions WHERE "
            "at >= ? AND verdict = 'act' AND status != 'failed') "
            "SELECT action, target, MAX(at) AS at FROM recent GROUP BY action, target",
            (since,),
        )
        launches = self._all(
            "SELECT at FROM actions WHERE action = 'launch' AND "  # an unknown outcome may bill
            "parent_id IS NOT NULL AND status IN ('ok', 'intent', 'unknown') AND at >= ?",
            (since,),
        )
        waiting = self.replacements()
        return History(
            instances=tracks, events=events,
            host_rates={
                h["machine_id"]: h["bench_rate"] for h in hosts if h["bench_rate"] is not None
            },
            host_blocks={h["machine_id"]: h["blocked_until"] for h in hosts if h["blocked_until"]},
            host_failures={h["machine_id"]: h["failures"] for h in hosts if h["failures"]},
            launches=tuple(r["at"] for r in launches),
            last_acted={f"{r['action']}:{r['target']}": r["at"] for r in acted},
            replacing=frozenset(r["new_id"] for r in waiting if r["new_id"]),
            retiring=frozenset(r["old_id"] for r in waiting),
        )  # fmt: skip

    # ---- LLM calls (the escalation chain, and the budget) ----------------------------------
    def add_llm_call(
        self,
        *,
        escalation_id: int | None,
        now: float,
        model: str,
        status: str,
        prompt_digest: str = "",
        action: str | None = None,
        params: dict[str, Any] | None = None,
        confidence: float | None = None,
        rationale: str = "",
        error: str = "",
        tokens: int = 0,
        latency_ms: float | None = None,
        routed: str = "",
    ) -> int:
        with self.tx() as db:
            return db.insert(
                "INSERT INTO llm_calls(escalation_id, at, model, prompt_digest, status, action, "
                "params, confidence, rationale, error, tokens, latency_ms, routed) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (escalation_id, now, model, prompt_digest, status, action,
                 _dumps(params) if params is not None else None, confidence, rationale, error,
                 tokens, latency_ms, routed))  # fmt: skip

    def llm_calls(self, escalation_id: int | None = None) -> list[dict[str, Any]]:
        where, args = ("WHERE escalation_id = ?", [escalation_id]) if escalation_id else ("", [])
        rows = self._all(f"SELECT * FROM llm_calls {where} ORDER BY id", args)
        for r in rows:
            r["params"] = json.loads(r["params"]) if r["params"] else None
        return rows

    def add_llm_usage(self, at: float, tokens: int) -> None:
        with self.tx() as db:
            db.execute("INSERT INTO llm_usage(at, tokens) VALUES (?, ?)", (at, tokens))

    def llm_usage_since(self, since: float) -> tuple[int, int]:
        """(calls, tokens) since `since`: every call that reached the endpoint counts."""
        row = self._one(
            "SELECT COUNT(*) AS calls, COALESCE(SUM(tokens), 0) AS tokens "
            "FROM llm_usage WHERE at >= ?",
            (since,),
        )
        return (int(row["calls"]), int(row["tokens"])) if row else (0, 0)

    def actions_for_escalation(self, esc_id: int) -> list[dict[str, Any]]:
        rows = self._all("SELECT * FROM actions WHERE escalation_id = ? ORDER BY id", (esc_id,))
        for r in rows:
            r["params"] = json.loads(r["params"])
            r["result"] = json.loads(r["result"]) if r["result"] else None
        return rows

    # ---- launches not yet confirmed by a listing ---------------------------------------------
    def recent_launches(self, since: float) -> list[dict[str, Any]]:
        """Single launches (one row each, keyed by label): every one still open (intent or
        unknown outcome, however old), and those that succeeded since `since`."""
        head = "SELECT id, at, status, key, result FROM actions WHERE action = 'launch' AND "
        rows = self._all(head + "parent_id IS NOT NULL AND status IN ('intent', 'unknown')")
        rows += self._all(head + "parent_id IS NOT NULL AND status = 'ok' AND at >= ?", (since,))
        rows.sort(key=lambda r: int(r["id"]))
        for r in rows:
            r["result"] = json.loads(r["result"]) if r["result"] else {}
        return rows

    def launched_after(self, action_id: int) -> list[tuple[int, str, str]]:
        """(action id, instance id, label) of every single launch that rented an instance,
        after action `action_id`: the instances fleetgate owns whatever vast lists as label."""
        rows = self._all("SELECT id, result FROM actions WHERE action = 'launch' AND status = 'ok' "
                         "AND parent_id IS NOT NULL AND id > ? ORDER BY id",
                         (action_id,))  # fmt: skip
        out = []
        for r in rows:
            result = json.loads(r["result"]) if r["result"] else {}
            if result.get("instance"):
                out.append((int(r["id"]), str(result["instance"]), str(result.get("label", ""))))
        return out

    def seen_instances(self, since: float, among: Iterable[str]) -> set[str]:
        """Which of the instances `among` were listed (first seen) since `since`."""
        ids = sorted({str(i) for i in among})
        if not ids:
            return set()
        marks = ", ".join("?" * len(ids))
        rows = self._all(f"SELECT DISTINCT instance_id FROM events WHERE kind = 'seen' AND "
                         f"at >= ? AND instance_id IN ({marks})", (since, *ids))  # fmt: skip
        return {str(r["instance_id"]) for r in rows}

    def has_tracks(self) -> bool:
        """Does the journal know of live instances? (An empty listing is then a sensing error.)"""
        return self._one("SELECT 1 AS x FROM tracks LIMIT 1") is not None

    def add_reload(self, now: float, ok: bool, digest: str, problems: str = "") -> None:
        with self.tx() as db:
            db.execute("INSERT INTO rule_reloads(at, ok, digest, problems) VALUES (?, ?, ?, ?)",
                       (now, int(ok), digest, problems[:20_000]))  # fmt: skip

    def reloads(self) -> list[dict[str, Any]]:
        return self._all("SELECT * FROM rule_reloads ORDER BY id")

    def destroyed_since(self, since: float) -> set[str]:
        """Instances we destroyed (or set out to) since `since`."""
        rows = self._all("SELECT target FROM actions WHERE action = 'destroy' AND verdict = 'act' "
                         "AND status IN ('ok', 'intent') AND at >= ?", (since,))  # fmt: skip
        return {str(r["target"]).removeprefix("instance:") for r in rows}

    def close_interrupted(self, now: float, listed: set[str] | None = None) -> list[dict[str, Any]]:
        """Intents left by a run that stopped between intent and result (not single launches:
        those are reconciled by their label), closed and returned. With the provider's listing
        (`listed`: instance ids), a destroy whose target is gone is recorded as done;
        everything else (a launch of several included: its single launches go on being
        reconciled) as `interrupted`, and the rules decide again from what is sensed."""
        rows = self._all("SELECT id, action, target FROM actions WHERE status = 'intent' AND "
                         "(action != 'launch' OR parent_id IS NULL) ORDER BY id")  # fmt: skip
        for r in rows:
            target = str(r["target"]).removeprefix("instance:")
            if r["action"] == "destroy" and listed is not None and target not in listed:
                r["status"] = "ok"
                self.finish(int(r["id"]), now, "ok", {"instance": target, "confirmed_by":
                                                      "listing"})  # fmt: skip
                continue
            r["status"] = "interrupted"
            self.finish(int(r["id"]), now, "interrupted",
                        {"note": "the controller stopped before the result was recorded; "
                         "the rules decide again from what is sensed now"})  # fmt: skip
        return rows

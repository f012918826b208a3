"""What the controller knows of the fleet over time: per-instance tracks, their events (stage
changes, deaths, restarts, first sightings), and hosts (benchmark rates, failures, blocks).

Tables: `tracks`, `events`, `hosts`; version stamps under `tracks.version` and `hosts.version`
in the key/value table (`controller/store/meta.py`), so that a process that wrote last reads
its own copy from memory. `history`, the one read a tick makes before deciding, also reads the
actions and replacements (`controller/store/actions.py`): all of it in one snapshot.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from controller.core.gpu_rates import max_plausible, plausible
from controller.core.track import Event, History, Track
from controller.store.aggregate import Aggregate, dumps, loads
from controller.store.backend import Row, Store, Tx
from controller.store.meta import UPSERT_KV

HISTORY_WINDOW_S = 3 * 3600
TRACKS_VERSION = "tracks.version"  # changes with every save: whose tracks are stored
HOSTS_VERSION = "hosts.version"  # likewise for hosts
UPTIME_EVERY = 10  # saves between writes of tracks whose only change is the daemon's uptime

Read = Callable[[str, Sequence[Any]], list[Row]]


class _Unread:
    """A version stamp not read yet."""


UNREAD = _Unread()

assert Track._fields[-1] == "uptime", "save_tracks compares tracks without their last field"


class Fleet(Aggregate):
    """Tracks, events and hosts; the history a tick decides from."""

    SCHEMA = """
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
"""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self._tracks: dict[str, Track] | None = None  # as this process last saved or read them
        self._tracks_version: str | None = None
        self._saves = 0
        self._hosts: dict[str, dict[str, Any]] | None = None  # machine_id -> row
        self._hosts_version: str | None = None
        self._prefix, self._counter = secrets.token_hex(12), itertools.count(1)

    def _new_version(self) -> str:
        """A version stamp no other process writes: this process's random prefix and a count
        (a fresh random one per save costs a system call, every tick)."""
        return f"{self._prefix}-{next(self._counter)}"

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        return self.store.query(sql, args)

    # ---- tracks and events -----------------------------------------------------------------
    def save_tracks(self, tracks: dict[str, Track], events: list[Event]) -> None:
        """Store this tick's tracks and events.

        Only what changed is written: new and vanished instances, and tracks whose stage,
        status, health or their times changed. A daemon's uptime changes every tick and is
        written with the rest every `UPTIME_EVERY` saves; in between, this process reads its
        own tracks from memory (`history`), so it always compares against the latest uptime.
        Another process (a CLI, a new leader) reads the stored ones: their uptime is at most
        `UPTIME_EVERY` ticks old, and they are otherwise exact. A save with no event and no
        other change writes nothing at all (the stored version stays this process's).
        """
        stored = _version(self._query, TRACKS_VERSION)
        cached = self._tracks if self._tracks_version == stored else None
        self._saves += 1
        full = cached is None or self._saves % UPTIME_EVERY == 0
        changed, gone = list(tracks.values()), []
        if cached is not None and not full:
            changed = [t for k, t in tracks.items()
                       if (old := cached.get(k)) is None or old[:-1] != t[:-1]]  # fmt: skip
            gone = [k for k in cached if k not in tracks]
            if not changed and not gone and not events:  # uptimes alone moved: keep them here
                self._tracks = dict(tracks)  # (the stored version stays this process's)
                return
        version = self._new_version()
        with self.tx() as db:
            if full:
                db.execute("DELETE FROM tracks")
                db.executemany("INSERT INTO tracks(id, data) VALUES (?, ?)",
                               [(t.id, dumps(t._asdict())) for t in changed])  # fmt: skip
            else:
                db.executemany("DELETE FROM tracks WHERE id = ?", [(k,) for k in gone])
                db.executemany(
                    "INSERT INTO tracks(id, data) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET "
                    "data = excluded.data",
                    [(t.id, dumps(t._asdict())) for t in changed],
                )
            db.execute(UPSERT_KV, (TRACKS_VERSION, dumps(version)))
            db.executemany(
                "INSERT INTO events(instance_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                [(e.instance_id, e.at, e.kind, dumps(e.detail)) for e in events],
            )
            self._save_bench_rates(db, events)
        self._tracks, self._tracks_version = dict(tracks), version

    def _save_bench_rates(self, db: Tx, events: list[Event]) -> None:
        """A host's benchmark rate, when plausible for its GPU model (`gpu_rates`); one that
        is not is never stored (the ranking ignores it) and is journaled as `bench_refused`."""
        benched, refused = [], []
        for e in events:
            if e.kind != "bench" or e.detail.get("rate") is None:
                continue
            gpu, gpus = str(e.detail.get("gpu") or ""), int(e.detail.get("num_gpus") or 1)
            if plausible(float(e.detail["rate"]), gpu, gpus):
                benched.append(e)
            else:
                bound = max_plausible(gpu, gpus)
                refused.append((e.instance_id, e.at, "bench_refused",
                                dumps({**e.detail, "max_plausible": bound})))  # fmt: skip
        db.executemany("INSERT INTO events(instance_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                       refused)  # fmt: skip
        db.executemany(
            "INSERT INTO hosts(machine_id, bench_rate, bench_at) VALUES (?, ?, ?) "
            "ON CONFLICT(machine_id) DO UPDATE SET bench_rate = excluded.bench_rate, "
            "bench_at = excluded.bench_at",
            [(e.detail["machine_id"], e.detail["rate"], e.at) for e in benched],
        )
        if benched:
            self._hosts_changed(db, [str(e.detail["machine_id"]) for e in benched])

    def tracks(self) -> dict[str, Track]:
        """The tracks: from memory when this process wrote the stored ones last."""
        return dict(self._track_map(self._query))

    def _track_map(self, read: Read, stored: str | None | _Unread = UNREAD) -> dict[str, Track]:
        """The tracks as stored under version `stored` (read here unless given)."""
        if isinstance(stored, _Unread):
            stored = _version(read, TRACKS_VERSION)
        if self._tracks is None or stored != self._tracks_version:
            rows = read("SELECT data FROM tracks", ())
            self._tracks = {t.id: t for t in (_track(loads(r["data"])) for r in rows)}
            self._tracks_version = stored
        return self._tracks

    def has_tracks(self) -> bool:
        """Does the journal know of live instances? (An empty listing is then a sensing error.)"""
        return self._one("SELECT 1 AS x FROM tracks LIMIT 1") is not None

    def events(self, instance_id: str | None = None, limit: int = 500) -> list[Row]:
        """The last `limit` events (of one instance, if given), oldest first, decoded."""
        where, args = ("WHERE instance_id = ?", [instance_id]) if instance_id else ("", [])
        rows = self._all(f"SELECT * FROM events {where} ORDER BY id DESC LIMIT ?", [*args, limit])
        for r in rows:
            r["detail"] = loads(r["detail"], {})
        return rows[::-1]

    def seen_instances(self, since: float, among: Iterable[str]) -> set[str]:
        """Which of the instances `among` were listed (first seen) since `since`."""
        ids = sorted({str(i) for i in among})
        if not ids:
            return set()
        marks = ", ".join("?" * len(ids))
        rows = self._all(f"SELECT DISTINCT instance_id FROM events WHERE kind = 'seen' AND "
                         f"at >= ? AND instance_id IN ({marks})", (since, *ids))  # fmt: skip
        return {str(r["instance_id"]) for r in rows}

    def gone_before(self, before: float) -> set[str]:
        """The instances that went (destroyed, or confirmed gone by the provider) before
        `before`, as far as the journal still holds their events."""
        rows = self._all("SELECT DISTINCT instance_id FROM events WHERE kind = 'gone' AND at < ?",
                         (before,))  # fmt: skip
        return {str(r["instance_id"]) for r in rows}

    # ---- hosts -----------------------------------------------------------------------------
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
        version = self._new_version()
        db.execute(UPSERT_KV, (HOSTS_VERSION, dumps(version)))
        cache = self._hosts
        if cache is None or prior is None or loads(prior["value"]) != self._hosts_version:
            self._hosts, self._hosts_version = None, None
            return
        ids = sorted(set(machine_ids))
        marks = ", ".join("?" * len(ids))
        for row in db.execute(f"SELECT * FROM hosts WHERE machine_id IN ({marks})", ids).rows:
            cache[str(row["machine_id"])] = row
        self._hosts_version = version

    def hosts(self) -> list[Row]:
        """Every host we know of, by machine id."""
        cache = self._host_rows(self._query)
        return [dict(cache[k]) for k in sorted(cache)]

    def _host_rows(self, read: Read, stored: str | None | _Unread = UNREAD) -> dict[str, Row]:
        """The hosts table: from memory while this process wrote it last (read-only rows);
        `stored`, its version stamp (read here unless given)."""
        if isinstance(stored, _Unread):
            stored = _version(read, HOSTS_VERSION)
        if self._hosts is None or stored != self._hosts_version:
            rows = read("SELECT * FROM hosts", ())
            self._hosts, self._hosts_version = {str(r["machine_id"]): r for r in rows}, stored
        return self._hosts

    # ---- the history a tick decides from ---------------------------------------------------
    def history(self, now: float, waiting: Sequence[Row] | None = None) -> History:
        """Everything one tick's decision reads, as plain data, from one snapshot (`waiting`:
        the waiting replacements, `Actions.replacements()`, when the caller read them in it)."""
        since = now - HISTORY_WINDOW_S
        with self.store.snapshot() as db:

            def read(sql: str, args: Sequence[Any]) -> list[Row]:
                return db.execute(sql, args).rows

            stamps: dict[str, str | None] = {TRACKS_VERSION: None, HOSTS_VERSION: None}
            for r in read(
                "SELECT key, value FROM kv WHERE key IN (?, ?)", (TRACKS_VERSION, HOSTS_VERSION)
            ):  # both stamps in one read
                stamps[str(r["key"])] = str(loads(r["value"]))
            tracks = dict(self._track_map(read, stamps[TRACKS_VERSION]))
            events = read("SELECT * FROM events WHERE at >= ? AND kind IN ('death', 'restart') "
                          "ORDER BY id", (since,))  # fmt: skip
            hosts = list(self._host_rows(read, stamps[HOSTS_VERSION]).values())  # read only
            acted = read(  # the window first (else a planner may walk the whole table)
                "WITH recent AS MATERIALIZED (SELECT action, target, at FROM actions WHERE "
                "at >= ? AND verdict = 'act' AND status != 'failed') "
                "SELECT action, target, MAX(at) AS at FROM recent GROUP BY action, target",
                (since,),
            )
            launches = read(  # an unknown outcome may bill
                "SELECT at FROM actions WHERE action = 'launch' AND "
                "parent_id IS NOT NULL AND status IN ('ok', 'intent', 'unknown') AND at >= ?",
                (since,),
            )
            if waiting is None:
                waiting = read("SELECT old_id, new_id FROM replacements WHERE state = 'waiting'",
                               ())  # fmt: skip
        return History(
            instances=tracks,
            events=tuple(Event(r["instance_id"], r["at"], r["kind"], loads(r["detail"], {}))
                         for r in events),
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


def _track(data: dict[str, Any]) -> Track:
    """A stored track; one saved before tracks kept `answered` (cuzk's status server answered
    once) takes it from `ever_up`, the best that was known then; one saved before they kept
    `died`, a daemon down on a running instance it was once up on died (the release that saved
    it counted that daemon's return as a restart; a stopped instance's is a start)."""
    if "answered" not in data:
        data = {**data, "answered": bool(data.get("ever_up"))}
    if "died" not in data:
        died = data.get("daemon") == "down" and data.get("status") == "running"
        data = {**data, "died": died and bool(data.get("ever_up"))}
    return Track(**data)


def _version(read: Read, key: str) -> str | None:
    rows = read("SELECT value FROM kv WHERE key = ?", (key,))
    return str(loads(rows[0]["value"])) if rows else None

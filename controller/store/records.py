"""What instances tell the controller about themselves: registration, stages, heartbeats, logs.

The instance side of the fleet (DOMAIN.md, "The prior art this project replaces"): each instance's
agent registers (label, minimum rate), reports its boot milestones, heartbeats with the cuzk
daemon's uptime, and pushes log lines. The controller queues commands for an instance (only
`restart_daemon` today); the agent picks them up with its next heartbeat and reports the result.
A command not picked up before its deadline is *overdue*: the controller falls back to a vast
reboot and completes the command itself, so the agent never gets it late.

Stages name the last milestone an instance reported, in order, only forward (skipping ahead is
allowed, so an agent that lost one report can still go on; a repeated report changes nothing):

    registered  the agent registered; proof parameters are being fetched
    params      parameters are downloaded; the benchmark is running
    bench       the benchmark is done (`bench_rate`, proofs/hour); Curio is starting
    running     serving proofs

Each instance authenticates with its own token (`controller/store/instance_tokens.py`, issued
at launch): `tokens` holds them, and forgetting an instance revokes its token. Log lines are a
bounded buffer per instance (the last MAX_LOG_LINES, at most MAX_LOG_CHARS of text); older
lines are dropped.

Tables (`controller/store/instances.py`) live in the journal's database and are created here,
on its store. This module must NOT do HTTP, read the clock (every `now` is passed in) or decide
anything about an instance: it stores what instances said, and what was asked of them.
"""

from __future__ import annotations

from typing import Any

from controller.store.aggregate import Aggregate, dumps
from controller.store.backend import Tx
from controller.store.instance_tokens import InstanceTokens
from controller.store.instances import (
    COMMANDS,
    LIFECYCLE_STAGES,
    MAX_LINE_CHARS,
    MAX_LOG_CHARS,
    MAX_LOG_LINES,
    SCHEMA,
    Command,
    LifecycleError,
    LogLine,
    Record,
    StageOrderError,
    UnknownCommand,
    UnknownInstance,
    VastIdTaken,
    command_of,
    sanitize,
    vast_id_of,
)
from controller.store.journal import Journal

__all__ = [
    "COMMANDS", "LIFECYCLE_STAGES", "MAX_LINE_CHARS", "MAX_LOG_CHARS", "MAX_LOG_LINES",
    "Command", "LifecycleError", "LifecycleStore", "LogLine", "Record", "StageOrderError",
    "UnknownCommand", "UnknownInstance", "VastIdTaken", "sanitize", "vast_id_of",
]  # fmt: skip


class LifecycleStore(Aggregate):
    """The instance-side records, in the journal's database. Safe to share between threads."""

    def __init__(self, journal: Journal) -> None:
        super().__init__(journal.store)
        self._j = journal
        journal.store.create(SCHEMA)
        self.tokens = InstanceTokens(journal.store)

    # ---- records ---------------------------------------------------------------------------
    def register(
        self,
        label: str,
        vast_id: str | None,
        min_rate: float | None,
        host_and_port: str | None,
        now: float,
        agent_version: str | None = None,
    ) -> Record:
        """Create the record at stage `registered`; registering again only fills in fields.
        VastIdTaken when another record holds `vast_id`, or another label's token is bound to
        it (the launch that rented it was told its id)."""
        vast_id = vast_id or vast_id_of(label)
        with self.tx() as db:
            if vast_id is not None:
                other = db.execute(
                    "SELECT label FROM instance_records WHERE vast_id = ? AND label <> ?",
                    (vast_id, label),
                ).fetchone()
                if other is None:  # or a launch whose create named it rented it for another label
                    other = db.execute(
                        "SELECT label FROM instance_tokens WHERE vast_id = ? AND label <> ?",
                        (vast_id, label),
                    ).fetchone()
                if other is not None:
                    raise VastIdTaken(f"vast instance {vast_id} is another instance's")
            db.execute(
                "INSERT INTO instance_records(label, vast_id, host_and_port, stage, stage_at, "
                "min_rate, registered_at, agent_version) "
                "VALUES (?, ?, ?, 'registered', ?, ?, ?, ?) "
                "ON CONFLICT(label) DO UPDATE SET "
                "vast_id = COALESCE(excluded.vast_id, instance_records.vast_id), "
                "host_and_port = COALESCE(excluded.host_and_port, instance_records.host_and_port), "
                "min_rate = COALESCE(excluded.min_rate, instance_records.min_rate), "
                "agent_version = COALESCE(excluded.agent_version, instance_records.agent_version)",
                (label, vast_id, host_and_port, now, min_rate, now, agent_version),
            )
        return self._require(label)

    def link(
        self,
        label: str,
        *,
        vast_id: str | None = None,
        machine_id: str | None = None,
        host_and_port: str | None = None,
    ) -> None:
        """What the controller learned from the vast listing and Curio's tables (the agent may
        not know it, or may have said otherwise): it overrides what the agent reported."""
        with self.tx() as db:
            cur = db.execute(
                "UPDATE instance_records SET vast_id = COALESCE(?, vast_id), "
                "machine_id = COALESCE(?, machine_id), "
                "host_and_port = COALESCE(?, host_and_port) WHERE label = ?",
                (vast_id, machine_id, host_and_port, label),
            )
            if cur.rowcount != 1:
                raise UnknownInstance(f"no instance registered as {label!r}")
            if vast_id is not None:
                db.execute(
                    "UPDATE instance_tokens SET vast_id = ? WHERE label = ? AND vast_id IS NULL",
                    (vast_id, label),
                )

    def advance(
        self, label: str, stage: str, now: float, bench_rate: float | None = None
    ) -> Record:
        """Move to `stage`: forward only; the stage already recorded is a no-op."""
        if stage not in LIFECYCLE_STAGES:
            raise ValueError(f"unknown stage {stage!r} (expected one of {LIFECYCLE_STAGES})")
        with self.tx() as db:
            row = db.execute("SELECT stage FROM instance_records WHERE label = ?", (label,))
            found = row.fetchone()
            if found is None:
                raise UnknownInstance(f"no instance registered as {label!r}")
            have, want = LIFECYCLE_STAGES.index(found["stage"]), LIFECYCLE_STAGES.index(stage)
            if want < have:
                raise StageOrderError(
                    f"instance {label!r} is at stage {found['stage']!r}; cannot go back to "
                    f"{stage!r}"
                )
            if want > have:
                db.execute(
                    "UPDATE instance_records SET stage = ?, stage_at = ?, "
                    "bench_rate = COALESCE(?, bench_rate) WHERE label = ?",
                    (stage, now, bench_rate, label),
                )
        return self._require(label)

    def records(self) -> dict[str, Record]:
        rows = self._all("SELECT * FROM instance_records ORDER BY label")
        return {r["label"]: Record(**r) for r in rows}

    def record(self, label: str) -> Record | None:
        row = self._one("SELECT * FROM instance_records WHERE label = ?", (label,))
        return Record(**row) if row else None

    def resolve(self, any_id: str) -> Record | None:
        """The one record named by a vast id, a launch label, `C.<vast id>` or Curio host:port.

        The vast id (the controller's name for an instance) matches first, then a label;
        otherwise every other way of naming must agree on one record (None when nothing, or
        more than one record, matches). So a label that spells another instance's vast id
        never takes that instance's commands.
        """
        if not any_id:
            return None
        by_id = self._all("SELECT * FROM instance_records WHERE vast_id = ?", (any_id,))
        if len(by_id) == 1:
            return Record(**by_id[0])
        exact = self.record(any_id)
        if exact is not None or by_id:
            return exact
        vast_id = vast_id_of(any_id) or any_id
        rows = self._all(
            "SELECT * FROM instance_records WHERE vast_id = ? OR label = ? OR host_and_port = ?",
            (vast_id, f"C.{vast_id}", any_id),
        )
        return Record(**rows[0]) if len(rows) == 1 else None

    def forget(self, label: str) -> None:
        """Drop an instance's record, logs and commands, and revoke its token (it is gone)."""
        with self.tx() as db:
            tables = ("instance_records", "instance_logs", "instance_commands", "instance_tokens")
            for table in tables:
                db.execute(f"DELETE FROM {table} WHERE label = ?", (label,))

    def _require(self, label: str) -> Record:
        found = self.record(label)
        if found is None:
            raise UnknownInstance(f"no instance registered as {label!r}")
        return found

    # ---- heartbeats and commands -----------------------------------------------------------
    def heartbeat(
        self,
        label: str,
        now: float,
        daemon_uptime_s: float | None = None,
        daemon_state: str | None = None,
    ) -> list[Command]:
        """Note the heartbeat; return the instance's pending commands, now marked picked."""
        with self.tx() as db:
            cur = db.execute(
                "UPDATE instance_records SET last_heartbeat = ?, daemon_uptime_s = ?, "
                "daemon_state = ? WHERE label = ?",
                (now, daemon_uptime_s, daemon_state, label),
            )
            if cur.rowcount != 1:
                raise UnknownInstance(f"no instance registered as {label!r}")
            pending = db.execute(
                "SELECT * FROM instance_commands WHERE label = ? AND picked_at IS NULL "
                "AND done_at IS NULL AND deadline > ? ORDER BY id",
                (label, now),
            ).fetchall()
            if pending:  # (most heartbeats pick nothing)
                db.executemany(
                    "UPDATE instance_commands SET picked_at = ? WHERE id = ?",
                    [(now, c["id"]) for c in pending],
                )
        return [command_of({**c, "picked_at": now}) for c in pending]

    def queue_command(self, label: str, command: str, now: float, deadline_s: float) -> int:
        """Queue `command` for `label`; an outstanding identical command is reused (its id)."""
        if command not in COMMANDS:
            raise ValueError(f"unknown command {command!r} (expected one of {COMMANDS})")
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be positive, got {deadline_s!r}")
        with self.tx() as db:
            _require_in(db, label)
            open_ = db.execute(
                "SELECT id FROM instance_commands WHERE label = ? AND command = ? AND "
                "done_at IS NULL AND (picked_at IS NOT NULL OR deadline > ?)",
                (label, command, now),
            ).fetchone()
            if open_:
                return int(open_["id"])
            return db.insert(
                "INSERT INTO instance_commands(label, command, created_at, deadline) "
                "VALUES (?, ?, ?, ?)",
                (label, command, now, now + deadline_s),
            )

    def overdue_commands(self, now: float) -> list[Command]:
        """Commands no heartbeat picked up before their deadline (and nobody completed)."""
        rows = self._all(
            "SELECT * FROM instance_commands WHERE picked_at IS NULL AND done_at IS NULL "
            "AND deadline <= ? ORDER BY +id",  # `+id`: the open-commands index, not a table walk
            (now,),
        )
        return [command_of(r) for r in rows]

    def complete(
        self, command_id: int, result: dict[str, Any], now: float, label: str | None = None
    ) -> bool:
        """Store a command's result; False if it was already done. `label` checks the owner."""
        with self.tx() as db:
            row = db.execute(
                "SELECT label, done_at FROM instance_commands WHERE id = ?", (command_id,)
            ).fetchone()
            if row is None or (label is not None and row["label"] != label):
                raise UnknownCommand(f"no command #{command_id} for instance {label!r}")
            if row["done_at"] is not None:
                return False
            db.execute(
                "UPDATE instance_commands SET done_at = ?, result = ? WHERE id = ?",
                (now, dumps(result), command_id),
            )
            return True

    def command(self, command_id: int) -> Command | None:
        row = self._one("SELECT * FROM instance_commands WHERE id = ?", (command_id,))
        return command_of(row) if row else None

    def commands(self, label: str) -> list[Command]:
        rows = self._all("SELECT * FROM instance_commands WHERE label = ? ORDER BY id", (label,))
        return [command_of(r) for r in rows]

    # ---- logs ------------------------------------------------------------------------------
    def push_logs(self, label: str, lines: list[str], now: float) -> int:
        """Append sanitized lines to the instance's buffer, keeping the last MAX_LOG_LINES and
        at most MAX_LOG_CHARS of text (older lines dropped); returns how many were taken."""
        clean = _newest([sanitize(line) for line in lines[-MAX_LOG_LINES:]], MAX_LOG_CHARS)
        with self.tx() as db:
            _require_in(db, label)
            db.executemany(
                "INSERT INTO instance_logs(label, at, line) VALUES (?, ?, ?)",
                [(label, now, line) for line in clean],
            )
            kept = db.execute(
                "SELECT id, length(line) AS n FROM instance_logs WHERE label = ? "
                "ORDER BY id DESC LIMIT ?",
                (label, MAX_LOG_LINES + 1),
            ).fetchall()
            total, cut = 0, None
            for n, row in enumerate(kept):
                total += int(row["n"])
                if n >= MAX_LOG_LINES or total > MAX_LOG_CHARS:
                    cut = int(row["id"])
                    break
            if cut is not None:
                db.execute("DELETE FROM instance_logs WHERE label = ? AND id <= ?", (label, cut))
        return len(clean)

    def logs(self, label: str, limit: int = MAX_LOG_LINES) -> list[LogLine]:
        rows = self._all(
            "SELECT at, line FROM instance_logs WHERE label = ? ORDER BY id DESC LIMIT ?",
            (label, limit),
        )
        return [LogLine(r["at"], r["line"]) for r in rows[::-1]]


def _newest(lines: list[str], chars: int) -> list[str]:
    """The newest of `lines` whose text fits in `chars`."""
    total = 0
    for n in range(len(lines) - 1, -1, -1):
        total += len(lines[n])
        if total > chars:
            return lines[n + 1 :]
    return lines


def _require_in(db: Tx, label: str) -> None:
    if db.execute("SELECT 1 FROM instance_records WHERE label = ?", (label,)).fetchone() is None:
        raise UnknownInstance(f"no instance registered as {label!r}")

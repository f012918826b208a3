"""What an instance record is: its stages, the commands queued for it, its log lines, the
tables they live in, and the errors storing them raises (`controller/store/records.py` stores
them). Plain data and pure functions: no I/O here.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

LIFECYCLE_STAGES = ("registered", "params", "bench", "running")
COMMANDS = ("restart_daemon",)
MAX_LOG_LINES = 500  # kept per instance; older lines are dropped
MAX_LOG_CHARS = 128 * 1024  # ...and at most this many characters of them
MAX_LINE_CHARS = 2000

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS instance_records (
      label TEXT PRIMARY KEY, vast_id TEXT, machine_id TEXT, host_and_port TEXT,
      stage TEXT NOT NULL, stage_at REAL NOT NULL, min_rate REAL, bench_rate REAL,
      registered_at REAL NOT NULL, last_heartbeat REAL, daemon_uptime_s REAL,
      daemon_state TEXT, agent_version TEXT)""",
    "CREATE INDEX IF NOT EXISTS instance_records_vast ON instance_records(vast_id)",
    "CREATE INDEX IF NOT EXISTS instance_records_hp ON instance_records(host_and_port)",
    """CREATE TABLE IF NOT EXISTS instance_logs (
      id INTEGER PRIMARY KEY, label TEXT NOT NULL, at REAL NOT NULL, line TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS instance_logs_label ON instance_logs(label, id)",
    """CREATE TABLE IF NOT EXISTS instance_commands (
      id INTEGER PRIMARY KEY, label TEXT NOT NULL, command TEXT NOT NULL,
      created_at REAL NOT NULL, deadline REAL NOT NULL, picked_at REAL, done_at REAL,
      result TEXT)""",
    "CREATE INDEX IF NOT EXISTS instance_commands_label ON instance_commands(label, done_at)",
    # the open ones, for the overdue check each tick (done ones pile up, one per restart)
    "CREATE INDEX IF NOT EXISTS instance_commands_open ON instance_commands(deadline) "
    "WHERE picked_at IS NULL AND done_at IS NULL",
)


class LifecycleError(Exception):
    """Something an instance reported could not be stored.

    LifecycleError
    ├── UnknownInstance   no record has that label (the agent never registered)
    ├── UnknownCommand    no command has that id (for that instance)
    ├── StageOrderError   a stage earlier than the one recorded
    └── VastIdTaken       a vast id another instance's record already holds
    """


class UnknownInstance(LifecycleError):
    pass


class UnknownCommand(LifecycleError):
    pass


class StageOrderError(LifecycleError):
    pass


class VastIdTaken(LifecycleError):
    pass


@dataclass(frozen=True)
class Record:
    """One instance as it described itself (and as the controller linked it to vast)."""

    label: str
    vast_id: str | None
    machine_id: str | None
    host_and_port: str | None  # the Curio node's, as in harmony_machines
    stage: str  # one of LIFECYCLE_STAGES
    stage_at: float
    min_rate: float | None  # proofs/hour the instance must bench at least
    bench_rate: float | None
    registered_at: float
    last_heartbeat: float | None
    daemon_uptime_s: float | None
    daemon_state: str | None  # supervisord's state of the daemon (RUNNING, FATAL, ...)
    agent_version: str | None


@dataclass(frozen=True)
class Command:
    id: int
    label: str
    command: str
    created_at: float
    deadline: float
    picked_at: float | None
    done_at: float | None
    result: dict[str, Any] | None  # {"ok": bool, "detail": str}


@dataclass(frozen=True)
class LogLine:
    at: float
    line: str


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]")
_INVISIBLE = {"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"}


def sanitize(line: str) -> str:
    """One printable line: ANSI escapes and control characters removed, tabs as spaces, capped."""
    text = _ANSI.sub("", line.rstrip("\r\n")).replace("\t", " ")
    text = "".join(c for c in text if unicodedata.category(c) not in _INVISIBLE)
    return text if len(text) <= MAX_LINE_CHARS else text[: MAX_LINE_CHARS - 1] + "…"


def vast_id_of(label: str) -> str | None:
    """The vast instance id in a container label `C.<id>`, else None."""
    m = re.fullmatch(r"C\.(\d+)", label)
    return m[1] if m else None


def command_of(row: dict[str, Any]) -> Command:
    result = json.loads(row["result"]) if row.get("result") else None
    return Command(**{**row, "result": result})

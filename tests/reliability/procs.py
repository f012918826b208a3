"""What the process scenarios share: a world of real servers and `fleetgate` subprocesses on it.

    with Rig(backend="postgres", offers=40) as rig:    # FakeVast + CurioDB (+ a journal schema)
        rig.db.post("PoRep", 10)
        proc = rig.spawn("tick")                        # `fleetgate --config C --state S tick`
        ...
        rows = rig.actions()                            # the journal, read from outside

The FakeVast server lives in this process, so it outlives the controllers that are killed;
Curio's queue is a fresh schema in the real PostgreSQL (tests/support.py PG_DSN), and so is
the journal on the PostgreSQL backend (dropped on exit). A process's stderr goes to a file in
the rig's directory (`rig.log(proc)`), so a killed process leaves its log behind.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from fakes.curio_db import CurioDB
from fakes.vast_server import FakeVast, offer
from psycopg import sql

ROOT = Path(__file__).resolve().parents[2]
PG_DSN = os.environ.get(
    "FLEETGATE_TEST_PG_DSN", "host=127.0.0.1 port=5432 dbname=test user=postgres"
)
FLEETGATE = [
    sys.executable,
    "-c",
    "import sys; from controller.service.cli import main; sys.exit(main())",
]
VAST_KEY = "fake-vast-key-0123456789abcdef"


class Rig:
    """One run's world: FakeVast, Curio's queue, a state directory, a journal and its config."""

    def __init__(self, backend: str, *, offers: int = 40, lease: str = "", guards: str = "",
                 interval_s: float = 1.0, timeout_s: float = 1.0) -> None:  # fmt: skip
        self.backend = backend
        self._tmp = tempfile.TemporaryDirectory(prefix="fg-procs-")
        self.dir = Path(self._tmp.name)
        self.state = self.dir / "state"
        self.schema = f"fg_procs_{secrets.token_hex(5)}" if backend == "postgres" else ""
        self.vast = FakeVast(VAST_KEY, [offer(100 + n, machine_id=n + 1, dph=0.40 + n / 1000)
                                        for n in range(offers)], boot_s=30, load_s=60)  # fmt: skip
        self.db = CurioDB(PG_DSN)
        self.lease, self.guards = lease, guards
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.logs: dict[int, Path] = {}
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Rig:
        self.vast.__enter__()
        self.db.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
            p.wait()
        try:
            self.db.__exit__(None, None, None)
            if self.schema:
                with psycopg.connect(PG_DSN, autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
                                 .format(sql.Identifier(self.schema)))  # fmt: skip
        finally:
            self.vast.__exit__()
            self._tmp.cleanup()

    # ---- the controller's side -----------------------------------------------------------

    def config(self, name: str = "fleet.yaml", guards: str = "") -> Path:
        """Write a config for the real fleet on this rig; `guards` adds to the rig's guards."""
        journal = (f"journal: {{dsn: {{env: FG_PROCS_JOURNAL_DSN}}, schema_name: {self.schema}}}\n"
                   if self.backend == "postgres" else "")  # fmt: skip
        text = f"""\
provider: vast
demand: curio
interval_s: {self.interval_s}
rules: ['{ROOT / "rules"}']
vast:
  api_key: {{env: FG_PROCS_VAST_KEY}}
  base_url: '{self.vast.url}'
  image: example/cuzk:latest
  retries: 1
  backoff_s: 0.01
  timeout_s: {self.timeout_s}
  min_interval_s: {{list: 0, create: 0, destroy: 0, search: 0, other: 0}}
curio: {{dsn: {{env: FG_PROCS_CURIO_DSN}}, schema_name: '{self.db.schema}'}}
instances: {{fleet_token: {{env: FG_PROCS_FLEET_TOKEN}}, health_timeout_s: 0.2}}
escalation: {{channels: [file]}}
api: {{listen: '127.0.0.1:0', token: {{env: FG_PROCS_API_TOKEN}}}}
guards: {{{", ".join(x for x in (self.guards, guards) if x)}}}
lease: {{{self.lease}}}
{journal}"""
        path = self.dir / name
        path.write_text(text, encoding="utf-8")
        return path

    def spawn(self, *command: str, config: Path | None = None,
              level: str = "INFO") -> subprocess.Popen[bytes]:  # fmt: skip
        """Start `fleetgate --config C --state S COMMAND`; its stderr goes to a log file."""
        env = dict(os.environ, FG_PROCS_VAST_KEY=VAST_KEY, FG_PROCS_CURIO_DSN=PG_DSN,
                   FG_PROCS_FLEET_TOKEN="fleet-token-procs-0123", FG_PROCS_JOURNAL_DSN=PG_DSN,
                   FG_PROCS_API_TOKEN="api-token-procs-4567", PYTHONUNBUFFERED="1")  # fmt: skip
        log = self.dir / f"proc-{len(self.procs)}.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [*FLEETGATE, "--config", str(config or self.config()), "--state", str(self.state),
                 "--log-level", level, "--log-format", "json", *command],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> list[dict[str, Any]]:
        """The process's log records (JSON lines; anything else as {"msg": line})."""
        out = []
        for line in self.logs[proc.pid].read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                rec = {"msg": line}
            out.append(rec if isinstance(rec, dict) else {"msg": line})
        return out

    # ---- the journal, read from outside -----------------------------------------------------

    def query(self, text: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Run one read on the journal as it is on disk or in the database now."""
        if self.backend == "postgres":
            with psycopg.connect(PG_DSN, autocommit=True, connect_timeout=5) as conn:
                conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
                cur = conn.execute(text.replace("?", "%s"), args)
                cols = [d.name for d in cur.description or []]
                return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
        db = sqlite3.connect(self.state / "journal.db", timeout=5)
        try:
            db.row_factory = sqlite3.Row
            return [dict(r) for r in db.execute(text, args).fetchall()]
        finally:
            db.close()

    def actions(self) -> list[dict[str, Any]]:
        rows = self.query("SELECT * FROM actions ORDER BY id")
        for r in rows:
            r["params"] = json.loads(r["params"])
            r["result"] = json.loads(r["result"]) if r["result"] else None
        return rows

    def journal_exists(self) -> bool:
        if self.backend == "sqlite":
            return (self.state / "journal.db").exists()
        with psycopg.connect(PG_DSN, autocommit=True, connect_timeout=5) as conn:
            found = conn.execute("SELECT 1 FROM information_schema.tables WHERE "
                                 "table_schema = %s AND table_name = 'leases'",
                                 (self.schema,)).fetchone()  # fmt: skip
        return found is not None

    def readable(self) -> str:
        """'' when the journal is sound: SQLite's integrity check, or every table readable."""
        try:
            if self.backend == "sqlite":
                found = [r["integrity_check"] for r in self.query("PRAGMA integrity_check")]
                return "" if found == ["ok"] else f"integrity_check: {found[:3]}"
            for table in ("ticks", "actions", "tracks", "events", "kv", "leases"):
                self.query(f"SELECT count(*) AS n FROM {table}")  # noqa: S608 - fixed names
        except (sqlite3.Error, psycopg.Error) as exc:
            return f"{type(exc).__name__}: {exc}"
        return ""

    def lease_left(self) -> float:
        """Seconds the leader lease still runs (by this machine's clock), 0 if none or expired."""
        rows = self.query("SELECT expires_at FROM leases WHERE name = 'leader'")
        return max(0.0, float(rows[0]["expires_at"]) - time.time()) if rows else 0.0


def wait_for(check: Any, timeout_s: float, step_s: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step_s)
    return bool(check())

"""`heartbeat-loop`: the daemon's supervisord state and uptime, and the controller's commands.

Each heartbeat reports what `supervisorctl status <program>` says and runs the commands the
controller queued: `restart_daemon` is `supervisorctl restart <program>`. A command's result
(ok, detail) is reported back, and kept until the controller has it.

Standard library only: this package is copied onto instance images.
"""

from __future__ import annotations

import logging
import re
import subprocess
from dataclasses import dataclass
from typing import Any

from .client import Client, Refused

log = logging.getLogger("fleetgate-agent")

_STATES = ("STOPPED", "STARTING", "RUNNING", "BACKOFF", "STOPPING", "EXITED", "FATAL", "UNKNOWN")
_UPTIME = re.compile(r"uptime (?:(\d+) days?, )?(\d+):(\d\d):(\d\d)")


def parse_status(text: str, program: str) -> tuple[str | None, float | None]:
    """(state, uptime seconds) from `supervisorctl status <program>` output."""
    for line in text.splitlines():
        parts = line.split()
        name = parts[0] if parts else ""
        in_group = name.startswith(program + ":") and len(name) > len(program) + 1
        if len(parts) >= 2 and (name == program or in_group) and parts[1] in _STATES:
            m = _UPTIME.search(line)
            if not m:
                return parts[1], None
            days, h, mi, s = (int(g or 0) for g in m.groups())
            return parts[1], float(((days * 24 + h) * 60 + mi) * 60 + s)
    return None, None


@dataclass(frozen=True)
class Supervisor:
    ctl: tuple[str, ...]
    program: str
    timeout_s: float = 120.0

    def _run(self, *args: str) -> tuple[int, str]:
        try:
            done = subprocess.run(
                [*self.ctl, *args], capture_output=True, text=True, timeout=self.timeout_s
            )
        except subprocess.TimeoutExpired:
            return -1, f"{' '.join(args)} timed out after {self.timeout_s:g}s"
        except OSError as exc:
            return -1, f"cannot run {self.ctl[0]}: {exc}"
        return done.returncode, (done.stdout + done.stderr).strip()

    def status(self) -> tuple[str | None, float | None]:
        _rc, text = self._run("status", self.program)
        state, uptime = parse_status(text, self.program)
        if state is None:
            log.warning("no supervisord status for %s: %s", self.program, text[:300])
        return state, uptime

    def restart(self) -> tuple[bool, str]:
        """`supervisorctl restart` is a stop, then a start: a daemon that had exited (the case
        a restart is for) answers the stop with `ERROR (not running)`, and is then started."""
        rc, text = self._run("restart", self.program)
        failed = [line for line in text.splitlines()
                  if "ERROR" in line and "ERROR (not running)" not in line]  # fmt: skip
        return rc == 0 and not failed, text[:1000]


class Heartbeats:
    """One heartbeat per pass; executes the commands it receives and reports their results."""

    def __init__(self, client: Client, supervisor: Supervisor) -> None:
        self.client, self.supervisor = client, supervisor
        self.unreported: dict[int, dict[str, Any]] = {}

    def once(self) -> None:
        self.report()
        state, uptime = self.supervisor.status()
        reply = self.client.post(
            self.client.instance_path("heartbeat"),
            {"daemon_uptime_s": uptime, "daemon_state": state},
        )
        for cmd in reply.get("commands") or []:
            self.unreported[int(cmd["id"])] = self.execute(int(cmd["id"]), str(cmd["command"]))
        self.report()

    def execute(self, command_id: int, command: str) -> dict[str, Any]:
        if command != "restart_daemon":
            log.error("command #%d: unknown command %r", command_id, command)
            return {"ok": False, "detail": f"unknown command {command!r}"}
        log.info("command #%d: restarting %s", command_id, self.supervisor.program)
        ok, detail = self.supervisor.restart()
        (log.info if ok else log.error)("command #%d: ok=%s %s", command_id, ok, detail)
        return {"ok": ok, "detail": detail}

    def report(self) -> None:
        for command_id, result in list(self.unreported.items()):
            try:
                self.client.post(self.client.instance_path(f"commands/{command_id}/done"), result)
            except Refused as exc:
                log.error("command #%d: the controller refused its result: %s", command_id, exc)
            del self.unreported[command_id]

#!/usr/bin/env python3
"""fleetgate-agent: an instance's side of the fleetgate instance API (standard library only).

    fleetgate_agent.py register [--min-rate R] [--vast-id N] [--host-and-port H:P]
    fleetgate_agent.py stage params-done | bench-done --rate R | running
    fleetgate_agent.py heartbeat-loop [--interval 30] [--once]
    fleetgate_agent.py push-logs FILE [--interval 5] [--state PATH] [--once]

Settings come from the environment: FLEETGATE_URL (the controller, e.g. http://10.0.0.2:8080),
FLEETGATE_FLEET_TOKEN (or FLEETGATE_FLEET_TOKEN_FILE), FLEETGATE_LABEL (else vast's
VAST_CONTAINERLABEL, `C.<instance id>`). Every subcommand takes --supervisorctl (a command line,
default `supervisorctl`), --program (default `cuzk`) and --timeout.

Each heartbeat reports the daemon's supervisord state and uptime (`supervisorctl status`) and
runs the commands the controller queued: `restart_daemon` is `supervisorctl restart <program>`;
the result (ok, detail) is reported back, and kept until the controller has it.

The controller being down never crashes a loop: calls are retried with growing delays (1 s,
2 s, 4 s, ... up to the interval), and `register`/`stage` retry for a few minutes (--retries).
With --once, one attempt and the exit status says what happened:

    0  done          3  the controller could not be reached (or answered 429/5xx)
    2  bad settings  4  the controller refused the call (401, 404, 422, ...)    1  other error

A stage the controller already has passed (409) is not an error: a rebooted instance re-runs
its boot script. The token never appears in output.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

VERSION = "0.1.0"
MAX_PUSH_LINES = 200  # the controller's cap per push
MAX_LINE_CHARS = 2000
TAIL_START_BYTES = 256 * 1024  # a first push-logs starts this far before the end of the file
MAX_READ_BYTES = 1 << 20  # per pass

log = logging.getLogger("fleetgate-agent")
T = TypeVar("T")


class AgentError(Exception):
    exit_code = 1


class ConfigError(AgentError):
    exit_code = 2


class Unreachable(AgentError):
    """Temporary: connection failed, timed out, or the controller answered 429 or 5xx."""

    exit_code = 3


class Refused(AgentError):
    """Permanent for this call: the controller answered another 4xx."""

    exit_code = 4

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Config:
    url: str
    token: str = field(repr=False)
    label: str
    supervisorctl: tuple[str, ...]
    program: str
    timeout_s: float
    container_label: str = ""  # vast's VAST_CONTAINERLABEL, `C.<instance id>`


def load_config(args: argparse.Namespace, environ: Mapping[str, str]) -> Config:
    url = (environ.get("FLEETGATE_URL") or "").rstrip("/")
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
        raise ConfigError("FLEETGATE_URL must be the controller's http(s)://host:port")
    token = environ.get("FLEETGATE_FLEET_TOKEN", "").strip()
    token_file = environ.get("FLEETGATE_FLEET_TOKEN_FILE")
    if not token and token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.readline().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read {token_file}: {exc.strerror}") from exc
    if not token:
        raise ConfigError("set FLEETGATE_FLEET_TOKEN (or FLEETGATE_FLEET_TOKEN_FILE)")
    label = environ.get("FLEETGATE_LABEL") or environ.get("VAST_CONTAINERLABEL") or ""
    if not label:
        raise ConfigError("set FLEETGATE_LABEL (or run where vast sets VAST_CONTAINERLABEL)")
    ctl = tuple(shlex.split(args.supervisorctl))
    if not ctl:
        raise ConfigError("--supervisorctl is empty")
    return Config(
        url, token, label, ctl, args.program, args.timeout, environ.get("VAST_CONTAINERLABEL", "")
    )


# ---- the controller ------------------------------------------------------------------------
class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is refused: following it would carry the fleet token to another place."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Client:
    def __init__(self, config: Config) -> None:
        self.config = config
        parts = urlsplit(config.url)
        self.where = f"{parts.scheme}://{parts.netloc}"
        self._opener = urllib.request.build_opener(_NoRedirect)

    def instance_path(self, suffix: str) -> str:
        return f"/v1/instances/{quote(self.config.label, safe='')}/{suffix}"

    def post(self, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            self.config.url + path,
            data=json.dumps(dict(body or {})).encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {self.config.token}",
                "User-Agent": f"fleetgate-agent/{VERSION}",
            },
        )
        try:
            with self._opener.open(request, timeout=self.config.timeout_s) as response:
                raw = response.read(MAX_READ_BYTES)
        except urllib.error.HTTPError as exc:
            detail = _detail(exc)
            if exc.code == 429 or exc.code >= 500:
                raise Unreachable(f"{self.where}{path}: HTTP {exc.code} {detail}") from None
            raise Refused(exc.code, f"{self.where}{path}: HTTP {exc.code} {detail}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise Unreachable(f"cannot reach the controller at {self.where}: {reason}") from None
        try:
            answer = json.loads(raw or b"{}")
        except ValueError:
            raise Unreachable(f"{self.where}{path}: the answer is not JSON") from None
        return answer if isinstance(answer, dict) else {}


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read(4096) or b"{}")
        text = body.get("detail", "") if isinstance(body, dict) else ""
    except (ValueError, OSError):
        text = ""
    return str(text)[:300] if text else str(exc.reason)


def with_retries(
    call: Callable[[], T], attempts: int, stop: threading.Event, cap_s: float = 60.0
) -> T:
    """`call()`, retried on Unreachable after 1, 2, 4, ... seconds (capped, jittered).

    Gives up with the last error after `attempts`, or at once when `stop` is set (SIGTERM).
    """
    for attempt in range(max(1, attempts)):
        try:
            return call()
        except Unreachable as exc:
            delay = min(cap_s, 2.0**attempt) * random.uniform(0.8, 1.2)
            if attempt >= attempts - 1 or stop.is_set():
                raise
            log.warning("%s; retrying in %.1fs", exc, delay)
            if stop.wait(delay):
                raise
    raise AssertionError("unreachable")


# ---- supervisord -----------------------------------------------------------------------------
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
        rc, text = self._run("restart", self.program)
        return rc == 0 and "ERROR" not in text, text[:1000]


# ---- the subcommands -------------------------------------------------------------------------
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


@dataclass
class Tailer:
    """New complete lines of a file since the last pass; survives truncation and rotation."""

    path: str
    state_path: str | None = None
    offset: int | None = None
    inode: int | None = None

    def __post_init__(self) -> None:
        if self.state_path and os.path.exists(self.state_path):
            try:
                with open(self.state_path, encoding="utf-8") as f:
                    saved = json.load(f)
                self.offset, self.inode = int(saved["offset"]), int(saved["inode"])
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("ignoring unreadable state file %s", self.state_path)

    def read(self) -> list[tuple[str, int]]:
        """[(line, offset after it)]: up to MAX_READ_BYTES of new complete lines."""
        st = os.stat(self.path)
        mid_line = False
        if self.offset is None or self.inode != st.st_ino or st.st_size < self.offset:
            first = self.offset is None  # start near the end; after a rotation, at the start
            self.offset = max(0, st.st_size - TAIL_START_BYTES) if first else 0
            self.inode, mid_line = st.st_ino, first and self.offset > 0
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(MAX_READ_BYTES)
        end = data.rfind(b"\n")
        if end < 0 and len(data) < MAX_READ_BYTES:
            return []  # an unfinished line: wait for its end
        chunks = data[:end].split(b"\n") if end >= 0 else [data]  # else: one enormous line
        out, pos = [], self.offset
        for chunk in chunks:
            pos = min(pos + len(chunk) + 1, self.offset + len(data))
            out.append((chunk.decode("utf-8", "replace")[:MAX_LINE_CHARS], pos))
        if mid_line:  # the first "line" is the end of one that started before the window
            self.commit(out.pop(0)[1])
        return out

    def commit(self, offset: int) -> None:
        self.offset = offset
        if self.state_path:
            tmp = self.state_path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"offset": offset, "inode": self.inode}, f)
            os.replace(tmp, self.state_path)


def push_new_lines(client: Client, tailer: Tailer) -> int:
    """Push what is new in batches; the offset moves past a batch once the controller has it."""
    try:
        lines = tailer.read()
    except FileNotFoundError:
        log.info("%s does not exist yet", tailer.path)
        return 0
    for start in range(0, len(lines), MAX_PUSH_LINES):
        batch = lines[start : start + MAX_PUSH_LINES]
        client.post(client.instance_path("logs"), {"lines": [text for text, _ in batch]})
        tailer.commit(batch[-1][1])
    return len(lines)


def loop(step: Callable[[], object], interval_s: float, once: bool, stop: threading.Event) -> int:
    """Run `step` every interval; after failures sooner (1, 2, 4 s, ...). Never raises."""
    failures = 0
    while True:
        try:
            step()
            failures = 0
        except AgentError as exc:
            failures += 1
            log.error("%s", exc)
            if once:
                return exc.exit_code
        except Exception as exc:  # a bug or a surprise must not end the loop
            failures += 1
            log.exception("unexpected %s", type(exc).__name__)
            if once:
                return 1
        if once:
            return 0
        delay = interval_s if not failures else min(interval_s, 2.0 ** (failures - 1))
        if stop.wait(delay * random.uniform(0.9, 1.1)):
            return 0


# ---- command line ----------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--supervisorctl", default="supervisorctl", help="command line to run")
    common.add_argument("--program", default="cuzk", help="the daemon's supervisord program")
    common.add_argument("--timeout", type=float, default=10.0, help="per HTTP call, seconds")
    common.add_argument("--retries", type=int, default=10, help="attempts for register/stage")
    common.add_argument("--once", action="store_true", help="one attempt, one pass")
    p = argparse.ArgumentParser(prog="fleetgate-agent", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    reg = sub.add_parser("register", parents=[common])
    reg.add_argument("--min-rate", type=float)
    reg.add_argument("--vast-id")
    reg.add_argument("--host-and-port")
    stage = sub.add_parser("stage", parents=[common])
    stage.add_argument("stage", choices=("params-done", "bench-done", "running"))
    stage.add_argument("--rate", type=float, help="benchmark proofs/hour (bench-done)")
    hb = sub.add_parser("heartbeat-loop", parents=[common])
    hb.add_argument("--interval", type=float, default=30.0)
    logs = sub.add_parser("push-logs", parents=[common])
    logs.add_argument("file")
    logs.add_argument("--interval", type=float, default=5.0)
    logs.add_argument("--state", help="file keeping the offset across restarts")
    return p


def run(args: argparse.Namespace, config: Config, stop: threading.Event) -> int:
    client = Client(config)
    attempts = 1 if args.once else args.retries
    if args.cmd == "register":
        # vast sets VAST_CONTAINERLABEL (C.<id>) in every container; the launch label wins as
        # the name, the container label still tells the id (the controller links it too)
        vast_id = args.vast_id or _vast_id(config.label) or _vast_id(config.container_label)
        body = {"label": config.label, "vast_id": vast_id, "min_rate": args.min_rate,
                "host_and_port": args.host_and_port, "agent_version": VERSION}  # fmt: skip
        with_retries(lambda: client.post("/v1/instances/register", body), attempts, stop)
        log.info("registered as %s", config.label)
        return 0
    if args.cmd == "stage":
        return _stage(client, args, attempts, stop)
    if args.cmd == "heartbeat-loop":
        supervisor = Supervisor(config.supervisorctl, config.program)
        return loop(Heartbeats(client, supervisor).once, args.interval, args.once, stop)
    tailer = Tailer(args.file, args.state)
    return loop(lambda: push_new_lines(client, tailer), args.interval, args.once, stop)


def _stage(client: Client, args: argparse.Namespace, attempts: int, stop: threading.Event) -> int:
    if args.stage == "bench-done" and args.rate is None:
        raise ConfigError("bench-done needs --rate (proofs/hour)")
    body = {"rate": args.rate} if args.stage == "bench-done" else {}
    path = client.instance_path(args.stage)
    try:
        with_retries(lambda: client.post(path, body), attempts, stop)
    except Refused as exc:
        if exc.status != 409:
            raise
        log.warning("the controller already has a later stage: %s", exc)
        return 0
    log.info("reported %s", args.stage)
    return 0


def _vast_id(label: str) -> str | None:
    m = re.fullmatch(r"C\.(\d+)", label)
    return m[1] if m else None


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="fleetgate-agent %(levelname)s: %(message)s")  # fmt: skip
    args = parser().parse_args(argv)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    try:
        return run(args, load_config(args, os.environ if environ is None else environ), stop)
    except AgentError as exc:
        log.error("%s", exc)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())

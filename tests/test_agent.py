"""The reference agent, run as instances run it: a separate python with only the standard library,
talking to the instance API on loopback and to a real supervisord managing a stand-in daemon."""

from __future__ import annotations

import ast
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import SecretStr

import controller.fleet.agent.fleetgate_agent as agent_module
from controller.fleet.agent.client import Unreachable, with_retries
from controller.fleet.agent.heartbeat import parse_status
from controller.fleet.instance_api import instance_router
from controller.service.api import Server, create_app
from controller.store.journal import Journal
from controller.store.records import LifecycleStore

AGENT = Path(agent_module.__file__).resolve()
BIN = Path(sys.executable).parent
NOW = 1000.0
LABELS = ("fg-a1", "fg-3-9-0-abc123", "C.5150")  # what the tests launch (each has a token)
ISSUED: dict[str, str] = {}  # label -> its instance token, issued by the `store` fixture

FAKE_DAEMON = """\
import os, time
parent = os.getppid()
while os.getppid() == parent:  # never outlive supervisord
    time.sleep(0.2)
"""

SUPERVISORD_CONF = """\
[unix_http_server]
file={d}/s.sock
chmod=0700

[supervisord]
logfile={d}/supervisord.log
pidfile={d}/supervisord.pid
childlogdir={d}
nodaemon=true

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{d}/s.sock

[program:cuzk]
command={python} {d}/fake_cuzk.py
autostart=true
autorestart=true
startsecs=1
stopwaitsecs=5
stdout_logfile={d}/cuzk.log
redirect_stderr=true
"""


@dataclass
class Supervisord:
    conf: Path

    @property
    def ctl(self) -> str:
        return f"{BIN / 'supervisorctl'} -c {self.conf}"

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "supervisorctl"), "-c", str(self.conf), *args],
                              capture_output=True, text=True, timeout=30)  # fmt: skip

    def pid(self) -> int:
        out = self.run("pid", "cuzk").stdout.strip()
        return int(out) if out.isdigit() else 0


@pytest.fixture
def supervisord() -> Iterator[Supervisord]:
    # a short directory: a unix socket path must stay under about 100 characters
    d = Path(tempfile.mkdtemp(prefix="fgsv-"))
    (d / "fake_cuzk.py").write_text(FAKE_DAEMON)
    conf = d / "supervisord.conf"
    conf.write_text(SUPERVISORD_CONF.format(d=d, python=sys.executable))
    proc = subprocess.Popen([str(BIN / "supervisord"), "-c", str(conf)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    sv = Supervisord(conf)
    try:
        deadline = time.monotonic() + 20
        while "RUNNING" not in sv.run("status", "cuzk").stdout:
            assert proc.poll() is None, (d / "supervisord.log").read_text()
            assert time.monotonic() < deadline, "supervisord did not start the stand-in daemon"
            time.sleep(0.1)
        yield sv
    finally:
        if proc.poll() is None:
            sv.run("shutdown")
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(d, ignore_errors=True)


@dataclass
class Controller:
    url: str
    store: LifecycleStore


def serve(store: LifecycleStore, port: int = 0) -> Server:
    app = create_app(store._j, SecretStr("operator-token"), clock=lambda: NOW)
    app.include_router(instance_router(store, None, lambda: NOW))
    server = Server(app, "127.0.0.1", port)
    server.start()
    return server


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LifecycleStore]:
    journal = Journal(tmp_path / "j.db")
    try:
        lifecycle = LifecycleStore(journal)
        ISSUED.clear()
        ISSUED.update({label: lifecycle.tokens.issue(label, NOW - 200) for label in LABELS})
        yield lifecycle
    finally:
        journal.close()


@pytest.fixture
def controller(store: LifecycleStore) -> Iterator[Controller]:
    server = serve(store)
    try:
        yield Controller(f"http://127.0.0.1:{server.port}", store)
    finally:
        server.stop()


def env(
    url: str, label: str | None = "fg-a1", token: str | None = None, **extra: str
) -> dict[str, str]:
    """What a launch gives the container: the URL, the label and the instance's own token (of
    `label`, else of vast's container label, unless `token` says)."""
    own = ISSUED.get(label or extra.get("VAST_CONTAINERLABEL", ""), "token-of-no-launch")
    out = {"PATH": os.environ.get("PATH", ""), "FLEETGATE_URL": url,
           "FLEETGATE_INSTANCE_TOKEN": own if token is None else token}  # fmt: skip
    if label:
        out["FLEETGATE_LABEL"] = label
    return {**out, **extra}


def agent(
    environ: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """The agent file under `python -I -S`: no site-packages, so only the standard library."""
    return subprocess.run([sys.executable, "-I", "-S", str(AGENT), *args], env=environ,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- the restart path, end to end ----------------------------------------------------------------
def test_a_queued_restart_is_picked_by_one_heartbeat_and_restarts_the_daemon(
    supervisord: Supervisord, controller: Controller
) -> None:
    store = controller.store
    store.register("fg-a1", "4242", 10.0, None, now=900.0)
    cid = store.queue_command("fg-a1", "restart_daemon", now=990.0, deadline_s=300.0)
    before = supervisord.pid()
    assert before > 0
    time.sleep(1.1)  # an uptime of at least a second to report
    out = agent(env(controller.url), "heartbeat-loop", "--once", "--supervisorctl",
                supervisord.ctl, "--program", "cuzk")  # fmt: skip
    assert out.returncode == 0, out.stderr
    after = supervisord.pid()
    assert after > 0 and after != before, "the daemon was not restarted"
    done = store.command(cid)
    assert done is not None and done.picked_at == NOW and done.done_at == NOW
    assert done.result is not None and done.result["ok"] is True
    assert "cuzk: started" in done.result["detail"]
    rec = store.records()["fg-a1"]
    assert rec.last_heartbeat == NOW and rec.daemon_state == "RUNNING"
    assert rec.daemon_uptime_s is not None and rec.daemon_uptime_s >= 1
    again = agent(env(controller.url), "heartbeat-loop", "--once", "--supervisorctl",
                  supervisord.ctl)  # fmt: skip
    assert again.returncode == 0 and supervisord.pid() == after  # picked once, run once
    assert ISSUED["fg-a1"] not in out.stderr + out.stdout + again.stderr


def test_a_restart_of_a_daemon_that_had_exited_starts_it_and_is_reported_ok(
    supervisord: Supervisord, controller: Controller
) -> None:
    """supervisorctl answers the restart's stop with `cuzk: ERROR (not running)`, then starts it."""
    store = controller.store
    store.register("fg-a1", "4242", 10.0, None, now=900.0)
    assert supervisord.run("stop", "cuzk").returncode == 0 and supervisord.pid() == 0
    cid = store.queue_command("fg-a1", "restart_daemon", now=990.0, deadline_s=300.0)
    out = agent(env(controller.url), "heartbeat-loop", "--once", "--supervisorctl",
                supervisord.ctl, "--program", "cuzk")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert supervisord.pid() > 0, "the daemon was not started"
    done = store.command(cid)
    assert done is not None and done.result is not None
    assert "ERROR (not running)" in done.result["detail"] and "cuzk: started" in done.result[
        "detail"]  # fmt: skip
    assert done.result["ok"] is True


def test_a_failed_restart_is_reported_as_not_ok(
    supervisord: Supervisord, controller: Controller
) -> None:
    store = controller.store
    store.register("fg-a1", None, None, None, now=900.0)
    cid = store.queue_command("fg-a1", "restart_daemon", now=990.0, deadline_s=300.0)
    out = agent(env(controller.url), "heartbeat-loop", "--once", "--supervisorctl",
                supervisord.ctl, "--program", "no-such-program")  # fmt: skip
    assert out.returncode == 0, out.stderr
    done = store.command(cid)
    assert done is not None and done.result is not None and done.result["ok"] is False
    assert "no-such-program" in done.result["detail"]
    assert store.records()["fg-a1"].daemon_state is None


def test_with_the_controller_down_once_exits_cleanly_with_the_reason() -> None:
    port = dead_port()
    out = agent(env(f"http://127.0.0.1:{port}"), "heartbeat-loop", "--once",
                "--supervisorctl", "/bin/false")  # fmt: skip
    assert out.returncode == 3
    assert f"cannot reach the controller at http://127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr and "FLEETGATE_INSTANCE_TOKEN" not in out.stderr


def test_the_loop_outlives_a_controller_that_starts_late(store: LifecycleStore) -> None:
    store.register("fg-a1", None, None, None, now=900.0)
    port = dead_port()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", str(AGENT), "heartbeat-loop", "--interval", "0.5",
         "--supervisorctl", "/bin/false"],
        env=env(f"http://127.0.0.1:{port}"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    server = None
    try:
        time.sleep(1.5)
        assert proc.poll() is None, proc.communicate()
        server = serve(store, port)
        deadline = time.monotonic() + 20
        while store.records()["fg-a1"].last_heartbeat is None:
            assert time.monotonic() < deadline, "the agent never came back"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        if server is not None:
            server.stop()
    assert proc.returncode == 0
    assert "cannot reach the controller" in stderr and "Traceback" not in stderr


def test_register_retries_until_the_controller_is_up(store: LifecycleStore) -> None:
    port = dead_port()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", str(AGENT), "register", "--retries", "6"],
        env=env(f"http://127.0.0.1:{port}"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    time.sleep(1.2)
    server = serve(store, port)
    try:
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        server.stop()
    assert proc.returncode == 0, stderr
    assert "retrying in" in stderr and "fg-a1" in store.records()


def test_with_retries_backs_off_and_stops_when_told() -> None:
    calls: list[float] = []

    def flaky() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise Unreachable("down")
        return "up"

    stop = threading.Event()
    assert with_retries(flaky, 5, stop, cap_s=0.05) == "up" and len(calls) == 3
    calls.clear()
    with pytest.raises(Unreachable):
        with_retries(flaky, 2, stop, cap_s=0.05)  # out of attempts
    stop.set()
    calls.clear()
    with pytest.raises(Unreachable):
        with_retries(flaky, 5, stop, cap_s=60.0)  # SIGTERM: no waiting
    assert len(calls) == 1


# ---- register, stages, logs ----------------------------------------------------------------------
def test_register_and_report_the_boot_stages(controller: Controller) -> None:
    e = env(controller.url, label=None, VAST_CONTAINERLABEL="C.5150")
    assert (
        agent(e, "register", "--min-rate", "12", "--host-and-port", "10.0.0.9:12300").returncode
        == 0
    )
    assert agent(e, "stage", "params-done").returncode == 0
    assert agent(e, "stage", "bench-done", "--rate", "14.5").returncode == 0
    assert agent(e, "stage", "running").returncode == 0
    rec = controller.store.records()["C.5150"]
    assert (rec.vast_id, rec.min_rate, rec.host_and_port) == ("5150", 12.0, "10.0.0.9:12300")
    assert (rec.stage, rec.bench_rate, rec.agent_version) == ("running", 14.5, agent_module.VERSION)
    rerun = agent(e, "stage", "params-done")  # a rebooted instance re-runs its boot script
    assert rerun.returncode == 0 and "already has a later stage" in rerun.stderr
    no_rate = agent(e, "stage", "bench-done")
    assert no_rate.returncode == 2 and "--rate" in no_rate.stderr


def test_the_readme_setup_registers_its_launch_label_with_the_container_vast_id(
    controller: Controller,
) -> None:
    """As the README's onstart runs it: FLEETGATE_LABEL from the create, no flags; vast's
    VAST_CONTAINERLABEL still tells the instance id."""
    e = env(controller.url, label="fg-3-9-0-abc123", VAST_CONTAINERLABEL="C.5151")
    assert agent(e, "register").returncode == 0
    rec = controller.store.records()["fg-3-9-0-abc123"]
    assert (rec.vast_id, rec.host_and_port) == ("5151", None)


def test_refusals_and_bad_settings_have_their_own_exit_codes(controller: Controller) -> None:
    wrong = agent(env(controller.url, token="not-the-token"), "register", "--once")
    assert wrong.returncode == 4 and "HTTP 401" in wrong.stderr
    assert "not-the-token" not in wrong.stderr
    unknown = agent(env(controller.url), "stage", "running", "--once")
    assert unknown.returncode == 4 and "HTTP 404" in unknown.stderr
    no_label = agent(env(controller.url, label=None), "register")
    assert no_label.returncode == 2 and "FLEETGATE_LABEL" in no_label.stderr
    no_url = agent(env("controller:8080"), "register")
    assert no_url.returncode == 2 and "FLEETGATE_URL" in no_url.stderr
    other = agent(env(controller.url, token=ISSUED["fg-3-9-0-abc123"]), "register", "--once")
    assert other.returncode == 4 and "HTTP 403" in other.stderr  # another instance's token
    no_token = agent({**env(controller.url), "FLEETGATE_INSTANCE_TOKEN": ""}, "register")
    assert no_token.returncode == 2 and "FLEETGATE_INSTANCE_TOKEN" in no_token.stderr
    assert controller.store.records() == {}


def test_the_token_may_come_from_a_file(controller: Controller, tmp_path: Path) -> None:
    (tmp_path / "token").write_text(ISSUED["fg-a1"] + "\n")
    e = {**env(controller.url, token=""), "FLEETGATE_INSTANCE_TOKEN_FILE": str(tmp_path / "token")}
    assert agent(e, "register", "--once").returncode == 0
    assert "fg-a1" in controller.store.records()


def test_push_logs_sends_only_new_complete_lines(controller: Controller, tmp_path: Path) -> None:
    controller.store.register("fg-a1", None, None, None, now=900.0)
    log, state = tmp_path / "cuzk.log", tmp_path / "cuzk.offset"
    log.write_text("".join(f"boot {i}\n" for i in range(450)) + "half a li")
    args = ("push-logs", str(log), "--state", str(state), "--once")
    assert agent(env(controller.url), *args).returncode == 0
    lines = [x.line for x in controller.store.logs("fg-a1")]
    assert len(lines) == 450 and lines[0] == "boot 0" and lines[-1] == "boot 449"
    with log.open("a") as f:
        f.write("ne\n\x1b[31mcuzk exited\x1b[0m\n")
    assert agent(env(controller.url), *args).returncode == 0
    assert agent(env(controller.url), *args).returncode == 0  # nothing new: nothing sent
    lines = [x.line for x in controller.store.logs("fg-a1")]
    assert lines[-3:] == ["boot 449", "half a line", "cuzk exited"] and len(lines) == 452
    log.write_text("after rotation\n")  # truncated: start again from the top
    assert agent(env(controller.url), *args).returncode == 0
    assert controller.store.logs("fg-a1")[-1].line == "after rotation"


def test_push_logs_starts_near_the_end_of_a_big_file(
    controller: Controller, tmp_path: Path
) -> None:
    controller.store.register("fg-a1", None, None, None, now=900.0)
    log = tmp_path / "big.log"
    log.write_text("".join(f"old line {i:07d} {'x' * 100}\n" for i in range(5000)) + "last\n")
    assert agent(env(controller.url), "push-logs", str(log), "--once").returncode == 0
    lines = [x.line for x in controller.store.logs("fg-a1")]
    assert lines[-1] == "last" and all(x.startswith("old line") for x in lines[:-1])
    assert len(lines) == 500  # the store's cap; the first, partial line was skipped
    assert (
        agent(env(controller.url), "push-logs", str(tmp_path / "missing.log"), "--once").returncode
        == 0
    )


# ---- pure parts ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cuzk                             RUNNING   pid 1234, uptime 0:00:05", ("RUNNING", 5.0)),
        ("cuzk  RUNNING   pid 1234, uptime 12:03:04", ("RUNNING", 43384.0)),
        ("cuzk  RUNNING   pid 1, uptime 1 day, 2:03:04", ("RUNNING", 93784.0)),
        ("cuzk  RUNNING   pid 1, uptime 3 days, 0:00:01", ("RUNNING", 259201.0)),
        ("cuzk:cuzk_00  RUNNING   pid 7, uptime 0:01:00", ("RUNNING", 60.0)),
        ("cuzk   FATAL     Exited too quickly (process log may have details)", ("FATAL", None)),
        ("cuzk   STOPPED   Jan 01 10:00 AM", ("STOPPED", None)),
        ("curio  RUNNING   pid 9, uptime 0:00:05\ncuzk  BACKOFF  Exited", ("BACKOFF", None)),
        ("cuzk: ERROR (no such process)", (None, None)),
        ("cuzkish  RUNNING   pid 9, uptime 0:00:05", (None, None)),
        ("unix:///var/run/supervisor.sock no such file", (None, None)),
        ("", (None, None)),
    ],
)  # fmt: skip
def test_parse_status(text: str, expected: tuple[str | None, float | None]) -> None:
    assert parse_status(text, "cuzk") == expected


def test_the_agent_imports_only_the_standard_library_and_its_own_folder() -> None:
    own = {p.stem for p in AGENT.parent.glob("*.py")}
    for path in sorted(AGENT.parent.glob("*.py")):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 and node.module in own, f"{path.name}: {node.module}"
            elif isinstance(node, ast.ImportFrom):
                imported.add(str(node.module).split(".")[0])
        assert imported - {"__future__"} <= sys.stdlib_module_names, (path.name, imported)


def test_the_agent_folder_copied_anywhere_runs_alone(tmp_path: Path) -> None:
    """As on an image: the folder copied under another name, run by a python without the
    project or site-packages."""
    copy = tmp_path / "fleetgate agent"
    shutil.copytree(AGENT.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run([sys.executable, "-I", "-S", str(copy / AGENT.name), "register",
                          "--once"], env=env(f"http://127.0.0.1:{dead_port()}"),
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 3 and "cannot reach the controller" in out.stderr, out.stderr


def test_every_agent_command_and_option_says_what_it_is() -> None:
    """`fleetgate-agent register --help` listed --min-rate, --vast-id and --host-and-port with
    no word of what they are, and the commands with none of what they do."""
    import argparse

    from controller.fleet.agent.fleetgate_agent import parser

    top = parser()
    (choices,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {c.dest: c.help for c in choices._choices_actions}
    assert set(helps) == set(choices.choices) and all(helps.values()), helps
    for name, sub in choices.choices.items():
        assert sub.description, name
        for action in sub._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"{name} {action.option_strings or action.dest}"

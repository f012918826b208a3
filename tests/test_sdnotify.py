"""systemd's notify protocol: `fleetgate run` as a real process tells a real unix datagram socket
READY=1 once it leads or stands by, WATCHDOG=1 after each tick and while standing by, and
STOPPING=1 on shutdown; the shipped unit is `Type=notify` with a watchdog."""

from __future__ import annotations

import configparser
import logging
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
from pathlib import Path
from typing import Any

import pytest

from controller.service.config import Config
from controller.service.sdnotify import Notifier
from controller.store.journal import Journal
from controller.store.lease import Lease

ROOT = Path(__file__).resolve().parent.parent
MAIN = "import sys; from controller.service.cli import main; sys.exit(main())"


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    """A bound unix datagram socket, as systemd's (a short path: sun_path holds 108 bytes)."""
    folder = tempfile.mkdtemp(prefix="fg-notify-", dir="/tmp")
    path = os.path.join(folder, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.2)
    try:
        yield sock, path
    finally:
        sock.close()
        shutil.rmtree(folder, ignore_errors=True)


def _run(state: Path, address: str, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FLEETGATE_STATE", "WATCHDOG_PID")}
    env.update(PYTHONPATH=str(ROOT), NOTIFY_SOCKET=address, WATCHDOG_USEC="300000000")
    return subprocess.Popen([sys.executable, "-c", MAIN, "--state", str(state), "run", *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def _receive(sock: socket.socket, until: float) -> list[str] | None:
    try:
        return sock.recv(4096).decode().split("\n")
    except TimeoutError:
        return None if time.monotonic() < until else []


def test_run_says_ready_then_watchdog_per_tick_then_stopping(
    tmp_path: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    sock, address = notify_socket
    proc = _run(tmp_path / "state", address, "--ticks", "3")
    messages: list[list[str]] = []
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        got = _receive(sock, deadline)
        if got:
            messages.append(got)
    while (got := _receive(sock, 0)) is not None and got:  # what was sent just before exit
        messages.append(got)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    kinds = [m[0] for m in messages]
    assert kinds[0] == "READY=1", messages
    assert any(f.startswith("STATUS=leading as ") for f in messages[0]), messages
    assert kinds.count("READY=1") == 1
    assert kinds.count("WATCHDOG=1") == 3, kinds  # one a tick
    assert kinds[-1] == "STOPPING=1", kinds
    assert kinds.index("STOPPING=1") > max(i for i, k in enumerate(kinds) if k == "WATCHDOG=1")


def test_a_standby_is_ready_and_keeps_the_watchdog_fed(
    tmp_path: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    """Another controller holds the lease: this one says READY=1 as standing by, pings the
    watchdog while it waits, and STOPPING=1 on SIGTERM."""
    sock, address = notify_socket
    state = tmp_path / "state"
    state.mkdir()
    journal = Journal(state / "journal.db")
    other = Lease(journal, "elsewhere:1", ttl_s=Config().lease.ttl_s)
    assert other.renew()
    proc = _run(state, address)
    messages: list[list[str]] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            other.renew()  # keep leading from here
            got = _receive(sock, deadline)
            if got:
                messages.append(got)
            if [m[0] for m in messages].count("WATCHDOG=1") >= 2:
                break
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:  # read on, as systemd does
            got = _receive(sock, deadline)
            if got:
                messages.append(got)
        _, err = proc.communicate(timeout=60)
        while (got := _receive(sock, 0)) is not None and got:
            messages.append(got)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        journal.close()
    assert proc.returncode == 0, err[-2000:]
    kinds = [m[0] for m in messages]
    assert kinds[0] == "READY=1", messages
    assert any("standing by" in f and "elsewhere:1" in f for f in messages[0]), messages
    assert kinds.count("WATCHDOG=1") >= 2 and kinds[-1] == "STOPPING=1", kinds


def test_a_reader_that_falls_behind_never_stalls_the_sender(
    notify_socket: tuple[socket.socket, str], caplog: pytest.LogCaptureFixture
) -> None:
    """The socket's queue holds a few datagrams (`net.unix.max_dgram_qlen`): once it is full,
    a send gives up after its timeout, is logged once, and the sender goes on; nothing blocks
    the tick, the standby loop or the shutdown that waits for them."""
    sock, address = notify_socket
    notify = Notifier(address, send_timeout_s=0.2)
    results: list[bool] = []
    try:  # the kernel's queue length for unix datagrams (10 unless tuned)
        queue = int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    except (OSError, ValueError):
        queue = 10
    sends = queue + 6

    def flood() -> None:
        results.extend(notify.watchdog() for _ in range(sends))  # never read: the queue fills
        results.append(notify.stopping("bye"))

    with caplog.at_level(logging.WARNING, logger="controller.service.sdnotify"):
        sender = threading.Thread(target=flood, daemon=True)
        sender.start()
        sender.join(timeout=60)
    assert not sender.is_alive(), "a send blocked on a full queue"
    assert len(results) == sends + 1 and results[0] and not all(results)
    assert not results[-1]  # STOPPING=1 too was dropped, not waited for without end
    assert len(caplog.records) == 1 and "queue stayed full for 0.2 s" in caplog.text
    sock.settimeout(None)
    assert sock.recv(4096) == b"WATCHDOG=1"  # what fitted was delivered


def test_without_a_socket_nothing_is_sent_and_a_dead_socket_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert not Notifier.from_env({}).enabled and not Notifier.from_env({}).watchdog()
    gone = Notifier(str(tmp_path / "no-such-socket"))
    with caplog.at_level(logging.WARNING, logger="controller.service.sdnotify"):
        assert not gone.ready("x") and not gone.watchdog() and not gone.stopping()
    assert len(caplog.records) == 1 and "cannot notify systemd" in caplog.text
    assert not gone.ready_sent


def test_the_abstract_namespace_and_the_watchdog_interval() -> None:
    name = f"fg-notify-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        notify = Notifier.from_env({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "30000000"})
        assert notify.watchdog_s == 30.0
        assert notify.ready("leading\nas me")
        assert sock.recv(4096) == b"READY=1\nSTATUS=leading as me"
        assert notify.ready("standing by")  # only the status, once ready
        assert sock.recv(4096) == b"STATUS=standing by"
        # STOPPING=1 is the last word, whichever thread speaks after it
        assert notify.stopping("bye") and sock.recv(4096) == b"STOPPING=1\nSTATUS=bye"
        assert not notify.watchdog() and not notify.ready("again") and not notify.stopping()
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            sock.recv(4096)
    other_pid = {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}
    assert Notifier.from_env(other_pid).watchdog_s is None  # meant for another process


def test_the_shipped_unit_is_type_notify_with_a_watchdog(tmp_path: Path) -> None:
    unit = ROOT / "deploy" / "fleetgate.service"
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read(unit)
    service = parser["Service"]
    assert service["type"] == "notify" and service["notifyaccess"] == "main"
    watchdog_s = int(service["watchdogsec"])
    example = (ROOT / "controller" / "examples" / "vast-curio.yaml").read_text()
    interval = float(example.split("interval_s:", 1)[1].split()[0])
    assert watchdog_s > 2 * interval  # a real fleet's interval, and a slow tick, fit
    verify = shutil.which("systemd-analyze")
    if verify is None:
        pytest.skip("systemd-analyze is not installed")
    local = tmp_path / "fleetgate.service"
    exe = str(Path(sys.executable).with_name("fleetgate"))
    local.write_text(unit.read_text().replace("/opt/fleetgate/bin/fleetgate", exe))
    out = subprocess.run([verify, "verify", str(local)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and str(local) not in out.stderr, out.stderr


class _Recorder(Notifier):
    """Notes which handlers SIGHUP and SIGTERM had when READY=1 went out."""

    def __init__(self) -> None:
        super().__init__(None)
        self.handlers: dict[str, Any] = {}

    def ready(self, status: str) -> bool:
        if not self.handlers:
            self.handlers = {"HUP": signal.getsignal(signal.SIGHUP),
                             "TERM": signal.getsignal(signal.SIGTERM)}  # fmt: skip
        self.ready_sent = True
        return True


@pytest.mark.parametrize("leased", [True, False])
def test_signals_are_handled_before_ready_is_sent(tmp_path: Path, leased: bool) -> None:
    """systemd runs a `systemctl reload` queued behind the start as soon as READY=1 comes: a
    SIGHUP before the handler ended the process, which Restart=on-failure leaves dead."""
    from controller.service.schedule import Runner

    journal = Journal(tmp_path / "journal.db")
    try:
        lease = Lease(journal, "here:1", ttl_s=Config().lease.ttl_s) if leased else None
        notify = _Recorder()
        runner = Runner(lambda: None, 0.01, max_ticks=1, lease=lease, notify=notify)
        before = signal.getsignal(signal.SIGHUP)
        assert runner.run() == 1
        assert notify.handlers == {"HUP": runner._on_hup, "TERM": runner._on_signal}
        assert signal.getsignal(signal.SIGHUP) == before  # given back after
    finally:
        journal.close()

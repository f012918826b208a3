"""cuzk daemon health against a real local HTTP server playing cuzk's status server."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests

from controller.fleet.health import (
    ANSWER_WITHIN,
    DaemonHealth,
    check_daemon,
    check_many,
    mapped_port,
    status_target,
)

STATUS = {
    "uptime_secs": 5025,
    "memory": {"total_bytes": 274877906944, "used_bytes": 1 << 36, "available_bytes": 1 << 37},
    "pipelines": [],
}


class FakeCuzk(ThreadingHTTPServer):
    """`GET /status` as cuzk answers it, or one of the ways it can go wrong (`mode`)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode = "ok"
        self.delay_s = 0.0
        self.hits = 0
        self.agents: list[str] = []
        self.lock = threading.Lock()
        self.release = threading.Event()  # ends any stalled handler when the test is done


class _Handler(BaseHTTPRequestHandler):
    server: FakeCuzk

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        srv = self.server
        with srv.lock:
            srv.hits += 1
            srv.agents.append(self.headers.get("User-Agent", ""))
        time.sleep(srv.delay_s)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._answer(srv)

    def _answer(self, srv: FakeCuzk) -> None:
        if self.path != "/status":
            return self._send(404, b"not found", "text/plain")
        if srv.mode == "hang":
            srv.release.wait(10)
            return
        if srv.mode == "stall-body":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b'{"uptime_secs": ')
            self.wfile.flush()
            srv.release.wait(10)
            return
        if srv.mode in ("drip-body", "drip-headers"):  # a byte at a time, each in time
            self.send_response(200)
            if srv.mode == "drip-headers":
                self.wfile.write(b"X-Slow: ")
            else:
                self.send_header("Content-Length", "1000")
                self.end_headers()
            while not srv.release.wait(0.05):
                self.wfile.write(b"x" if srv.mode == "drip-headers" else b" ")
                self.wfile.flush()
            return
        bodies = {
            "ok": json.dumps(STATUS).encode(),
            "html": b"<html>vast proxy: nothing here</html>",
            "no-uptime": b'{"memory": {}}',
            "list": b"[1, 2]",
            "inf": b'{"uptime_secs": Infinity}',
            "negative": b'{"uptime_secs": -86400}',
        }
        if srv.mode == "error":
            return self._send(503, b'{"error": "starting"}', "application/json")
        self._send(200, bodies[srv.mode], "application/json")

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def cuzk() -> Iterator[FakeCuzk]:
    server = FakeCuzk()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_of(server: FakeCuzk) -> int:
    return int(server.server_address[1])


def test_a_daemon_that_answers_is_up_with_its_uptime(
    cuzk: FakeCuzk, session: requests.Session
) -> None:
    assert check_daemon("127.0.0.1", port_of(cuzk), 2.0, session) == DaemonHealth(True, 5025.0, "")


def test_an_answer_is_timed_as_the_probe_went_out_and_dates_the_daemons_start(
    cuzk: FakeCuzk, session: requests.Session
) -> None:
    """The start is the probe's time less the uptime: asked at 1,000,000 (the clock read as
    the request goes out, and once more when the answer is in), up 5,025 s. An answer that
    took over 2 s dates nothing (its request may have waited as long to arrive)."""
    cuzk.delay_s = 0.3
    ticks = iter([1_000_000.0, 1_000_001.5, 1_000_100.0, 1_000_102.5])
    health = check_daemon("127.0.0.1", port_of(cuzk), 2.0, session, lambda: next(ticks))
    assert (health.at, health.started_at) == (1_000_000.0, 994_975.0)
    slow = check_daemon("127.0.0.1", port_of(cuzk), 2.0, session, lambda: next(ticks))
    assert slow.up and slow.uptime_s == 5025.0 and slow.started_at is None
    many = check_many({"a": ("127.0.0.1", port_of(cuzk))}, 2.0, clock=lambda: 2_000_000.0)
    assert many["a"].started_at == 1_994_975.0
    assert DaemonHealth(True, 5.0, "", at=None).started_at is None
    assert DaemonHealth(True, None, "no uptime", at=10.0).started_at is None


def test_connection_refused_is_down_with_the_reason(session: requests.Session) -> None:
    port = dead_port()
    health = check_daemon("127.0.0.1", port, 2.0, session)
    assert not health.up and health.uptime_s is None
    assert health.detail == f"cannot connect to 127.0.0.1:{port}: Connection refused"


@pytest.mark.parametrize("mode", ["hang", "stall-body"])
def test_a_daemon_that_does_not_answer_in_time_is_down(
    cuzk: FakeCuzk, session: requests.Session, mode: str
) -> None:
    cuzk.mode = mode
    started = time.monotonic()
    health = check_daemon("127.0.0.1", port_of(cuzk), 0.3, session)
    assert time.monotonic() - started < 3
    assert not health.up and health.detail.startswith("timed out after 0.3s")


@pytest.mark.parametrize("mode", ["drip-body", "drip-headers"])
def test_a_daemon_that_answers_a_byte_at_a_time_is_down_within_the_bound(
    cuzk: FakeCuzk, session: requests.Session, mode: str
) -> None:
    """Each byte comes within the timeout, the answer never ends: the probe gives up on it
    after ANSWER_WITHIN timeouts instead of holding the tick for as long as the host likes."""
    cuzk.mode = mode
    started = time.monotonic()
    health = check_daemon("127.0.0.1", port_of(cuzk), 0.3, session)
    assert time.monotonic() - started < 0.3 * ANSWER_WITHIN + 1
    assert not health.up and health.uptime_s is None
    assert health.detail.startswith("timed out after 0.3s"), health.detail
    # the host still sends: no second probe (one thread a host, however long it sends)
    probes = sum(t.name == "fleetgate-probe" for t in threading.enumerate())
    again = check_daemon("127.0.0.1", port_of(cuzk), 0.3, session)
    assert not again.up and "still sending its answer to an earlier probe" in again.detail
    assert sum(t.name == "fleetgate-probe" for t in threading.enumerate()) == probes
    cuzk.mode = "ok"
    cuzk.release.set()  # it stops sending: the next probe goes out again
    deadline = time.monotonic() + 10
    while "still sending" in check_daemon("127.0.0.1", port_of(cuzk), 0.3, session).detail:
        assert time.monotonic() < deadline, "the earlier probe never ended"
        time.sleep(0.1)
    assert check_daemon("127.0.0.1", port_of(cuzk), 0.3, session).up


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("html", DaemonHealth(False, None, "/status at {} is not JSON")),
        ("list", DaemonHealth(False, None, "/status at {} is not a JSON object")),
        ("error", DaemonHealth(False, None, "HTTP 503 from {}/status")),
        ("no-uptime", DaemonHealth(True, None, "/status at {} has no numeric uptime_secs")),
        ("inf", DaemonHealth(True, None, "/status at {} has no numeric uptime_secs")),
        ("negative", DaemonHealth(True, None, "/status at {} has a negative uptime_secs")),
    ],
)
def test_answers_that_are_not_a_status(
    cuzk: FakeCuzk, session: requests.Session, mode: str, expected: DaemonHealth
) -> None:
    cuzk.mode = mode
    netloc = f"127.0.0.1:{port_of(cuzk)}"
    health = check_daemon("127.0.0.1", port_of(cuzk), 2.0, session)
    assert health == DaemonHealth(expected.up, None, expected.detail.format(netloc))


@pytest.mark.parametrize(
    ("ports", "expected"),
    [
        ({"9821/tcp": [{"HostIp": "0.0.0.0", "HostPort": "40123"}]}, 40123),
        (
            {
                "9821/tcp": [
                    {"HostIp": "::", "HostPort": "40999"},
                    {"HostIp": "0.0.0.0", "HostPort": "40124"},
                ]
            },
            40124,
        ),  # fmt: skip
        ({"9821/tcp": [{"HostIp": "::", "HostPort": "40999"}]}, 40999),
        ({"9821": [{"HostPort": 41000}]}, 41000),
        ({"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "40001"}]}, None),
        ({"9821/tcp": None}, None),
        ({"9821/tcp": []}, None),
        ({"9821/tcp": [{"HostIp": "0.0.0.0", "HostPort": "x"}, "junk"]}, None),
        ({"9821/tcp": [{"HostIp": "0.0.0.0", "HostPort": "70000"}]}, None),
        (None, None),
        ([], None),
    ],
)
def test_mapped_port(ports: Any, expected: int | None) -> None:
    assert mapped_port(ports, 9821) == expected


def test_status_target_from_a_vast_instance() -> None:
    inst = {"public_ipaddr": " 203.0.113.9 ",
            "ports": {"9821/tcp": [{"HostIp": "0.0.0.0", "HostPort": "40123"}]}}  # fmt: skip
    assert status_target(inst) == ("203.0.113.9", 40123)
    assert status_target({**inst, "public_ipaddr": None}) is None
    assert status_target({**inst, "ports": {}}) is None


def test_check_many_checks_a_large_fleet_concurrently(cuzk: FakeCuzk) -> None:
    cuzk.delay_s = 0.2
    up, down = port_of(cuzk), dead_port()
    targets = {f"i-{n}": ("127.0.0.1", up if n % 5 else down) for n in range(50)}
    started = time.monotonic()
    result = check_many(targets, timeout_s=2.0, max_workers=16)
    elapsed = time.monotonic() - started
    assert set(result) == set(targets)
    assert [k for k, h in result.items() if not h.up] == [f"i-{n}" for n in range(0, 50, 5)]
    assert all(h.uptime_s == 5025.0 for h in result.values() if h.up)
    assert cuzk.hits == 40
    assert elapsed < 4.0, f"50 checks of 0.2 s took {elapsed:.1f}s: not concurrent"
    assert check_many({}, timeout_s=1.0) == {}


def test_check_many_uses_the_session_it_is_given(cuzk: FakeCuzk) -> None:
    with requests.Session() as s:
        s.headers["User-Agent"] = "fleetgate-health-test"
        result = check_many({"a": ("127.0.0.1", port_of(cuzk))}, timeout_s=2.0, session=s)
        assert result["a"].up and cuzk.agents == ["fleetgate-health-test"]

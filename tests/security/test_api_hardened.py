"""The HTTP APIs are exposed input: what a caller without the token can make the controller do
is bounded, and no error echoes what was sent.

One test per attack, each through a real uvicorn server on loopback (`api.Server`). The memory
attacks run the server in a child Python so that its peak resident memory (VmHWM) is its own:
before the guard, FastAPI read and parsed the whole body before it looked at the token, so an
unauthenticated 64 MiB answer grew the process by more than the body itself.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from pydantic import SecretStr
from support import served

from controller.service.api import create_app
from controller.service.assemble import assemble
from controller.service.config import Config, parse_config
from controller.store.journal import Journal
from controller.store.records import LifecycleStore

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "operator-token-0123456789"
FLEET = "fleet-token-0123456789"
MIB = 1 << 20
MARKER = "zqxMARKERqxz"

SERVER = textwrap.dedent("""
    import sys
    from pydantic import SecretStr
    from controller.service.api import Server, create_app
    from controller.store.journal import Journal

    journal = Journal(sys.argv[1])
    esc = journal.escalations.add_escalation(
        fingerprint="fp", kind="unmatched", subject="instance:7", summary="frozen", now=100.0,
        deadline=2000.0, situation={"proposals": [], "subject": "instance:7"},
        default_action={"action": "hold", "params": {}})
    server = Server(create_app(journal, SecretStr(sys.argv[2]), clock=lambda: 500.0),
                    "127.0.0.1", 0)
    server.start()
    print(server.port, esc, flush=True)
    sys.stdin.read()  # until the test closes it
    server.stop()
""")


class Child:
    """The API served by a child Python; `peak_mib()` is its peak resident memory."""

    def __init__(self, tmp_path: Path, nofile: int | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.stderr = tmp_path / "child.err"

        def limit() -> None:  # the descriptors systemd gives a service by default
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        with self.stderr.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(tmp_path / "j.db"),
                                          TOKEN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, text=True, env=env, cwd=ROOT,
                                         preexec_fn=limit)  # fmt: skip
        assert self.proc.stdout is not None
        port, esc = self.proc.stdout.readline().split()
        self.port, self.esc = int(port), int(esc)
        self.base = f"http://127.0.0.1:{self.port}"

    def status(self, field: str) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        raise AssertionError(field)

    def peak_mib(self) -> float:
        return self.status("VmHWM")

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=20)
        self.proc.stdout.close()


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Child]:
    c = Child(tmp_path)
    try:
        requests.get(f"{c.base}/healthz", timeout=10)  # warm: the first request's imports
        requests.post(f"{c.base}/v1/escalations/{c.esc}/answer", json={"decision": "x"},
                      headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)  # fmt: skip
        yield c
    finally:
        c.close()


def upload(
    port: int,
    path: str,
    size: int,
    *,
    token: str | None = None,
    chunked: bool = False,
    stop_after: int | None = None,
) -> tuple[int | None, float]:
    """POST a JSON body of `size` bytes (declared, or chunked), reading the answer while it
    is sent; the status (None if none came) and how much of the body went out, in MiB.
    `stop_after` bytes: send no more, and wait for an answer anyway."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    got = bytearray()

    def read() -> None:
        try:
            while chunk := sock.recv(65536):
                got.extend(chunk)
        except OSError:
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    if token:
        head += f"Authorization: Bearer {token}\r\n"
    head += "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {size}\r\n"
    sent = 0
    prefix = b'{"decision": "approve", "params": {"x": "'
    try:
        sock.sendall((head + "\r\n").encode())
        while sent < size and not got and (stop_after is None or sent < stop_after):
            n = min(MIB, size - sent)
            piece = (prefix if sent == 0 else b"") + b"A" * (n - (len(prefix) if sent == 0 else 0))
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            sent += n
    except OSError:
        pass  # the server closed the connection: what a refusal does
    reader.join(timeout=10)
    sock.close()
    status = int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.1 ") else None
    return status, sent / MIB


def test_an_unauthenticated_body_is_refused_before_it_is_read(child: Child) -> None:
    """Headers and 1 KiB of a declared 16 MiB body: the answer is 401 at once, not a wait for
    the rest (the old API read the whole body first, so nothing came back)."""
    started = time.monotonic()
    status, _ = upload(child.port, f"/v1/escalations/{child.esc}/answer", 16 * MIB,
                       stop_after=1024)  # fmt: skip
    assert status == 401
    assert time.monotonic() - started < 5


def test_an_unauthenticated_64_mib_answer_costs_no_memory(child: Child) -> None:
    before = child.peak_mib()
    status, sent = upload(child.port, f"/v1/escalations/{child.esc}/answer", 64 * MIB)
    grown = child.peak_mib() - before
    assert status == 401
    assert grown < 8, f"the server grew by {grown:.1f} MiB for an unauthenticated body"
    assert sent < 64  # refused before all of it went out


def test_an_authorized_chunked_body_over_the_cap_is_413_and_never_held(child: Child) -> None:
    """No Content-Length to refuse up front: the stream is counted and cut at the cap."""
    before = child.peak_mib()
    status, _ = upload(child.port, f"/v1/escalations/{child.esc}/answer", 64 * MIB,
                       token=TOKEN, chunked=True)  # fmt: skip
    grown = child.peak_mib() - before
    assert status == 413
    assert grown < 8, f"the server grew by {grown:.1f} MiB for an over-cap body"
    # and the escalation is still pending: nothing was answered
    r = requests.get(f"{child.base}/v1/escalations/{child.esc}",
                     headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)  # fmt: skip
    assert r.json()["status"] == "pending"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[str, Journal]]:
    journal = Journal(tmp_path / "j.db")
    store = LifecycleStore(journal)
    app = create_app(journal, SecretStr(TOKEN), clock=lambda: 500.0)
    from controller.fleet.instance_api import instance_router

    app.include_router(instance_router(store, SecretStr(FLEET), lambda: 500.0))
    with served(app, journal) as base:
        yield base, journal


def test_an_instance_call_without_a_good_token_is_refused_before_its_body(
    api: tuple[str, Journal],
) -> None:
    """The instance API read a body (up to its 1 MiB cap) before it looked at the token: a
    caller without one held the request open, and the buffer, for as long as it trickled."""
    base, _ = api
    port = int(base.rsplit(":", 1)[1])
    for token in (None, "nobodys-token-0123456789"):
        started = time.monotonic()
        status, _ = upload(port, "/v1/instances/register", MIB - 4096, token=token,
                           stop_after=1024)  # fmt: skip
        assert status == 401
        assert time.monotonic() - started < 5  # at once, not after the request timed out


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_422_names_the_fields_and_never_echoes_the_input(
    api: tuple[str, Journal],
) -> None:
    base, j = api
    esc = j.escalations.add_escalation(fingerprint="fp", kind="unmatched", subject="s",
                                       summary="s", now=1.0, deadline=9e9, situation={},
                                       default_action={"action": "hold"})  # fmt: skip
    body = {"decision": f"<b>{MARKER}</b>", "by": f"<{MARKER}>", f"extra{MARKER}": 1}
    r = requests.post(f"{base}/v1/escalations/{esc}/answer", json=body, headers=auth(),
                      timeout=10)  # fmt: skip
    assert r.status_code == 422
    assert MARKER not in r.text
    fields = {tuple(e["loc"]) for e in r.json()["detail"]}
    assert ("body", "decision") in fields and ("body", "by") in fields
    assert all(set(e) == {"loc", "msg"} for e in r.json()["detail"])
    # a body that is not JSON at all, and a query parameter of the wrong type
    r = requests.post(
        f"{base}/v1/escalations/{esc}/answer",
        data=f"{{{MARKER}",
        headers={**auth(), "Content-Type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 422 and MARKER not in r.text


@pytest.mark.parametrize("bad", [str(2**63), str(2**64 + 5), "9" * 5000, "-1", "0"])
def test_ids_no_row_can_have_are_404_never_500(api: tuple[str, Journal], bad: str) -> None:
    base, _ = api
    r = requests.get(f"{base}/v1/escalations/{bad}", headers=auth(), timeout=10)
    assert r.status_code == 404, r.text
    r = requests.post(f"{base}/v1/escalations/{bad}/answer", json={"decision": "deny"},
                      headers=auth(), timeout=10)  # fmt: skip
    assert r.status_code == 404, r.text
    r = requests.post(f"{base}/v1/instances/i-1/commands/{bad}/done",
                      json={"ok": True}, headers=auth(FLEET), timeout=10)  # fmt: skip
    assert r.status_code == 404, r.text
    assert bad not in r.text


def test_an_id_without_the_token_is_401_whatever_it_is(api: tuple[str, Journal]) -> None:
    base, _ = api
    for path in (f"/v1/escalations/{2**64}", "/v1/escalations/1", "/v1/status"):
        assert requests.get(base + path, timeout=10).status_code == 401
    r = requests.post(f"{base}/v1/instances/register", json={"label": "x"}, timeout=10)
    assert r.status_code == 401


def test_every_shipped_config_binds_loopback_by_default() -> None:
    """Only a reverse proxy (TLS) should face the network: the default and every example bind
    127.0.0.1 (the old vast example served the operator API on 0.0.0.0)."""
    assert Config.model_fields["api"].default is None
    from controller.service.config import ApiSection

    assert ApiSection.model_fields["listen"].default.startswith("127.0.0.1:")
    examples = sorted((ROOT / "controller" / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        api: dict[str, Any] = (yaml.safe_load(path.read_text()) or {}).get("api") or {}
        for key in ("listen", "instance_listen"):
            if key in api:
                assert str(api[key]).startswith("127.0.0.1:"), f"{path.name}: api.{key}"


def test_operator_and_instance_apis_listen_apart(tmp_path: Path) -> None:
    """`api.instance_listen`: the instance API on its own port, where no operator route is
    served (whatever token is sent), and the operator's port serves no instance route."""
    text = """
api: {listen: "127.0.0.1:0", instance_listen: "127.0.0.1:0", token: {env: API_TOKEN}}
instances: {fleet_token: {env: FLEET_TOKEN}}
"""
    config = parse_config("apart.yaml", text, {"API_TOKEN": TOKEN, "FLEET_TOKEN": FLEET})
    app = assemble(config, state=tmp_path / "state", clock=time.time, sleep=time.sleep)
    servers = app.serve_api()
    assert servers is not None
    try:
        op = f"http://127.0.0.1:{servers.port}"
        inst = f"http://127.0.0.1:{servers.instance_port}"
        assert servers.port != servers.instance_port
        assert requests.get(f"{op}/v1/status", headers=auth(), timeout=10).status_code == 200
        for path in ("/v1/status", "/v1/escalations"):
            assert requests.get(inst + path, headers=auth(), timeout=10).status_code == 404
        # the instance route is there (it refuses a token no launch was given), and only there
        reg = {"label": "fg-1"}
        r = requests.post(f"{inst}/v1/instances/register", json=reg, headers=auth(FLEET),
                          timeout=10)  # fmt: skip
        assert r.status_code == 401 and "instance" in r.text, r.text
        r = requests.post(f"{op}/v1/instances/register", json=reg, headers=auth(FLEET),
                          timeout=10)  # fmt: skip
        assert r.status_code == 404, r.text
        assert json.loads(requests.get(f"{inst}/healthz", timeout=10).text) == {"status": "ok"}
    finally:
        servers.stop()
        app.close()


def test_a_thousand_connections_that_never_send_a_request_leave_the_api_answering(
    tmp_path: Path,
) -> None:
    """1,100 connections, each with half a request line and no token, held open: the child
    (with systemd's default 1,024 descriptors) ran out of them, nobody reached the API again
    and asyncio logged a traceback per refused accept (195 MB in 40 s). Past the limit the
    connection waiting longest for its request is closed, and the API answers."""
    c = Child(tmp_path, nofile=1024)
    held: list[socket.socket] = []
    try:
        for _ in range(1100):
            sock = socket.create_connection(("127.0.0.1", c.port), timeout=30)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never ends its headers
            held.append(sock)
        for _ in range(3):
            r = requests.get(f"{c.base}/healthz", timeout=20)
            assert r.status_code == 200 and r.json() == {"status": "ok"}
    finally:
        for sock in held:
            sock.close()
        c.close()
    assert "Too many open files" not in c.stderr.read_text()


def _half_request(port: int, source: str) -> socket.socket:
    """A connection from `source` that sends half a request line and waits."""
    sock = socket.socket()
    sock.settimeout(30)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # its headers not ended yet
    return sock


def test_one_address_over_the_limit_pushes_out_its_own_connections_not_anothers(
    tmp_path: Path,
) -> None:
    """A client on a slow link starts its request; one other address then opens 300 that
    never finish theirs. Past the limit that address's own oldest are closed, so the first
    client's request, finished after them, is answered (the oldest waiting connection of
    all, it was closed first)."""
    c = Child(tmp_path, nofile=1024)
    held: list[socket.socket] = []
    slow = _half_request(c.port, "127.0.0.3")
    try:
        for _ in range(300):
            held.append(_half_request(c.port, "127.0.0.2"))
        r = requests.get(f"{c.base}/healthz", timeout=20)  # the server has taken them all
        assert r.status_code == 200
        slow.sendall(b"\r\n")
        assert slow.recv(4096).startswith(b"HTTP/1.1 200"), "the slow client was cut off"
    finally:
        for sock in [slow, *held]:
            sock.close()
        c.close()

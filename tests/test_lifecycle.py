"""The instance API over the lifecycle store, on a real server on loopback (the store's own
contract: tests/store/test_records.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from pydantic import SecretStr
from support import journal_on

from controller.fleet.instance_api import MAX_BODY_BYTES, MAX_PUSH_LINES, instance_router
from controller.service.api import Server, create_app
from controller.store.records import MAX_LINE_CHARS, LifecycleStore

OPERATOR = "operator-answer-token"
LAUNCHED = ("C.4242", "C.77", "fg-a1", "fg-b2")  # the labels the tests' launches issued tokens to
TOKENS: dict[str, str] = {}  # label -> its instance's own token


@pytest.fixture(params=["sqlite", "postgres"])  # the API over either backend
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LifecycleStore]:
    with journal_on(request.param, tmp_path) as journal:
        yield LifecycleStore(journal)


# ---- the HTTP API ------------------------------------------------------------------------------
class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api(store: LifecycleStore) -> Iterator[tuple[str, LifecycleStore, Clock]]:
    clock = Clock(1000.0)
    app = create_app(store._j, SecretStr(OPERATOR), clock=clock)
    app.include_router(instance_router(store, None, clock))
    TOKENS.clear()
    TOKENS.update({label: store.tokens.issue(label, 900.0) for label in LAUNCHED})
    server = Server(app, "127.0.0.1", 0)
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}", store, clock
    finally:
        server.stop()


def call(
    base: str, path: str, body: Any = None, token: str | None = "own", **kw: Any
) -> requests.Response:
    """POST as an instance: with its own token (`own`: the one of the label called), `token`,
    or none."""
    if token == "own":
        label = (body or {}).get("label", "") if path == "register" else path.split("/")[0]
        token = TOKENS.get(label, "token-of-no-launch")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.post(
        f"{base}/v1/instances/{path}", json=body, headers=headers, timeout=10, **kw
    )


def test_an_instance_boots_through_the_api(api: tuple[str, LifecycleStore, Clock]) -> None:
    base, store, clock = api
    reg = call(base, "register", {"label": "C.4242", "min_rate": 10, "future_field": 1})
    assert reg.status_code == 200 and reg.json() == {"label": "C.4242", "stage": "registered"}
    clock.now = 1100.0
    assert call(base, "C.4242/params-done").json()["stage"] == "params"
    assert call(base, "C.4242/bench-done", {"rate": 13.25}).json()["stage"] == "bench"
    assert call(base, "C.4242/running").status_code == 200
    assert call(base, "C.4242/running").status_code == 200  # repeated: idempotent
    rec = store.records()["C.4242"]
    assert (rec.vast_id, rec.stage, rec.stage_at, rec.bench_rate) == (
        "4242",
        "running",
        1100,
        13.25,
    )
    back = call(base, "C.4242/params-done")
    assert back.status_code == 409 and "cannot go back" in back.json()["detail"]
    assert call(base, "nobody/params-done", token=TOKENS["C.4242"]).status_code == 403
    assert call(base, "fg-a1/params-done").status_code == 404  # launched, never registered
    assert call(base, "C.4242/bench-done", {}).status_code == 422
    assert call(base, "C.4242/bench-done", {"rate": -1}).status_code == 422
    for lie in (1e12, 1e300, 1000.5):  # a self-reported rate that would rank its host first
        assert call(base, "C.4242/bench-done", {"rate": lie}).status_code == 422
    assert store.records()["C.4242"].bench_rate == 13.25  # what it reported before stands
    assert call(base, "register", {"label": "C.77", "min_rate": 1e12}).status_code == 422


def test_heartbeat_carries_commands_and_their_results_come_back(
    api: tuple[str, LifecycleStore, Clock],
) -> None:
    base, store, clock = api
    call(base, "register", {"label": "fg-a1", "vast_id": "77"})
    cid = store.queue_command("fg-a1", "restart_daemon", now=1000.0, deadline_s=120.0)
    clock.now = 1030.0
    hb = call(base, "fg-a1/heartbeat", {"daemon_uptime_s": 3600.5, "daemon_state": "RUNNING"})
    assert hb.json() == {"commands": [{"id": cid, "command": "restart_daemon"}]}
    assert call(base, "fg-a1/heartbeat").json() == {"commands": []}  # no body is fine too
    assert store.records()["fg-a1"].last_heartbeat == 1030.0
    assert call(base, f"fg-a1/commands/{cid}/done", {"ok": True, "detail": "ok"}).json() == {
        "recorded": True
    }
    assert store.command(cid).result == {"ok": True, "detail": "ok"}  # type: ignore[union-attr]
    call(base, "register", {"label": "fg-b2"})
    other = call(base, f"fg-b2/commands/{cid}/done", {"ok": False, "detail": ""})
    assert other.status_code == 404
    assert call(base, "fg-a1/commands/999/done", {"ok": True}).status_code == 404
    assert call(base, "nobody/heartbeat", {}).status_code == 401
    assert call(base, "nobody/heartbeat", {}, token=TOKENS["fg-a1"]).status_code == 403


def test_logs_over_http_are_capped_per_push(api: tuple[str, LifecycleStore, Clock]) -> None:
    base, store, _ = api
    call(base, "register", {"label": "fg-a1"})
    ok = call(base, "fg-a1/logs", {"lines": ["boot \x1b[1mok\x1b[0m", "y" * 3000]})
    assert ok.json() == {"kept": 2}
    assert [len(x.line) for x in store.logs("fg-a1")] == [7, MAX_LINE_CHARS]
    too_many = call(base, "fg-a1/logs", {"lines": ["x"] * (MAX_PUSH_LINES + 1)})
    assert too_many.status_code == 422
    huge = call(base, "fg-a1/logs", {"lines": ["z" * (MAX_BODY_BYTES + 10)]})
    assert huge.status_code == 413
    assert call(base, "fg-b2/logs", {"lines": ["x"]}).status_code == 404  # not registered
    assert len(store.logs("fg-a1")) == 2


def test_a_chunked_body_over_the_cap_is_refused(api: tuple[str, LifecycleStore, Clock]) -> None:
    base, _, _ = api
    call(base, "register", {"label": "fg-a1"})

    def chunks() -> Iterator[bytes]:
        yield b'{"lines": ["'
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b"a" * 65536
        yield b'"]}'

    headers = {"Authorization": f"Bearer {TOKENS['fg-a1']}", "Content-Type": "application/json"}
    r = requests.post(f"{base}/v1/instances/fg-a1/logs", data=chunks(), headers=headers, timeout=10)
    assert r.status_code == 413


def test_the_instance_tokens_and_the_operator_token_are_not_interchangeable(
    api: tuple[str, LifecycleStore, Clock],
) -> None:
    base, store, _ = api
    own = TOKENS["fg-a1"]
    for token in (None, "wrong", OPERATOR, f"{own}x"):
        r = call(base, "register", {"label": "fg-a1"}, token=token)
        assert r.status_code == 401 and own not in r.text
    basic = requests.post(f"{base}/v1/instances/register", json={"label": "fg-a1"},
                          headers={"Authorization": f"Basic {own}"}, timeout=10)  # fmt: skip
    assert basic.status_code == 401
    assert store.records() == {}
    operator_api = requests.get(f"{base}/v1/status", headers={"Authorization": f"Bearer {own}"},
                                timeout=10)  # fmt: skip
    assert operator_api.status_code == 401


@pytest.mark.parametrize(
    "body",
    [
        {"label": "bad label"},
        {"label": ""},
        {"label": "x" * 101},
        {"label": "fg-a1", "vast_id": "12a"},
        {"label": "fg-a1", "min_rate": "fast"},
        {"label": "fg-a1", "host_and_port": "h" * 301},
    ],
)
def test_registration_is_validated(api: tuple[str, LifecycleStore, Clock], body: Any) -> None:
    base, store, _ = api
    assert call(base, "register", body, token=TOKENS["fg-a1"]).status_code == 422
    assert store.records() == {}


def test_a_non_json_number_is_refused(api: tuple[str, LifecycleStore, Clock]) -> None:
    base, _, _ = api
    call(base, "register", {"label": "fg-a1"})
    headers = {"Authorization": f"Bearer {TOKENS['fg-a1']}", "Content-Type": "application/json"}
    r = requests.post(f"{base}/v1/instances/fg-a1/bench-done", data=b'{"rate": NaN}',
                      headers=headers, timeout=10)  # fmt: skip
    assert r.status_code == 422


def test_a_lying_content_length_is_refused_without_reading(
    api: tuple[str, LifecycleStore, Clock],
) -> None:
    base, _, _ = api
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /v1/instances/fg-a1/logs HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {TOKENS['fg-a1']}\r\n".encode()
            + f"Content-Length: {MAX_BODY_BYTES * 100}\r\n\r\n".encode()
        )
        assert s.recv(200).startswith(b"HTTP/1.1 413")

"""The HTTP API on a real server on loopback: answers need the token and pass validation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from pydantic import SecretStr

from controller.service.api import Server, create_app
from controller.store.journal import Journal

TOKEN = "s3cret-answer-token"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[str, Journal, list[int]]]:
    journal = Journal(tmp_path / "j.db")
    answered: list[int] = []
    app = create_app(journal, SecretStr(TOKEN), clock=lambda: 500.0, on_answer=answered.append)
    server = Server(app, "127.0.0.1", 0)
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}", journal, answered
    finally:
        server.stop()
        journal.close()


def escalate(j: Journal, proposals: list[dict[str, Any]] | None = None) -> int:
    situation = {"proposals": proposals or [], "subject": "instance:7"}
    return j.escalations.add_escalation(fingerprint="fp", kind="unmatched", subject="instance:7",
                            summary="frozen", now=100.0, deadline=2000.0, situation=situation,
                            default_action={"action": "hold", "params": {}})  # fmt: skip


def post(base: str, esc: int, body: dict[str, Any], token: str | None = TOKEN) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.post(f"{base}/v1/escalations/{esc}/answer", json=body, headers=headers,
                         timeout=10)  # fmt: skip


def test_an_answer_needs_the_bearer_token(api: tuple[str, Journal, list[int]]) -> None:
    base, j, answered = api
    esc = escalate(j)
    assert post(base, esc, {"decision": "deny"}, token=None).status_code == 401
    assert post(base, esc, {"decision": "deny"}, token="wrong").status_code == 401
    assert j.escalations.escalation(esc)["status"] == "pending"  # type: ignore[index]
    assert answered == []
    assert requests.get(f"{base}/healthz", timeout=10).json() == {"status": "ok"}


def test_approve_over_http_is_validated_and_answered_once(
    api: tuple[str, Journal, list[int]],
) -> None:
    base, j, answered = api
    esc = escalate(j)
    bad = post(base, esc, {"decision": "approve", "action": "scale_to", "params": {"count": -1}})
    assert bad.status_code == 422 and "count" in bad.text
    nothing = post(base, esc, {"decision": "approve"})
    assert nothing.status_code == 422 and "--action" in nothing.text
    ok = post(base, esc, {"decision": "approve", "action": "replace", "by": "ana"})
    assert ok.status_code == 200
    assert ok.json()["answer"] == {"action": "replace", "params": {"instance": "7",
                                   "block_host": False, "reason": ""}}  # fmt: skip
    row = j.escalations.escalation(esc)
    assert (
        row and row["status"] == "approved" and row["answered_by"] == "operator"
    )  # from the credential
    assert answered == [esc]
    again = post(base, esc, {"decision": "deny"})
    assert again.status_code == 409
    assert post(base, 999, {"decision": "deny"}).status_code == 404


def test_deny_and_read_back(api: tuple[str, Journal, list[int]]) -> None:
    base, j, _ = api
    esc = escalate(j, [{"action": "reboot", "params": {"instance": "7"}, "proposer": "llm:m",
                        "confidence": 0.5, "reason": "r"}])  # fmt: skip
    headers = {"Authorization": f"Bearer {TOKEN}"}
    # who answered comes from the credential (the operator's token), not the body's "by"
    assert post(base, esc, {"decision": "deny", "by": "bob"}).json() == {
        "status": "denied",
        "by": "operator",
    }
    listed = requests.get(f"{base}/v1/escalations?status=denied", headers=headers, timeout=10)
    assert [e["id"] for e in listed.json()] == [esc]
    one = requests.get(f"{base}/v1/escalations/{esc}", headers=headers, timeout=10).json()
    assert one["answered_by"] == "operator"
    assert requests.get(f"{base}/v1/escalations", timeout=10).status_code == 401


def test_the_token_never_appears_in_responses_or_logs(
    api: tuple[str, Journal, list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    base, j, _ = api
    esc = escalate(j)
    r = post(base, esc, {"decision": "approve", "action": "hold"}, token="nope")
    assert TOKEN not in r.text
    post(base, esc, {"decision": "approve", "action": "hold"})
    assert TOKEN not in caplog.text


def test_an_escalations_own_capability_answers_it_and_nothing_else(
    api: tuple[str, Journal, list[int]],
) -> None:
    from escalation.capabilities import answer_capability

    base, j, _ = api
    first, second = escalate(j), escalate(j)
    cap = answer_capability(
        SecretStr(TOKEN),
        first,
        journal_id=j.meta.identity(),
        choice="deny",
        expires=float(j.escalations.escalation(first)["deadline"]),
    )
    assert TOKEN not in cap
    assert post(base, second, {"decision": "deny"}, token=cap).status_code == 401
    headers = {"Authorization": f"Bearer {cap}"}
    assert requests.get(f"{base}/v1/escalations", headers=headers, timeout=10).status_code == 401
    assert post(base, first, {"decision": "deny"}, token=cap).status_code == 200


def test_a_button_pressed_in_the_ntfy_web_app_reaches_the_answer_route(
    api: tuple[str, Journal, list[int]],
) -> None:
    """The ntfy web app runs a button as fetch(url, {method, headers, body}) (ntfy
    web/src/components/Notifications.jsx, performHttpAction): from its own origin, with an
    Authorization header, so the browser first sends a preflight without it. That preflight
    got 401, and the browser never sent the answer."""
    from escalation.capabilities import answer_capability

    base, j, answered = api
    esc = escalate(j, proposals=[{"action": "hold", "params": {}, "proposer": "llm"}])
    url = f"{base}/v1/escalations/{esc}/answer"
    origin = {"Origin": "https://ntfy.example.org"}
    preflight = requests.options(url, timeout=10, headers={
        **origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    })  # fmt: skip
    assert preflight.status_code == 204, preflight.text
    assert preflight.headers["Access-Control-Allow-Origin"] == "*"
    assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
    allowed = preflight.headers["Access-Control-Allow-Headers"].lower()
    assert "authorization" in allowed and "content-type" in allowed
    assert "Access-Control-Allow-Credentials" not in preflight.headers
    assert answered == [] and j.escalations.escalation(esc)["status"] == "pending"  # type: ignore[index]

    deadline = float(j.escalations.escalation(esc)["deadline"])  # type: ignore[index]
    cap = answer_capability(SecretStr(TOKEN), esc, journal_id=j.meta.identity(), choice="deny",
                            expires=deadline)  # fmt: skip
    refused = requests.post(url, json={"decision": "approve"}, timeout=10,
                            headers={**origin, "Authorization": f"Bearer {cap}"})  # fmt: skip
    assert refused.status_code == 403 and refused.headers["Access-Control-Allow-Origin"] == "*"
    nobody = requests.post(url, json={"decision": "deny"}, headers=origin, timeout=10)
    assert nobody.status_code == 401 and nobody.headers["Access-Control-Allow-Origin"] == "*"
    pressed = requests.post(url, json={"decision": "deny"}, timeout=10,
                            headers={**origin, "Authorization": f"Bearer {cap}"})  # fmt: skip
    assert pressed.status_code == 200 and pressed.headers["Access-Control-Allow-Origin"] == "*"
    assert j.escalations.escalation(esc)["status"] == "denied"  # type: ignore[index]

    # no other route is opened to other origins, nor answered without its token
    asking = {**origin, "Access-Control-Request-Method": "GET"}
    for other in (f"{base}/v1/escalations", f"{base}/v1/escalations/{esc}", f"{base}/v1/status"):
        r = requests.options(other, headers=asking, timeout=10)
        assert r.status_code == 401 and "Access-Control-Allow-Origin" not in r.headers
        r = requests.get(other, headers={**origin, "Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers

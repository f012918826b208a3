"""The generic webhook channel against a real local receiver."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from fakes.receiver import Receiver
from pydantic import SecretStr

from escalation.channels.base import ChannelError
from escalation.channels.http import HttpClient
from escalation.channels.webhook import WebhookChannel
from escalation.notify import Notifier
from escalation.render import Renderer

from .helpers import render_for, send

PATH = "/hooks/8f3a-secret-path"


def channel(url: str, http: HttpClient) -> WebhookChannel:
    return WebhookChannel(
        SecretStr(url + PATH), {"X-Hook-Token": SecretStr("h00k-t0ken")}, http=http
    )


def test_the_body_is_the_escalation_with_the_ways_to_answer(
    rx: Receiver, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    send(channel(rx.url, http), esc, how)
    [request] = rx.requests
    assert request.path == PATH
    assert request.headers["X-Hook-Token"] == "h00k-t0ken"
    body = request.json
    assert set(body) == {
        "id", "kind", "subject", "summary", "fingerprint", "created_at", "deadline",
        "proposals", "default_action", "how", "message",
    }  # fmt: skip
    assert (body["id"], body["kind"], body["subject"]) == (12, "unmatched", "instance:10007")
    assert (body["created_at"], body["deadline"]) == (esc["created_at_iso"], esc["deadline_iso"])
    assert body["proposals"] == esc["proposals"]
    assert body["default_action"] == esc["default_action"]
    assert body["how"] == how
    assert body["message"] == Renderer().render("message.txt.j2", esc=esc, how=how)
    assert "Approve:  fleetgate escalations approve 12\n" in body["message"]
    assert "Deny:     fleetgate escalations deny 12\n" in body["message"]
    assert f"Deadline: {esc['deadline_iso']}" in body["message"]


def test_awkward_text_survives_the_json(
    rx: Receiver, http: HttpClient, make_esc: Any, how: dict[str, Any]
) -> None:
    summary = 'quote " backslash \\ newline\n tab\t </script> é 🚀'
    send(channel(rx.url, http), make_esc(summary=summary), how)
    assert rx.requests[0].json["summary"] == summary


def test_503_503_200_is_delivered(
    rx: Receiver, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    rx.script([503, 503, 200])
    send(channel(rx.url, http), esc, how)
    assert len(rx.requests) == 3
    assert rx.requests[0].json == rx.requests[2].json


def test_400_is_a_channel_error_at_once_without_secrets(
    rx: Receiver,
    http: HttpClient,
    esc: dict[str, Any],
    how: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    rx.script([400])
    with caplog.at_level(logging.INFO), pytest.raises(ChannelError) as caught:
        send(channel(rx.url, http), esc, how)
    assert str(caught.value).startswith(
        f"channel 'webhook': escalation 12: POST {rx.url}/…: HTTP 400 Bad Request"
    )
    assert len(rx.requests) == 1
    for text in (str(caught.value), caplog.text):
        assert "secret" not in text and "h00k" not in text


def test_a_closed_port_is_a_channel_error_without_secrets(
    closed_url: str,
    http: HttpClient,
    esc: dict[str, Any],
    how: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO), pytest.raises(ChannelError, match="refused") as caught:
        send(channel(closed_url, http), esc, how)
    for text in (str(caught.value), caplog.text):
        assert "secret" not in text and "h00k" not in text


def test_the_secrets_are_not_in_the_repr(http: HttpClient) -> None:
    text = repr(channel("http://127.0.0.1:9", http))
    assert "secret" not in text and "h00k" not in text


def test_an_operator_template_can_reshape_the_body(
    tmp_path: Path, rx: Receiver, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    (tmp_path / "webhook.json.j2").write_text('{"text": {{ esc.summary | tojson }}}')
    hook = channel(rx.url, http)
    [delivery] = Notifier([hook], Renderer(tmp_path)).deliver(esc, how)
    assert delivery.ok
    assert rx.requests[0].json == {"text": esc["summary"]}


def test_a_template_that_is_not_json_is_a_channel_error(
    tmp_path: Path, rx: Receiver, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    (tmp_path / "webhook.json.j2").write_text('{"text": {{ esc.summary }}}')  # no tojson
    hook = channel(rx.url, http)
    [delivery] = Notifier([hook], Renderer(tmp_path)).deliver(esc, how)
    assert not delivery.ok
    assert "template 'webhook.json.j2' did not produce JSON" in delivery.detail
    assert rx.requests == []
    assert render_for(hook, esc, how).startswith("{")

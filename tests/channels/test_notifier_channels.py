"""The Notifier with several real channels, one of them broken: the others still deliver."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from fakes.receiver import Receiver
from pydantic import SecretStr

from escalation.channels.base import Channel
from escalation.channels.http import HttpClient
from escalation.channels.ntfy import NtfyChannel
from escalation.channels.pagerduty import PagerDutyChannel
from escalation.channels.slack import SlackChannel
from escalation.channels.webhook import WebhookChannel
from escalation.notify import Notifier
from escalation.render import Renderer


def test_one_broken_channel_does_not_stop_the_others(
    rx: Receiver,
    closed_url: str,
    http: HttpClient,
    esc: dict[str, Any],
    how: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    channels: list[Channel] = [
        WebhookChannel(SecretStr(rx.url + "/hook"), http=http),
        SlackChannel(SecretStr(closed_url + "/services/T0/B0/s3cr3t"), http=http),  # down
        NtfyChannel(rx.url, "fleet-topic", answer_token=SecretStr("api-token"), http=http),
        PagerDutyChannel(SecretStr("R0UTINGKEY"), rx.url + "/v2/enqueue", http=http),
    ]
    with caplog.at_level(logging.INFO):
        deliveries = Notifier(channels, Renderer()).deliver(esc, how)
    assert [(d.channel, d.ok) for d in deliveries] == [
        ("webhook", True), ("slack", False), ("ntfy", True), ("pagerduty", True),
    ]  # fmt: skip
    assert deliveries[1].detail.startswith(f"channel 'slack': escalation 12: POST {closed_url}/…")
    assert "Connection refused" in deliveries[1].detail
    assert [r.path for r in rx.requests] == ["/hook", "/", "/v2/enqueue"]
    assert rx.requests[0].json["message"] == Renderer().render("message.txt.j2", esc=esc, how=how)
    assert rx.requests[1].json["message"].startswith(esc["summary"])  # the phone's short one
    assert rx.requests[1].json["actions"][0]["url"] == how["answer_url"]
    assert "escalation #12: 'slack': channel 'slack'" in caplog.text
    for secret in ("s3cr3t", "R0UTINGKEY", "api-token", "fleet-topic"):
        assert secret not in caplog.text and all(secret not in d.detail for d in deliveries)


def test_a_json_template_that_fails_to_render_fails_only_its_channel(
    tmp_path: Path, rx: Receiver, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    (tmp_path / "slack.json.j2").write_text("{{ esc.no_such_field | tojson }}")
    slack = SlackChannel(SecretStr(rx.url + "/services/x"), http=http)
    hook = WebhookChannel(SecretStr(rx.url + "/hook"), http=http)
    deliveries = Notifier([slack, hook], Renderer(tmp_path)).deliver(esc, how)
    # The Notifier's built-in text is not JSON: a JSON channel says so instead of posting it.
    assert [(d.channel, d.ok) for d in deliveries] == [("slack", False), ("webhook", True)]
    assert "template 'slack.json.j2' did not produce JSON" in deliveries[0].detail
    assert [r.path for r in rx.requests] == ["/hook"]

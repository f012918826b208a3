"""The PagerDuty channel: Events API v2 trigger and resolve, to a real local receiver."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fakes.receiver import Receiver
from pydantic import SecretStr

from escalation.channels.base import ChannelError
from escalation.channels.http import HttpClient
from escalation.channels.pagerduty import PagerDutyChannel, dedup_key

from .helpers import VIEW_URL, send

KEY = SecretStr("R0UTINGKEY0123456789abcdef012345")


def pd(rx_url: str, http: HttpClient, **kw: Any) -> PagerDutyChannel:
    return PagerDutyChannel(KEY, rx_url + "/v2/enqueue", http=http, **kw)


def test_trigger_then_resolve_with_the_same_dedup_key(
    rx: Receiver, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    rx.default = 202
    channel = pd(rx.url, http, severity="critical")
    send(channel, esc, how)
    channel.resolve({"id": 12, "fingerprint": esc["fingerprint"], "status": "approved"})
    trigger, resolve = (r.json for r in rx.requests)
    assert [r.path for r in rx.requests] == ["/v2/enqueue", "/v2/enqueue"]
    assert trigger["routing_key"] == KEY.get_secret_value()
    assert trigger["event_action"] == "trigger"
    assert trigger["dedup_key"] == "fleetgate-12-1a2b3c4d5e6f7a8b" == dedup_key(esc)
    payload = trigger["payload"]
    assert payload["summary"] == (
        "[fleetgate] #12 unmatched instance:10007: Instance 10007 is frozen and no rule covers it."
    )
    assert (payload["source"], payload["severity"]) == ("instance:10007", "critical")
    assert (payload["class"], payload["timestamp"]) == ("unmatched", esc["created_at_iso"])
    details = payload["custom_details"]
    assert details["approve"] == "fleetgate escalations approve 12"
    assert details["deny"] == "fleetgate escalations deny 12"
    assert details["approve_http"] == how["approve_http"]
    assert details["deadline"] == esc["deadline_iso"]
    assert details["if_no_answer"] == esc["default_action"]
    assert details["proposals"] == esc["proposals"]
    assert "Approve:  fleetgate escalations approve 12\n" in details["message"]
    assert trigger["links"][0]["href"] == VIEW_URL  # a GET page, not the POST-only answer
    assert resolve == {
        "routing_key": KEY.get_secret_value(),
        "event_action": "resolve",
        "dedup_key": "fleetgate-12-1a2b3c4d5e6f7a8b",
        "client": "fleetgate",
    }


def test_the_summary_is_capped_and_links_need_an_answer_url(
    rx: Receiver, http: HttpClient, make_esc: Any, how: dict[str, Any]
) -> None:
    del how["answer_url"], how["approve_http"], how["deny_http"], how["view_url"]
    send(pd(rx.url, http), make_esc(summary="x" * 5000), how)
    trigger = rx.requests[0].json
    assert len(trigger["payload"]["summary"]) == 1024
    assert trigger["payload"]["severity"] == "warning"
    assert trigger["links"] == []
    assert "approve_http" not in trigger["payload"]["custom_details"]


def test_503_503_then_accepted_is_delivered(
    rx: Receiver, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    rx.script([503, 503, 202])
    send(pd(rx.url, http), esc, how)
    assert len(rx.requests) == 3


def test_400_is_a_channel_error_at_once_that_hides_the_routing_key(
    rx: Receiver,
    http: HttpClient,
    esc: dict[str, Any],
    how: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    rx.script([400])
    rx.body = (
        f'{{"status": "invalid event", "message": "unknown key {KEY.get_secret_value()}"}}'.encode()
    )
    with caplog.at_level(logging.INFO), pytest.raises(ChannelError) as caught:
        send(pd(rx.url, http), esc, how)
    assert str(caught.value).startswith(
        f"channel 'pagerduty': escalation 12: trigger: POST {rx.url}/…: HTTP 400 Bad Request"
    )
    assert "unknown key ***" in str(caught.value)
    assert len(rx.requests) == 1
    for text in (str(caught.value), caplog.text, repr(pd(rx.url, http))):
        assert KEY.get_secret_value() not in text


def test_a_closed_port_fails_trigger_and_resolve(
    closed_url: str, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    channel = pd(closed_url, http)
    with pytest.raises(ChannelError, match="trigger: POST .*Connection refused"):
        send(channel, esc, how)
    with pytest.raises(ChannelError, match="resolve: POST .*Connection refused"):
        channel.resolve(esc)


def test_resolve_needs_the_id_and_fingerprint(http: HttpClient) -> None:
    with pytest.raises(
        ChannelError, match="escalation 12: resolve: .*lacks an id or a fingerprint"
    ):
        pd("http://127.0.0.1:1", http).resolve({"id": 12})
    with pytest.raises(ValueError, match="severity must be one of"):
        PagerDutyChannel(KEY, severity="fatal")  # type: ignore[arg-type]

"""The ntfy channel: a JSON publish with Approve/Deny buttons, to a real local receiver."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from fakes.receiver import Receiver
from pydantic import SecretStr

from escalation.capabilities import answer_capability
from escalation.channels.base import ChannelError
from escalation.channels.http import HttpClient
from escalation.channels.ntfy import MAX_MESSAGE_BYTES, NtfyChannel, cap_bytes
from escalation.render import Renderer

from .helpers import ANSWER_URL, VIEW_URL, send

API_TOKEN = SecretStr("api-t0ken-never-in-messages")
ACCESS = SecretStr("tk_ntfyaccesstoken")
TOPIC = "fleet-7f1c9e2ab4"


def ntfy(url: str, http: HttpClient, **kw: Any) -> NtfyChannel:
    kw.setdefault("answer_token", API_TOKEN)
    return NtfyChannel(url, TOPIC, ACCESS, 5, http=http, **kw)


def test_the_publish_carries_topic_title_message_priority_tags(
    rx: Receiver, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    send(ntfy(rx.url, http), esc, how)
    [request] = rx.requests
    assert request.path == "/"  # JSON publishing goes to the root URL
    assert request.headers["Authorization"] == "Bearer tk_ntfyaccesstoken"
    body = request.json
    assert body["topic"] == TOPIC
    assert body["title"] == "Escalation #12: unmatched on instance:10007"
    assert body["priority"] == 5
    assert body["tags"] == ["rotating_light", "fleetgate", "unmatched"]
    # a phone gets it short: the situation, the proposal, deadline and default, budget, answers
    assert body["message"] == (
        "Instance 10007 is frozen and no rule covers it.\n"
        "Proposed: replace_instance instance=10007 (by llm:qwen, confidence 0.42): frozen for "
        "20 min after a reboot\n"
        f"Deadline {esc['deadline_iso']}, then: hold\n"
        "Budget left: spend_left_per_h=5.5 launches_left_1h=3\n"
        f"Open: {VIEW_URL}\n"
        "Answer: fleetgate escalations approve 12 | fleetgate escalations deny 12"
    )
    assert body["click"] == VIEW_URL  # tapping it opens the escalation's page
    assert len(body["message"].splitlines()) <= 8
    assert len(Renderer().render("message.txt.j2", esc=esc, how=how).splitlines()) > 20


def test_the_buttons_post_the_decision_to_the_answer_url_with_a_capability(
    rx: Receiver, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    esc = dict(esc, journal_id="j1", deadline=1_700_000_000.0)
    send(ntfy(rx.url, http), esc, how)
    body = rx.requests[0].json

    def bearer(choice: str) -> str:  # one escalation of one journal, one choice, its deadline
        return "Bearer " + answer_capability(API_TOKEN, 12, journal_id="j1", choice=choice,
                                             expires=1_700_000_000)  # fmt: skip

    assert bearer("approve") != bearer("deny")
    assert body["actions"] == [
        {
            "action": "http",
            "label": label,
            "url": ANSWER_URL,
            "method": "POST",
            "headers": {"Authorization": bearer(decision), "Content-Type": "application/json"},
            "body": json.dumps({"decision": decision}),
            "clear": True,
        }
        for label, decision in (("Approve", "approve"), ("Deny", "deny"))
    ]
    assert API_TOKEN.get_secret_value() not in rx.requests[0].body.decode()


def test_without_a_proposal_there_is_no_approve_button(
    rx: Receiver, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    """A bare approve runs the proposal the message showed: with none, the button always
    came back 422 (a button may not name an action)."""
    esc = dict(esc, journal_id="j1", deadline=1_700_000_000.0, proposals=[])
    send(ntfy(rx.url, http), esc, how)
    assert [a["label"] for a in rx.requests[0].json["actions"]] == ["Deny"]


def test_no_answer_url_means_no_buttons(
    rx: Receiver, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    del how["answer_url"]
    send(ntfy(rx.url, http), esc, how)
    body = rx.requests[0].json
    assert "actions" not in body
    assert "fleetgate escalations approve 12" in body["message"]


def test_no_answer_token_means_no_buttons(
    rx: Receiver, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    send(ntfy(rx.url, http, answer_token=None), esc, how)
    assert "actions" not in rx.requests[0].json


def test_a_long_message_is_cut_to_ntfy_size(
    rx: Receiver, http: HttpClient, make_esc: Any, how: dict[str, Any]
) -> None:
    how = dict(how, approve_cli="fleetgate escalations approve 12 " + "é" * 4000)
    send(ntfy(rx.url, http), make_esc(), how)
    message = rx.requests[0].json["message"]
    assert len(message.encode()) <= MAX_MESSAGE_BYTES
    assert message.endswith("(cut; the full message is in the other channels)")
    assert cap_bytes("short", 10) == "short"


def test_503_503_200_is_delivered(
    rx: Receiver, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    rx.script([503, 503, 200])
    send(ntfy(rx.url, http), esc, how)
    assert len(rx.requests) == 3


def test_errors_and_logs_hold_no_token_topic_or_capability(
    rx: Receiver,
    http: HttpClient,
    esc: dict[str, Any],
    how: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    esc = dict(esc, journal_id="j1", deadline=1_700_000_000.0)
    capability = answer_capability(
        API_TOKEN, 12, journal_id="j1", choice="approve", expires=1_700_000_000
    )
    rx.script([503, 400])  # a server that echoes what it got
    rx.body = json.dumps(
        {"error": f"bad {TOPIC} {ACCESS.get_secret_value()} {capability}"}
    ).encode()
    with caplog.at_level(logging.INFO), pytest.raises(ChannelError, match="HTTP 400") as caught:
        send(ntfy(rx.url, http), esc, how)
    for text in (str(caught.value), caplog.text):
        for secret in (TOPIC, ACCESS.get_secret_value(), API_TOKEN.get_secret_value(), capability):
            assert secret not in text
    assert "bad *** *** ***" in str(caught.value)


def test_a_closed_port_is_a_channel_error(
    closed_url: str, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    with pytest.raises(ChannelError, match=r"channel 'ntfy': escalation 12: POST .*refused"):
        send(ntfy(closed_url, http), esc, how)


def test_bad_settings_are_refused(http: HttpClient) -> None:
    with pytest.raises(ValueError, match="priority must be 1 .* got 6"):
        NtfyChannel("http://127.0.0.1:1", TOPIC, priority=6)
    with pytest.raises(ValueError, match="topic must not be empty"):
        NtfyChannel("http://127.0.0.1:1", "")
    assert "tk_" not in repr(ntfy("http://127.0.0.1:1", http)) and TOPIC not in repr(
        ntfy("http://127.0.0.1:1", http)
    )


def test_a_topic_ntfy_refuses_is_refused_before_anything_is_sent(http: HttpClient) -> None:
    """ntfy takes a topic of 1 to 64 letters, digits, - and _, and never one of its own paths:
    it answered every publish to another one with 400, so nobody heard of any escalation."""
    for topic, why in (
        ("fleet.ops", r"got 9 characters, with '\.'"),
        ("fleet/ops", r"with '/'"),
        ("ops alerts!", r"with ' !'"),
        ("x" * 65, r"got 65 characters\Z"),
        ("docs", r"'docs' is one of ntfy's own paths"),
        ("v1", r"'v1' is one of ntfy's own paths"),
    ):
        with pytest.raises(ValueError, match=why) as caught:
            NtfyChannel("https://ntfy.example.org", topic, http=http)
        assert "letters, digits, - and _" in str(caught.value) or "own paths" in str(caught.value)
    for topic in ("x" * 64, "Fleet_ops-2", "Docs"):
        NtfyChannel("https://ntfy.example.org", topic, http=http)


def test_a_url_that_names_a_topic_is_refused_without_quoting_it(http: HttpClient) -> None:
    """Posted to https://ntfy.example.org/<topic>, ntfy published the JSON itself as the text of
    a plain notification (no title, priority or buttons), and answered 200."""
    for url in (f"https://ntfy.example.org/{TOPIC}", f"https://ntfy.example.org/x/{TOPIC}/"):
        with pytest.raises(ValueError, match="without a path: the topic goes in `topic`") as caught:
            NtfyChannel(url, TOPIC, http=http)
        assert TOPIC not in str(caught.value)
    for url in ("https://ntfy.example.org", "https://ntfy.example.org/", "http://127.0.0.1:80"):
        NtfyChannel(url, TOPIC, http=http)

"""The Slack channel: a Block Kit payload from slack.json.j2, posted to a real local receiver."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from fakes.receiver import Receiver
from pydantic import SecretStr

from escalation.channels.base import ChannelError
from escalation.channels.http import HttpClient
from escalation.channels.slack import SlackChannel
from escalation.render import Renderer

from .helpers import render_for, send

PATH = "/services/T0AAA/B0BBB/s3cr3tW3bh00k"


def slack(base: str, http: HttpClient) -> SlackChannel:
    return SlackChannel(SecretStr(base + PATH), http=http)


def test_the_payload_has_text_and_the_expected_blocks(
    rx: Receiver, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    send(slack(rx.url, http), esc, how)
    [request] = rx.requests
    assert request.path == PATH
    payload = request.json
    assert set(payload) == {"text", "blocks"}
    assert payload["text"].startswith("ESCALATION #12 unmatched instance:10007: Instance 10007")
    assert "approve: fleetgate escalations approve 12" in payload["text"]
    blocks = payload["blocks"]
    assert [b["type"] for b in blocks] == [
        "header", "section", "section", "section", "divider", "context",
    ]  # fmt: skip
    header, summary, evidence, proposal, _, context = blocks
    assert header["text"] == {
        "type": "plain_text",
        "text": "Escalation #12: unmatched on instance:10007",
    }
    assert summary["text"]["text"].startswith("Instance 10007 is frozen and no rule covers it.")
    assert 'type=instance id=10007 status=frozen label="fg a1"' in evidence["text"]["text"]
    assert "reboot instance=10007 by rule:frozen-reboot: ok" in evidence["text"]["text"]
    assert (
        "1. `replace_instance instance=10007` (by llm:qwen, confidence 0.42)"
        in (proposal["text"]["text"])
    )
    approve, deny, deadline = (e["text"] for e in context["elements"])
    assert approve.startswith("*Approve:* `fleetgate escalations approve 12` or `curl -X POST")
    assert deny.startswith("*Deny:* `fleetgate escalations deny 12` or `curl -X POST")
    assert deadline.startswith(f"*Deadline:* {esc['deadline_iso']}; if nobody answers")
    assert 'the controller will `hold reason="nobody answered"`' in deadline


def test_without_a_proposal_it_says_how_to_name_an_action(
    rx: Receiver, http: HttpClient, make_esc: Any, how: dict[str, Any]
) -> None:
    del how["approve_http"], how["deny_http"]
    send(slack(rx.url, http), make_esc(proposals=[]), how)
    blocks = rx.requests[0].json["blocks"]
    assert blocks[3]["text"]["text"] == "*Proposed*\nno proposal"
    assert blocks[5]["elements"][0]["text"] == (
        "*Approve:* `fleetgate escalations approve 12 --action NAME`"
    )


def test_untrusted_text_cannot_ping_or_link_and_stays_within_limits(
    rx: Receiver, http: HttpClient, make_esc: Any, how: dict[str, Any]
) -> None:
    facts = [{"label": f'<!channel> <https://evil.example|click> & "{i}"'} for i in range(12)]
    esc = make_esc(facts=facts, subject="instance:" + "9" * 300, summary="<!here> " * 1000)
    send(slack(rx.url, http), esc, how)
    payload = rx.requests[0].json
    raw = json.dumps(payload)
    assert "<!channel>" not in raw and "<!here>" not in raw and "<https://" not in raw
    assert "&lt;!channel&gt; &lt;https://evil.example|click&gt; &amp;" in raw
    assert "... and 2 more" in payload["blocks"][2]["text"]["text"]
    assert len(payload["blocks"][0]["text"]["text"]) <= 150
    assert all(len(b["text"]["text"]) <= 3000 for b in payload["blocks"] if "text" in b)
    assert len(payload["text"]) <= 3000


def test_untrusted_text_cannot_close_the_evidence_code_block(
    rx: Receiver, http: HttpClient, make_esc: Any, how: dict[str, Any]
) -> None:
    """Slack has no escape for a backtick: a label holding ``` closed the evidence's code
    block, and what followed it was formatted as Slack's own text (bold, a fake heading)."""
    label = "x```\n*Approved by ops, nothing to do*\n```"
    send(slack(rx.url, http), make_esc(facts=[{"label": label}], summary="a `span` too"), how)
    payload = rx.requests[0].json
    evidence = payload["blocks"][2]["text"]["text"]
    assert evidence.count("```") == 2  # the template's own block, opened and closed once
    assert "x\u02cb\u02cb\u02cb" in evidence
    assert "`" not in payload["blocks"][1]["text"]["text"].split("*Fleet:*")[0]


def test_503_503_200_is_delivered(
    rx: Receiver, http: HttpClient, sleeps: list[float], esc: dict[str, Any], how: dict[str, Any]
) -> None:
    rx.script([503, 503, 200])
    send(slack(rx.url, http), esc, how)
    assert len(rx.requests) == 3 and sleeps == [0.25, 0.5]


def test_400_is_a_channel_error_at_once_that_hides_the_webhook(
    rx: Receiver,
    http: HttpClient,
    esc: dict[str, Any],
    how: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    rx.script([400])
    rx.body, rx.content_type = b"invalid_payload", "text/plain"
    with caplog.at_level(logging.INFO), pytest.raises(ChannelError) as caught:
        send(slack(rx.url, http), esc, how)
    assert str(caught.value) == (
        f"channel 'slack': escalation 12: POST {rx.url}/…: HTTP 400 Bad Request: invalid_payload"
    )
    assert len(rx.requests) == 1
    assert "s3cr3t" not in caplog.text and "T0AAA" not in caplog.text


def test_a_closed_port_is_a_channel_error_that_hides_the_webhook(
    closed_url: str,
    http: HttpClient,
    esc: dict[str, Any],
    how: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="escalation"), pytest.raises(ChannelError) as caught:
        send(slack(closed_url, http), esc, how)
    assert "Connection refused" in str(caught.value)
    for text in (str(caught.value), caplog.text, repr(slack(closed_url, http))):
        assert "s3cr3t" not in text and "services" not in text


def test_a_template_that_renders_broken_json_is_a_channel_error(
    tmp_path: Path, rx: Receiver, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    (tmp_path / "slack.json.j2").write_text('{"text": "{{ esc.summary }}", "blocks": []}\n')
    channel = slack(rx.url, http)
    text = Renderer(tmp_path).render("slack.json.j2", esc={**esc, "summary": 'say "hi"'}, how=how)
    with pytest.raises(ChannelError, match=r"template 'slack\.json\.j2' did not produce JSON"):
        channel.send(esc, text)
    with pytest.raises(ChannelError, match=r"wrong or missing 'blocks' \(missing\)"):
        channel.send(esc, '{"text": "only text"}')
    assert rx.requests == []
    assert json.loads(render_for(channel, esc, how))["blocks"]


def test_the_summary_carries_why_people_the_fleet_the_budget_and_the_page(
    rx: Receiver, http: HttpClient, make_esc: Any, how: dict[str, Any]
) -> None:
    esc = make_esc(routing="the LLM answered replace_instance, but its confidence 0.42 is low")
    send(slack(rx.url, http), esc, how)
    summary = rx.requests[0].json["blocks"][1]["text"]["text"]
    assert "*Why you:* the LLM answered replace_instance, but its confidence 0.42 is low" in summary
    assert "*Fleet:* `running=10 frozen=1 spend_per_h=4.5 pending_tasks=30`" in summary
    assert "*Budget left:* `spend_left_per_h=5.5 launches_left_1h=3`" in summary
    assert f"<{how['view_url']}|open escalation #12>" in summary


def test_a_long_reason_cuts_the_summary_never_its_link_to_the_page(
    rx: Receiver, http: HttpClient, make_esc: Any, how: dict[str, Any]
) -> None:
    """The block's cut at Slack's 3,000 characters took the page's link off the end."""
    esc = make_esc(routing="the LLM wrote " + "words " * 500)
    send(slack(rx.url, http), esc, how)
    summary = rx.requests[0].json["blocks"][1]["text"]["text"]
    assert len(summary) <= 2900 and "…" in summary
    assert summary.endswith(f"<{how['view_url']}|open escalation #12>"), summary[-200:]

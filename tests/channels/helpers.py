"""Helpers for the channel tests: a sample escalation, and rendering as the Notifier does."""

from __future__ import annotations

import time
from typing import Any

from escalation.channels.base import Channel, template_for
from escalation.render import Renderer, iso8601

ANSWER_URL = "http://127.0.0.1:8080/v1/escalations/12/answer"


def sample_esc(now: float | None = None, **changes: Any) -> dict[str, Any]:
    """An escalation as channels receive it; raised `now` (real time by default), due in 30 min."""
    now = time.time() if now is None else now
    esc: dict[str, Any] = {
        "id": 12,
        "kind": "unmatched",
        "subject": "instance:10007",
        "summary": "Instance 10007 is frozen and no rule covers it.",
        "fingerprint": "1a2b3c4d5e6f7a8b",
        "created_at_iso": iso8601(now),
        "deadline_iso": iso8601(now + 1800),
        "default_action": {"action": "hold", "params": {"reason": "nobody answered"}},
        "proposals": [
            {
                "action": "replace_instance",
                "params": {"instance": "10007"},
                "proposer": "llm:qwen",
                "confidence": 0.42,
                "reason": "frozen for 20 min after a reboot",
            }
        ],
        "facts": [{"type": "instance", "id": "10007", "status": "frozen", "label": "fg a1"}],
        "recent_actions": [
            {
                "at": now - 600,
                "action": "reboot",
                "params": {"instance": "10007"},
                "status": "ok",
                "proposer": "rule:frozen-reboot",
            }
        ],
        "fleet": {"running": 10, "frozen": 1, "spend_per_h": 4.5, "pending_tasks": 30},
        "budget": {"spend_left_per_h": 5.5, "launches_left_1h": 3},
        "allowed_actions": ["hold", "reboot", "replace_instance"],
    }
    esc.update(changes)
    return esc


def render_for(channel: Channel, esc: dict[str, Any], how: dict[str, Any]) -> str:
    """The text the Notifier would hand this channel."""
    return Renderer().render(template_for(channel), esc=esc, how=how)


def send(channel: Channel, esc: dict[str, Any], how: dict[str, Any]) -> None:
    channel.send(esc, render_for(channel, esc, how))

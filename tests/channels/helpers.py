"""Helpers for the channel tests: a sample escalation, and rendering as the Notifier does."""

from __future__ import annotations

import time
from typing import Any

import support

from escalation.channels.base import Channel, template_for
from escalation.render import Renderer

ANSWER_URL = "http://127.0.0.1:8080/v1/escalations/12/answer"
VIEW_URL = "http://127.0.0.1:8080/escalations/12"  # a GET page: what links open


def sample_esc(now: float | None = None, **changes: Any) -> dict[str, Any]:
    """The shared sample, raised `now` (real time by default: alerts must end in the future)."""
    raised = time.time() if now is None else now
    # what the router adds for buttons: the journal's identity and the deadline (epoch)
    changes = {"journal_id": "journal-1", "deadline": raised + 1800, **changes}
    return support.sample_esc(raised, **changes)


def render_for(channel: Channel, esc: dict[str, Any], how: dict[str, Any]) -> str:
    """The text the Notifier would hand this channel."""
    return Renderer().render(template_for(channel), esc=esc, how=how)


def send(channel: Channel, esc: dict[str, Any], how: dict[str, Any]) -> None:
    channel.send(esc, render_for(channel, esc, how))

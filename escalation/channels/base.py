"""The channel seam: what every human notification channel implements.

A channel is one module with one class. It gets the escalation (a plain dict, the same `esc`
the templates see) and the text already rendered for it, and delivers that somewhere. A new
channel (webhook, Slack, SMTP, ntfy, PagerDuty, Alertmanager) is one module here and one entry
in the Notifier's list; nothing else changes.

Channels must NOT render templates themselves (the Notifier renders, once per template), decide
whether to escalate, retry for long, or swallow failures: a failed delivery raises ChannelError
and the Notifier records it. A channel that needs its own template (an email, a Slack payload)
names it in a `template` class attribute; otherwise it gets DEFAULT_TEMPLATE. A notice (a message
that asks nothing, escalation.notify) is rendered from its `notice_template`, else notice.txt.j2;
a channel with `resolve` (it pages) gets no notices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

DEFAULT_TEMPLATE = "message.txt.j2"


class ChannelError(Exception):
    """A channel could not deliver an escalation; the message says which channel and where."""


@dataclass(frozen=True)
class Delivery:
    """The outcome of sending one escalation to one channel, to be stored, not only logged."""

    channel: str
    ok: bool
    detail: str = ""


class Channel(Protocol):
    """Something that delivers a rendered escalation to people.

    Optional: `resolve(esc: dict[str, Any]) -> None`, called when an escalation is answered or
    expires, for channels whose far end keeps an open item (a PagerDuty incident, an
    Alertmanager alert) that should end then. `esc` holds at least id, fingerprint, kind and
    subject (a journal row will do), and from the outbox also `status` and `ended` (how it
    ended, in words: escalation.notify.ended); failures raise ChannelError. Channels without it are
    skipped. It is not a protocol member, so channels without it still fit the protocol: call
    it as `getattr(channel, "resolve", None)`.
    """

    name: str

    def send(self, esc: dict[str, Any], text: str) -> None:
        """Deliver `text` (rendered for `esc`); raise ChannelError on failure."""
        ...


def template_for(channel: Channel) -> str:
    """The template a channel's text is rendered from: its `template` attribute, if any."""
    name = getattr(channel, "template", DEFAULT_TEMPLATE)
    return name if isinstance(name, str) and name else DEFAULT_TEMPLATE

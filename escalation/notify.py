"""Deliver one escalation to every human channel, recording each outcome.

The seam between "an escalation needs people" and the channels: the caller (approvals) hands in
the escalation dict and the ways to answer it, gets one Delivery per channel back and stores
them. This module must NOT decide whether to escalate (situation.should_escalate does), store
anything, retry, or let one channel's failure stop another.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from escalation.channels.base import Channel, ChannelError, Delivery, template_for
from escalation.render import Renderer, RenderError

log = logging.getLogger(__name__)

SUMMARY_TEMPLATE = "console_line.txt.j2"


class Notifier:
    """Sends an escalation to a fixed list of channels.

    deliver():
    1. Log the one-line summary (console_line.txt.j2) so the log shows every escalation.
    2. Render each template the channels need once (message.txt.j2 unless a channel names
       another). A template that fails still lets people hear: they get a built-in plain text
       and the delivery detail says why.
    3. Send to each channel in order. ChannelError, or any other exception, becomes
       Delivery(ok=False, detail=...) and the next channel is tried.
    4. Log each outcome with the escalation id; return the deliveries for the caller to store.
    """

    def __init__(self, channels: Sequence[Channel], renderer: Renderer) -> None:
        self.channels = list(channels)
        self.renderer = renderer

    def deliver(self, esc: dict[str, Any], how: dict[str, Any]) -> list[Delivery]:
        esc_id = esc.get("id")
        log.warning("%s", self.summary_line(esc, how))
        texts: dict[str, tuple[str, str]] = {}  # template -> (text, render problem or "")
        deliveries: list[Delivery] = []
        for channel in self.channels:
            template = template_for(channel)
            if template not in texts:
                texts[template] = self._render(template, esc, how)
            text, problem = texts[template]
            delivery = _send(channel, esc, text, problem)
            if delivery.ok:
                log.info("escalation #%s: delivered via %r", esc_id, delivery.channel)
            else:
                log.error("escalation #%s: %r: %s", esc_id, delivery.channel, delivery.detail)
            deliveries.append(delivery)
        return deliveries

    def summary_line(self, esc: dict[str, Any], how: dict[str, Any]) -> str:
        """The one-line summary of an escalation, from console_line.txt.j2 (or a fallback)."""
        try:
            return self.renderer.render(SUMMARY_TEMPLATE, esc=esc, how=how).rstrip("\n")
        except RenderError as exc:
            log.error("escalation #%s: %s", esc.get("id"), exc)
            return fallback_text(esc, how, str(exc)).splitlines()[0]

    def _render(self, template: str, esc: dict[str, Any], how: dict[str, Any]) -> tuple[str, str]:
        try:
            return self.renderer.render(template, esc=esc, how=how), ""
        except RenderError as exc:
            log.error("escalation #%s: %s; sending the built-in text", esc.get("id"), exc)
            return fallback_text(esc, how, str(exc)), f"(built-in text: {exc})"


def _send(channel: Channel, esc: dict[str, Any], text: str, problem: str) -> Delivery:
    name = str(getattr(channel, "name", type(channel).__name__))
    try:
        channel.send(esc, text)
    except ChannelError as exc:
        return Delivery(channel=name, ok=False, detail=str(exc))
    except Exception as exc:  # a broken channel must not silence the others
        log.exception("escalation #%s: channel %r raised unexpectedly", esc.get("id"), name)
        return Delivery(channel=name, ok=False, detail=f"{type(exc).__name__}: {exc}")
    return Delivery(channel=name, ok=True, detail=problem)


def fallback_text(esc: dict[str, Any], how: dict[str, Any], problem: str) -> str:
    """Plain text for when a template cannot be rendered: enough to answer the escalation."""
    default = esc.get("default_action") or {}
    return (
        f"ESCALATION #{esc.get('id', '?')} {esc.get('kind', '?')} {esc.get('subject', '?')}:"
        f" {esc.get('summary', '?')}\n"
        f"(the message template failed: {problem})\n"
        f"approve: {how.get('approve_cli', '?')}\n"
        f"deny: {how.get('deny_cli', '?')}\n"
        f"deadline: {esc.get('deadline_iso', '?')}, then: {default.get('action', '?')}"
        f" {default.get('params', {})!r}\n"
    )

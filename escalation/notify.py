"""Deliver one escalation, or one notice, to every human channel, recording each outcome.

The seam between "an escalation needs people" and the channels: the caller (approvals) hands in
the escalation dict and the ways to answer it, gets one Delivery per channel back and stores
them. This module must NOT decide whether to escalate (situation.should_escalate does), store
anything, retry, or let one channel's failure stop another.

A notice tells people something and asks nothing: what a `notify` action (a rule's, or the
LLM's answer) wants them to know, or that the guards trimmed, vetoed or voided a person's
approved answer. `notify_notice` and `answer_notice` make one from a decision (pure); the
outbox queues it and `Notifier.notice` delivers it, from `notice*.j2`, to every channel but
those that page (they keep an incident per escalation: a notice is none). `ended` says in
words how an escalation ended, for the "already done" of the same situation raised again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from controller.core.model import Decision
from escalation.channels.base import Channel, ChannelError, Delivery, template_for
from escalation.render import Renderer, RenderError, format_kv, iso8601

log = logging.getLogger(__name__)

SUMMARY_TEMPLATE = "console_line.txt.j2"
NOTICE_TEMPLATE = "notice.txt.j2"  # a channel's own: its `notice_template` attribute


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

    def deliver(self, esc: dict[str, Any], how: dict[str, Any], again: bool = False
                ) -> list[Delivery]:  # fmt: skip
        """`again`: a retry for the channels that failed (the summary line was logged at the
        first try; a log read by people does not repeat it at each retry)."""
        esc_id = esc.get("id")
        if again:
            names = ", ".join(repr(getattr(c, "name", "?")) for c in self.channels)
            log.info("escalation #%s: sending again to %s", esc_id, names)
        else:
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

    def notice(self, notice: dict[str, Any], how: dict[str, Any], journal_id: str = ""
               ) -> list[Delivery]:  # fmt: skip
        """Send a notice (`notify_notice`, `answer_notice`) to each channel that takes one;
        a channel that pages gets a Delivery(ok=True) saying it was left out."""
        esc = notice_esc(notice, journal_id)
        log.warning("notice%s: %s", f" (escalation #{esc['id']})" if esc["id"] else "",
                    esc["summary"])  # fmt: skip
        texts: dict[str, tuple[str, str]] = {}
        out: list[Delivery] = []
        for channel in self.channels:
            name = str(getattr(channel, "name", type(channel).__name__))
            if getattr(channel, "resolve", None) is not None:
                out.append(Delivery(name, True, "not sent: it pages for escalations only"))
                continue
            template = notice_template_for(channel)
            if template not in texts:
                texts[template] = self._render_notice(template, esc, how)
            text, problem = texts[template]
            out.append(_send(channel, esc, text, problem))
        return out

    def _render_notice(self, template: str, esc: dict[str, Any], how: dict[str, Any]
                       ) -> tuple[str, str]:  # fmt: skip
        try:
            return self.renderer.render(template, esc=esc, notice=esc["notice"], how=how), ""
        except RenderError as exc:
            log.error("notice: %s; sending the built-in text", exc)
            return f"NOTICE: {esc['summary']}\n{esc['notice']['text']}\n", f"(built-in: {exc})"

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


def notice_template_for(channel: Channel) -> str:
    name = getattr(channel, "notice_template", NOTICE_TEMPLATE)
    return name if isinstance(name, str) and name else NOTICE_TEMPLATE


def notice_esc(notice: dict[str, Any], journal_id: str = "") -> dict[str, Any]:
    """A notice as channels receive it: the keys every channel reads (kind `notice`)."""
    esc_id = notice.get("escalation_id")
    return {
        "id": esc_id, "kind": "notice", "subject": str(notice.get("subject") or "fleet"),
        "summary": str(notice.get("title") or notice["text"]).splitlines()[0][:300],
        "fingerprint": str(notice.get("fingerprint") or ""),
        "created_at_iso": iso8601(float(notice.get("at", 0.0))), "deadline_iso": None,
        "proposals": [], "default_action": None, "notice": notice, "journal_id": journal_id,
    }  # fmt: skip


def notify_notice(d: Decision, action_id: int, now: float) -> tuple[str, dict[str, Any]]:
    """The notice a carried-out `notify` action sends: (its source, the notice)."""
    p = d.proposal
    message = str(d.effective_params.get("message", ""))
    about = f" about escalation #{p.escalation_id}" if p.escalation_id is not None else ""
    return f"action:{action_id}", {
        "about": "notify", "escalation_id": p.escalation_id, "subject": p.target,
        "title": f"{p.proposer} wants you to know{about}: {' '.join(message.split())}"[:300],
        "text": message, "from": p.proposer, "reason": p.reason, "action_id": action_id,
        "at": now,
    }  # fmt: skip


def llm_notice(esc_id: int, subject: str, proposal: dict[str, Any], now: float
               ) -> dict[str, Any]:  # fmt: skip
    """The notice an LLM's `notify` answer sends (the escalation stays open for people)."""
    message = str((proposal.get("params") or {}).get("message", ""))
    return {
        "about": "notify", "escalation_id": esc_id, "subject": subject,
        "title": f"{proposal.get('proposer')} wants you to know about escalation #{esc_id}: "
        f"{' '.join(message.split())}"[:300],
        "text": message, "from": proposal.get("proposer"), "reason": proposal.get("reason"),
        "confidence": proposal.get("confidence"), "at": now,
    }  # fmt: skip


def answer_notice(d: Decision, action_id: int, now: float) -> tuple[str, dict[str, Any]] | None:
    """The follow-up for a person whose approved answer the guards vetoed, trimmed or found
    nothing to do for: (its source, the notice); None when it ran as approved."""
    p = d.proposal
    if p.escalation_id is None or not p.proposer.startswith("human:"):
        return None
    asked = _act(p.action, p.params)
    if d.verdict == "veto":
        what = f"{asked} was vetoed by {d.guard or 'the guards'}"
    elif d.verdict == "noop":
        what = f"{asked} did nothing"
    elif d.verdict == "act" and d.guard:
        what = f"{asked} became {_changed(d)} by {d.guard}"
    else:
        return None
    who = p.proposer.removeprefix("human:")
    title = f"your approval of escalation #{p.escalation_id} ({who}): {what}"
    return "guarded", {
        "about": "guarded", "escalation_id": p.escalation_id, "subject": p.target,
        "title": title[:300], "text": f"{title}. The guards said: {d.why}", "from": "guards",
        "approver": who, "verdict": d.verdict, "guard": d.guard, "action_id": action_id,
        "asked": {"action": p.action, "params": p.params},
        "done": {"action": d.effective_action, "params": d.effective_params}, "at": now,
    }  # fmt: skip


def _act(action: str, params: dict[str, Any]) -> str:
    return f"{action} {format_kv(params)}" if params else action


def _changed(d: Decision) -> str:
    """What ran instead, as little as says it: `count=3`, or the whole action."""
    p = d.proposal
    if d.effective_action != p.action:
        return _act(d.effective_action, d.effective_params)
    diff = {k: v for k, v in d.effective_params.items() if p.params.get(k) != v}
    return format_kv(diff) if diff else _act(d.effective_action, d.effective_params)


def ended(row: dict[str, Any]) -> str:
    """How an escalation (a journal row) ended, in words."""
    status, by = str(row.get("status")), str(row.get("answered_by") or "")
    who = by.removeprefix("human:") or "?"
    answer = row.get("answer") or {}
    asked = _act(str(answer["action"]), answer.get("params") or {}) if "action" in answer else ""
    default = row.get("default_action") or {}
    if status == "expired":
        return "nobody answered before the deadline; the default ran: " + _act(
            str(default.get("action", "hold")), default.get("params") or {}
        )
    if status == "denied":
        return f"denied by {who}"
    if status == "resolved":
        return "cleared: the situation no longer held" if by == "controller" else f"closed by {who}"
    if status == "pending":
        return "still waiting for an answer"
    done = {"approved": "not carried out yet", "executed": "carried out",
            "failed": "carried out, and it failed", "vetoed": "vetoed by the guards",
            "void": "nothing left to do",
            "interrupted": "the controller stopped while carrying it out (it may not have "
                           "happened; not carried out again)"}.get(status, status)  # fmt: skip
    return f"approved by {who}: {asked or '?'}; {done}"


def earlier_entries(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Earlier escalations of a situation as "already done" entries (the keys of a recent
    action, and `escalation`: its id), oldest first."""
    return [{"at": float(r["created_at"]), "action": "escalation", "params": {"id": r["id"]},
             "status": ended(r), "proposer": str(r.get("answered_by") or "nobody"),
             "escalation": int(r["id"])} for r in rows]  # fmt: skip

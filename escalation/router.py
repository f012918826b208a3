"""From doubts to escalations: situation, fingerprint, dedup, journal, responders, channels.

1. build a Situation from each doubt (facts sanitized, recent actions on its subject, the
   fleet and budget summary, the allowed actions, the default action `hold`);
2. skip it while the same fingerprint is pending, or was raised within the dedup window;
3. journal it (pending, with a deadline);
4. offer it to the responders in order (the seam for an LLM; none yet): a responder may
   attach a proposal, which humans then see;
5. deliver it to every human channel and store each delivery's outcome.

`resolve_cleared` closes pending escalations whose situation no longer holds.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from controller.actions import ACTIONS
from controller.decide import Doubt
from controller.journal import Journal
from controller.model import Proposal
from escalation.notify import Notifier
from escalation.render import iso8601
from escalation.situation import Situation, fingerprint, sanitize_fact, should_escalate, to_dict

log = logging.getLogger(__name__)

HOLD = {"action": "hold", "params": {"reason": "no answer before the deadline"}}


class Responder(Protocol):
    """Reads a situation first and may propose an action (the LLM, in a later release)."""

    def consider(self, situation: Situation) -> Proposal | None: ...


def proposal_dict(p: Proposal) -> dict[str, Any]:
    return {
        "action": p.action,
        "params": p.params,
        "proposer": p.proposer,
        "confidence": p.confidence,
        "reason": p.reason,
    }


class Escalator:
    def __init__(
        self,
        journal: Journal,
        notifier: Notifier,
        *,
        window_s: float,
        deadline_s: float,
        cli_prefix: str = "fleetgate",
        responders: Sequence[Responder] = (),
    ) -> None:
        self.journal = journal
        self.notifier = notifier
        self.window_s = window_s
        self.deadline_s = deadline_s
        self.cli_prefix = cli_prefix
        self.responders = list(responders)

    def situation(
        self, doubt: Doubt, fleet: dict[str, Any], budget: dict[str, Any], now: float
    ) -> Situation:
        recent = self.journal.recent_for(doubt.subject, now - 3600)
        return Situation(
            kind=doubt.kind, subject=doubt.subject, summary=doubt.summary,  # type: ignore[arg-type]
            facts=tuple(sanitize_fact(f) for f in doubt.facts), key=dict(doubt.key),
            proposals=tuple(proposal_dict(p) for p in doubt.proposals),
            recent_actions=tuple(recent), fleet=dict(fleet), budget=dict(budget),
            allowed_actions=tuple(ACTIONS), default_action=HOLD, created_at=now,
        )  # fmt: skip

    def raise_all(
        self, doubts: Sequence[Doubt], fleet: dict[str, Any], budget: dict[str, Any], now: float
    ) -> list[int]:
        """Steps 1-5 for each doubt; returns the ids of the escalations raised (not deduped)."""
        raised = []
        for doubt in doubts:
            s = self.situation(doubt, fleet, budget, now)
            fp = fingerprint(s)
            last = self.journal.last_escalation(fp)
            if last and (
                last["status"] == "pending"
                or not should_escalate(float(last["created_at"]), now, self.window_s)
            ):
                continue
            for responder in self.responders:
                answer = responder.consider(s)
                if answer is not None:
                    s = replace(s, proposals=(proposal_dict(answer), *s.proposals))
                    break
            esc_id = self.journal.add_escalation(
                fingerprint=fp, kind=s.kind, subject=s.subject, summary=s.summary, now=now,
                deadline=now + self.deadline_s, situation=to_dict(s), default_action=HOLD,
            )  # fmt: skip
            self._deliver(esc_id, s, fp, now)
            raised.append(esc_id)
        return raised

    def resolve_cleared(
        self, doubts: Sequence[Doubt], fleet: dict[str, Any], now: float
    ) -> list[int]:
        """Close pending escalations whose situation no longer holds (nothing left to answer)."""
        current = {fingerprint(self.situation(d, fleet, {}, now)) for d in doubts}
        closed = []
        for esc in self.journal.escalations(status="pending"):
            if esc["fingerprint"] in current:
                continue
            note = {"note": "the situation no longer holds"}
            if self.journal.answer(
                int(esc["id"]), status="resolved", by="controller", now=now, answer=note
            ):
                log.info("escalation #%s resolved: %s no longer holds", esc["id"], esc["subject"])
                closed.append(int(esc["id"]))
        return closed

    def how(self, esc_id: int) -> dict[str, str]:
        return {
            "approve_cli": f"{self.cli_prefix} escalations approve {esc_id}",
            "deny_cli": f"{self.cli_prefix} escalations deny {esc_id}",
        }

    def _deliver(self, esc_id: int, s: Situation, fp: str, now: float) -> None:
        esc = dict(
            to_dict(s),
            id=esc_id,
            fingerprint=fp,
            created_at_iso=iso8601(now),
            deadline_iso=iso8601(now + self.deadline_s),
        )
        for d in self.notifier.deliver(esc, self.how(esc_id)):
            self.journal.add_delivery(esc_id, d.channel, now, d.ok, d.detail)

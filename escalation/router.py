"""From doubts to escalations: situation, fingerprint, dedup, journal, the LLM, people.

For each doubt:

1. build a Situation (facts sanitized, recent actions on its subject, the fleet and budget
   summary, the allowed actions, the default action `hold`);
2. skip it while the same fingerprint is pending or approved, or was raised within the dedup
   window (`held_back`), unless it cleared since, or it asks to approve an action again after
   the last approval was acted on;
3. journal it (pending, with a deadline);
4. if an LLM reader is configured (and the situation is not one the operator reserved for
   people), ask it; its answer acts when its confidence is at or above the threshold and its
   action is on `act` autonomy: the escalation is approved by `llm:<model>` and the action runs
   through the guards on the next tick; every call, valid or not, is journaled with the
   prompt's digest;
5. otherwise deliver it to every human channel, with the LLM's proposal and rationale and why
   it came to people, and store each delivery's outcome.

`resolve_cleared` closes pending escalations whose situation no longer holds; `closed` tells
the channels that keep open alerts (PagerDuty, Alertmanager) that one was answered.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from controller.core.actions import ACTIONS
from controller.core.decide import Doubt
from controller.core.model import Proposal
from controller.core.policy import Gate
from controller.store.journal import Journal
from escalation.notify import Notifier
from escalation.render import iso8601
from escalation.situation import Situation, fingerprint, sanitize_fact, should_escalate, to_dict

log = logging.getLogger(__name__)

HOLD = {"action": "hold", "params": {"reason": "no answer before the deadline"}}
PEOPLE_ONLY = frozenset({"approval"})  # the operator asked a person to approve these


class Reader(Protocol):
    """The LLM client as the router uses it (escalation.llm.LLMClient)."""

    model: str

    def decide(self, situation: Situation, targets: Collection[str]) -> Any: ...


@dataclass(frozen=True)
class Routed:
    """What the LLM made of a situation: act on `proposal`, or tell people `why`."""

    acted: bool
    why: str
    proposal: dict[str, Any] | None = None


def proposal_dict(p: Proposal) -> dict[str, Any]:
    return {"action": p.action, "params": p.params, "proposer": p.proposer,
            "confidence": p.confidence, "reason": p.reason}  # fmt: skip


class Escalator:
    def __init__(
        self,
        journal: Journal,
        notifier: Notifier,
        *,
        window_s: float,
        deadline_s: float,
        cli_prefix: str = "fleetgate",
        gate: Gate | None = None,
        reader: Reader | None = None,
        answer_url: str | None = None,
    ) -> None:
        self.journal = journal
        self.notifier = notifier
        self.window_s = window_s
        self.deadline_s = deadline_s
        self.cli_prefix = cli_prefix
        self.gate = gate or Gate()
        self.reader = reader
        self.answer_url = answer_url  # the HTTP API's base URL, when it is served

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
        self,
        doubts: Sequence[Doubt],
        fleet: dict[str, Any],
        budget: dict[str, Any],
        now: float,
        targets: Collection[str] = (),
    ) -> list[int]:
        """Steps 1-5 for each doubt; returns the ids of the escalations raised (not deduped)."""
        raised = []
        for doubt in doubts:
            s = self.situation(doubt, fleet, budget, now)
            fp = fingerprint(s)
            last = self.journal.last_escalation(fp)
            if last and held_back(str(last["status"]), s.kind, float(last["created_at"]), now,
                                  self.window_s):  # fmt: skip
                continue
            esc_id = self.journal.add_escalation(
                fingerprint=fp, kind=s.kind, subject=s.subject, summary=s.summary, now=now,
                deadline=now + self.deadline_s, situation=to_dict(s), default_action=HOLD,
            )  # fmt: skip
            raised.append(esc_id)
            routed = self._read(esc_id, s, doubt, targets, now)
            if routed.acted and routed.proposal is not None:
                self.journal.answer(
                    esc_id,
                    status="approved",
                    by=routed.proposal["proposer"],
                    now=now,
                    answer=routed.proposal,
                )
                log.info("escalation #%d: %s", esc_id, routed.why)
                continue
            if routed.proposal is not None:
                shown = dict(
                    routed.proposal,
                    reason=f"{routed.proposal['reason']} — sent to people because {routed.why}",
                )
                s = replace(s, proposals=(shown, *s.proposals))
            self._deliver(esc_id, s, fp, now, routed.why)
        return raised

    def _read(
        self, esc_id: int, s: Situation, doubt: Doubt, targets: Collection[str], now: float
    ) -> Routed:
        """Step 4: ask the LLM, journal the call, decide whether its answer may act."""
        if self.reader is None:
            return Routed(False, "no LLM reader is configured")
        if s.kind in PEOPLE_ONLY or doubt.people_only:
            return Routed(False, f"{s.kind} situations go to people")
        from escalation.llm import LLMError  # the client is optional: import only when used

        model = self.reader.model
        try:
            answer = self.reader.decide(s, targets)
        except LLMError as exc:
            status = _status_of(exc)
            self.journal.add_llm_call(escalation_id=esc_id, now=now, model=model, status=status,
                                      error=str(exc)[:1000], routed="people")  # fmt: skip
            return Routed(False, f"the LLM gave no usable answer ({status}: {exc})")
        routed = self._route(answer, model)
        self.journal.add_llm_call(
            escalation_id=esc_id, now=now, model=model, status="ok",
            prompt_digest=answer.prompt_digest, action=answer.action, params=answer.params,
            confidence=answer.confidence, rationale=answer.rationale, tokens=answer.tokens,
            latency_ms=round(answer.latency_s * 1000, 1),
            routed="act" if routed.acted else "people",
        )  # fmt: skip
        return routed

    def _route(self, answer: Any, model: str) -> Routed:
        if answer.action is None:
            return Routed(False, f"the LLM handed it to people: {answer.rationale}")
        proposal = {"action": answer.action, "params": answer.params, "proposer": f"llm:{model}",
                    "confidence": answer.confidence, "reason": answer.rationale}  # fmt: skip
        g = self.gate
        if answer.confidence < g.confidence_threshold:
            return Routed(
                False,
                f"the LLM's confidence {answer.confidence:.2f} is below the "
                f"threshold {g.confidence_threshold:.2f}",
                proposal,
            )
        mode = dict(g.actions).get(answer.action, g.mode)
        if mode != "act":
            return Routed(False, f"autonomy for {answer.action!r} is {mode}", proposal)
        return Routed(
            True,
            f"llm:{model} answered {answer.action} with confidence "
            f"{answer.confidence:.2f}; it runs through the guards",
            proposal,
        )

    def resolve_cleared(self, doubts: Sequence[Doubt], fleet: dict[str, Any], now: float
                        ) -> list[int]:  # fmt: skip
        """Close pending escalations whose situation no longer holds (nothing left to answer)."""
        current = {fingerprint(self.situation(d, fleet, {}, now)) for d in doubts}
        closed = []
        for esc in self.journal.escalations(status="pending"):
            if esc["fingerprint"] in current:
                continue
            note = {"note": "the situation no longer holds"}
            if self.journal.answer(int(esc["id"]), status="resolved", by="controller", now=now,
                                   answer=note):  # fmt: skip
                log.info("escalation #%s resolved: %s no longer holds", esc["id"], esc["subject"])
                self.closed(int(esc["id"]))
                closed.append(int(esc["id"]))
        return closed

    def closed(self, esc_id: int) -> None:
        """An escalation was answered, expired or resolved: end the channels' open alerts."""
        esc = self.journal.escalation(esc_id)
        if esc is None:
            return
        message = self._esc_dict(esc_id, esc["situation"], esc["fingerprint"], esc["created_at"])
        for channel in self.notifier.channels:
            resolve = getattr(channel, "resolve", None)
            if resolve is None:
                continue
            try:
                resolve(message)
            except Exception as exc:  # noqa: BLE001 - a broken channel never blocks the others
                log.error("escalation #%d: %s could not close its alert: %s", esc_id,
                          getattr(channel, "name", "?"), exc)  # fmt: skip

    def how(self, esc_id: int) -> dict[str, str]:
        how = {"approve_cli": f"{self.cli_prefix} escalations approve {esc_id}",
               "deny_cli": f"{self.cli_prefix} escalations deny {esc_id}"}  # fmt: skip
        if self.answer_url:
            url = f"{self.answer_url.rstrip('/')}/v1/escalations/{esc_id}/answer"
            how["answer_url"] = url
            how["approve_http"] = (
                f"curl -X POST -H 'Authorization: Bearer $FLEETGATE_API_TOKEN' "
                f'-d \'{{"decision": "approve"}}\' {url}'
            )
            how["deny_http"] = (
                f"curl -X POST -H 'Authorization: Bearer $FLEETGATE_API_TOKEN' "
                f'-d \'{{"decision": "deny"}}\' {url}'
            )

        return how

    def _esc_dict(self, esc_id: int, situation: dict[str, Any], fp: str, created: float
                  ) -> dict[str, Any]:  # fmt: skip
        return dict(
            situation,
            id=esc_id,
            fingerprint=fp,
            created_at_iso=iso8601(created),
            deadline_iso=iso8601(created + self.deadline_s),
        )

    def _deliver(self, esc_id: int, s: Situation, fp: str, now: float, why: str) -> None:
        esc = self._esc_dict(esc_id, to_dict(s), fp, now)
        esc["routing"] = why
        for d in self.notifier.deliver(esc, self.how(esc_id)):
            self.journal.add_delivery(esc_id, d.channel, now, d.ok, d.detail)


def _status_of(exc: Exception) -> str:
    name = type(exc).__name__
    return {"LLMUnavailable": "unavailable", "LLMBudgetExceeded": "budget",
            "LLMInvalidAnswer": "invalid"}.get(name, "error")  # fmt: skip


# An escalation in these states holds its situation back: it waits on people (pending), its
# answer runs next tick (approved); nobody answered, or people said no, within the window.
_WAITING = ("pending", "approved")
_QUIET_FOR_A_WINDOW = ("expired", "denied")
# An approval asks "may this be done now?": once it was carried out or refused by the guards
# (executed, vetoed, failed, void), the rule proposing it again is a new request.
_REQUESTS = ("approval", "low_confidence")


def held_back(status: str, kind: str, raised_at: float, now: float, window_s: float) -> bool:
    """Whether the last escalation of a situation keeps it from being raised again now.

    One that cleared (resolved) is over: the same situation again is a new occurrence (a
    second outage) and is raised at once; so is a request to approve an action once the
    previous one was acted on (a drained instance whose destroy needs approving too). Any
    other situation an answer acted on is left a window for the action to take effect."""
    if status in _WAITING:
        return True
    if status == "resolved" or (kind in _REQUESTS and status not in _QUIET_FOR_A_WINDOW):
        return False
    return not should_escalate(raised_at, now, window_s)

"""From doubts to escalations: situation, fingerprint, dedup, journal, the outbox.

For each doubt, in the tick:

1. build a Situation (facts sanitized, recent actions on its subject, the fleet and budget
   summary, the allowed actions, the default action `hold`);
2. skip it while the same fingerprint is pending or approved, or was raised within the dedup
   window (`held_back`), unless it cleared since, or it asks to approve an action again after
   the last approval was acted on;
3. journal it (pending, with a deadline) and, in the same transaction, queue a
   `read_and_deliver` job in the outbox (controller/store/outbox.py) with the targets the LLM
   may name, or already routed to people when the situation is one the operator reserved for
   them (or no LLM is configured).

The outbox worker (escalation/outbox.py) does the rest off the tick, through `read`,
`approve` and `deliver` here: if an LLM reader is configured, ask it; its answer acts when its
confidence is at or above the threshold and its action is on `act` autonomy (the escalation is
approved by `llm:<model>` and the action runs through the guards on the next tick); every
call, valid or not, is journaled with the prompt's digest. Otherwise it goes to every human
channel, with the LLM's proposal and rationale and why it came to people, and each delivery's
outcome is stored.

`resolve_cleared` closes pending escalations whose situation no longer holds; `closed` queues
a `resolve` job, for the channels that keep open alerts (PagerDuty, Alertmanager). After each
write `after_write(now)` runs when set: the simulator works the outbox there and then (so a
replay is the same run after run), `fleetgate run` wakes its worker thread.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from controller.core.actions import ACTIONS
from controller.core.decide import Doubt
from controller.core.model import Proposal
from controller.core.policy import Gate
from controller.store.journal import Journal
from controller.store.outbox import READ_AND_DELIVER, RESOLVE, OutboxStore
from escalation.channels.base import Channel, Delivery
from escalation.notify import Notifier
from escalation.render import iso8601
from escalation.situation import Situation, fingerprint, sanitize_fact, should_escalate, to_dict

log = logging.getLogger(__name__)

HOLD = {"action": "hold", "params": {"reason": "no answer before the deadline"}}
PEOPLE_ONLY = frozenset({"approval"})  # the operator asked a person to approve these
FRESH_MAX = 1000  # situations kept as raised, for the worker of this process


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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, d: dict[str, Any]) -> Routed:
        return cls(bool(d["acted"]), str(d["why"]), d.get("proposal"))


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
        jobs: OutboxStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.journal = journal
        self.notifier = notifier
        self.window_s = window_s
        self.deadline_s = deadline_s
        self.cli_prefix = cli_prefix
        self.gate = gate or Gate()
        self.reader = reader
        self.answer_url = answer_url  # the HTTP API's base URL, when it is served
        self.jobs = jobs if jobs is not None else OutboxStore(journal.store)
        self.clock = clock  # the controller's: when `closed` queues a job
        self.after_write: Callable[[float], object] | None = None
        # raised here, not yet taken by a worker (popped from its thread: atomic operations)
        self.fresh: OrderedDict[int, Situation] = OrderedDict()

    def situation(
        self, doubt: Doubt, fleet: dict[str, Any], budget: dict[str, Any], now: float
    ) -> Situation:
        recent = self.journal.actions.recent_for(doubt.subject, now - 3600)
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
        """Steps 1-3 for each doubt; returns the ids of the escalations raised (not deduped)."""
        raised = []
        for doubt in doubts:
            s = self.situation(doubt, fleet, budget, now)
            fp = fingerprint(s)
            last = self.journal.escalations.last_escalation(fp)
            if last and held_back(str(last["status"]), s.kind, float(last["created_at"]), now,
                                  self.window_s):  # fmt: skip
                continue
            routed = self._unread(s, doubt)
            with self.journal.tx():  # the escalation and its job, or neither
                esc_id = self.journal.escalations.add_escalation(
                    fingerprint=fp, kind=s.kind, subject=s.subject, summary=s.summary, now=now,
                    deadline=now + self.deadline_s, situation=to_dict(s), default_action=HOLD,
                )  # fmt: skip
                self.jobs.add(esc_id, READ_AND_DELIVER, now, targets=() if routed else targets,
                              routed=routed.as_dict() if routed else None)  # fmt: skip
            raised.append(esc_id)
            self.fresh[esc_id] = s
            while len(self.fresh) > FRESH_MAX:
                self.fresh.popitem(last=False)
            self._written(now)
        return raised

    def _unread(self, s: Situation, doubt: Doubt) -> Routed | None:
        """Why the LLM will not be asked, known when the escalation is raised (None: ask)."""
        if self.reader is None:
            return Routed(False, "no LLM reader is configured")
        if s.kind in PEOPLE_ONLY or doubt.people_only:
            return Routed(False, f"{s.kind} situations go to people")
        return None

    def _written(self, now: float) -> None:
        if self.after_write is not None:
            self.after_write(now)

    def read(self, esc_id: int, s: Situation, targets: Collection[str], now: float) -> Routed:
        """Ask the LLM, journal the call, decide whether its answer may act (the worker's)."""
        if self.reader is None:
            return Routed(False, "no LLM reader is configured")
        from escalation.llm import LLMError  # the client is optional: import only when used

        model = self.reader.model
        try:
            answer = self.reader.decide(s, targets)
        except LLMError as exc:
            status = _status_of(exc)
            self.journal.llm.add_llm_call(escalation_id=esc_id, now=now, model=model, status=status,
                                      error=str(exc)[:1000], routed="people")  # fmt: skip
            return Routed(False, f"the LLM gave no usable answer ({status}: {exc})")
        routed = self._route(answer, model, s)
        refused = routed.why.startswith("the LLM's answer was refused")
        self.journal.llm.add_llm_call(
            escalation_id=esc_id, now=now, model=model, status="refused" if refused else "ok",
            prompt_digest=answer.prompt_digest, action=answer.action, params=answer.params,
            confidence=answer.confidence, rationale=answer.rationale, tokens=answer.tokens,
            latency_ms=round(answer.latency_s * 1000, 1),
            routed="act" if routed.acted else "people",
        )  # fmt: skip
        return routed

    def _route(self, answer: Any, model: str, s: Situation | None = None) -> Routed:
        """The LLM's answer as a proposal through the one gate (controller.core.decide.gate).

        An answer about another instance or host than the situation's subject is refused (it
        goes to people, the call journaled as refused); one that does not resolve the situation
        (`hold`, `notify`) goes to people too, the escalation left open."""
        from controller.core.decide import gate

        if answer.action is None:
            return Routed(False, f"the LLM handed it to people: {answer.rationale}")
        p = Proposal(answer.action, answer.params, f"llm:{model}", answer.rationale,
                     answer.confidence)  # fmt: skip
        if s is not None:
            off = off_subject(s.subject, s.facts, answer.params)
            if off:
                return Routed(False, f"the LLM's answer was refused: {off}", None)
        if answer.action in UNRESOLVING:
            told = f": {answer.params['message']}" if answer.action == "notify" else ""
            return Routed(False, f"the LLM answered {answer.action}{told}, which does not "
                          "resolve the situation", proposal_dict(p))  # fmt: skip
        d = gate(p, self.gate)
        if d.verdict == "act":
            return Routed(True, f"{d.why}; it runs through the guards", proposal_dict(p))
        return Routed(False, f"the LLM answered {p.action}, but {d.why}", proposal_dict(p))

    def resolve_cleared(self, doubts: Sequence[Doubt], fleet: dict[str, Any], now: float
                        ) -> list[int]:  # fmt: skip
        """Close pending escalations whose situation no longer holds (nothing left to answer)."""
        current = {fingerprint(self.situation(d, fleet, {}, now)) for d in doubts}
        closed = []
        for esc in self.journal.escalations.recent(status="pending"):
            if esc["fingerprint"] in current:
                continue
            note = {"note": "the situation no longer holds"}
            if self.journal.escalations.answer(int(esc["id"]), status="resolved",
                                               by="controller", now=now,
                                               answer=note):  # fmt: skip
                log.info("escalation #%s resolved: %s no longer holds", esc["id"], esc["subject"])
                self.closed(int(esc["id"]))
                closed.append(int(esc["id"]))
        return closed

    def closed(self, esc_id: int) -> None:
        """An escalation was answered, expired or resolved: queue the end of its open alerts."""
        now = self.clock()
        if self.jobs.add(esc_id, RESOLVE, now) is not None:
            self._written(now)

    def approve(self, esc_id: int, routed: Routed, now: float) -> bool:
        """The LLM's answer may act: approve the escalation if it is still pending."""
        assert routed.proposal is not None
        ok = self.journal.escalations.answer(esc_id, status="approved",
                                             by=routed.proposal["proposer"], now=now,
                                             answer=routed.proposal)  # fmt: skip
        if ok:
            log.info("escalation #%d: %s", esc_id, routed.why)
        return ok

    @staticmethod
    def shown(s: Situation, routed: Routed) -> Situation:
        """The situation as people see it: the LLM's proposal first, and why it is theirs."""
        if routed.proposal is None:
            return s
        reason = f"{routed.proposal['reason']} — sent to people because {routed.why}"
        return replace(s, proposals=(dict(routed.proposal, reason=reason), *s.proposals))

    def deliver(self, esc_id: int, s: Situation, fp: str, created: float, now: float, why: str,
                channels: Sequence[Channel]) -> list[Delivery]:  # fmt: skip
        """Send to `channels` and journal each delivery's outcome."""
        esc = self._esc_dict(esc_id, to_dict(s), fp, created)
        esc["routing"] = why
        # Approve runs what the message shows: its first proposal, saved with the escalation
        self.journal.meta.put(shown_key(esc_id), s.proposals[0] if s.proposals else None)
        out = Notifier(channels, self.notifier.renderer).deliver(esc, self.how(esc_id))
        for d in out:
            self.journal.escalations.add_delivery(esc_id, d.channel, now, d.ok, d.detail)
        return out

    def resolve_alerts(self, esc_id: int, esc: dict[str, Any], channels: Sequence[Channel]
                       ) -> list[str | None]:  # fmt: skip
        """End the open alerts of escalation `esc` (a journal row): per channel, the error or
        None (closed, or a channel that keeps no alerts)."""
        message = self._esc_dict(esc_id, esc["situation"], esc["fingerprint"], esc["created_at"])
        errors: list[str | None] = []
        for channel in channels:
            resolve = getattr(channel, "resolve", None)
            try:
                if resolve is not None:
                    resolve(message)
                errors.append(None)
            except Exception as exc:  # noqa: BLE001 - a broken channel never blocks the others
                log.error("escalation #%d: %s could not close its alert: %s", esc_id,
                          getattr(channel, "name", "?"), exc)  # fmt: skip
                errors.append(f"{getattr(channel, 'name', '?')}: {exc}")
        return errors

    def how(self, esc_id: int) -> dict[str, str]:
        how = {"approve_cli": f"{self.cli_prefix} escalations approve {esc_id}",
               "deny_cli": f"{self.cli_prefix} escalations deny {esc_id}"}  # fmt: skip
        if self.answer_url:
            base = self.answer_url.rstrip("/")
            url = f"{base}/v1/escalations/{esc_id}/answer"
            how["answer_url"] = url
            how["view_url"] = f"{base}/escalations/{esc_id}"  # a GET page: how to answer
            for decision in ("approve", "deny"):
                how[f"{decision}_http"] = (
                    'curl -sS -X POST -H "Authorization: Bearer $FLEETGATE_API_TOKEN" '
                    f"-H 'Content-Type: application/json' "
                    f'-d \'{{"decision": "{decision}"}}\' {url}'
                )
        return how

    def _esc_dict(self, esc_id: int, situation: dict[str, Any], fp: str, created: float
                  ) -> dict[str, Any]:  # fmt: skip
        return dict(
            situation,
            id=esc_id,
            fingerprint=fp,
            created_at_iso=iso8601(created),
            deadline=created + self.deadline_s,
            deadline_iso=iso8601(created + self.deadline_s),
            journal_id=self.journal.meta.identity(),
        )


UNRESOLVING = frozenset({"hold", "notify"})  # answers that leave the situation as it is


def shown_key(esc_id: int) -> str:
    """The journal key of the proposal escalation `esc_id`'s message showed first."""
    return f"escalation_shown:{esc_id}"


def subject_host(subject: str, facts: Sequence[dict[str, Any]]) -> set[str]:
    """The host(s) the facts give for an instance subject."""
    kind, _, ident = subject.partition(":")
    if kind != "instance":
        return set()
    return {str(f[k]) for f in facts for k in ("machine", "machine_id", "host")
            if k in f and str(f.get("instance", f.get("id", ident))) == ident}  # fmt: skip


def off_subject(subject: str, facts: Sequence[dict[str, Any]], params: dict[str, Any]) -> str:
    """Why `params` reach beyond an instance subject (another instance or host), or ""."""
    kind, _, ident = subject.partition(":")
    if kind != "instance":
        return ""
    if "instance" in params and str(params["instance"]) != ident:
        return f"it names instance {params['instance']}, but the escalation is about {ident}"
    if "machine" in params and str(params["machine"]) not in subject_host(subject, facts):
        return f"it names host {params['machine']}, which is not instance {ident}'s host"
    return ""


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

"""From doubts to escalations: situation, fingerprint, dedup, journal, the outbox.

For each doubt, in the tick:

1. build a Situation (facts sanitized, recent actions on its subject, the fleet and budget
   summary, the allowed actions, the default action `hold`);
2. skip it unless it is new or changed (`reask`): a fingerprint never raised, one that cleared
   and came back, or a request to approve an action again after the last one was acted on is
   raised; one whose last escalation is pending or approved is not; one whose last answer (the
   default at its deadline, a denial, an action) left it as it was is raised once more after
   the dedup window, to people only, and then not again until it changes. Why it was or was not
   raised is kept with it in the journal (`standing`);
3. journal it (pending, with a deadline) and, in the same transaction, queue a
   `read_and_deliver` job in the outbox (controller/store/outbox.py) with the targets the LLM
   may name, or already routed to people when the situation is one the operator reserved for
   them (or no LLM is configured).

The outbox worker (escalation/outbox.py) does the rest off the tick, through `read`,
`approve` and `deliver` here: if an LLM reader is configured, ask it; its answer acts when its
confidence is at or above the threshold, its action is on `act` autonomy and its `llm-check`
is not due (`unchecked`, asked then: SIGHUP may have changed the gate since the reader was
built); the escalation is approved by `llm:<model>` and the action runs through the guards on
the next tick; every
call, valid or not, is journaled with the prompt's digest. Otherwise it goes to every human
channel, with the LLM's proposal and rationale and why it came to people, and each delivery's
outcome is stored.

`resolve_cleared` closes pending escalations whose situation no longer holds; `closed` queues
a `resolve` job, for the channels that keep open alerts (PagerDuty, Alertmanager). After each
write `after_write(now)` runs when set: the simulator works the outbox there and then (so a
replay is the same run after run), `fleetgate run` wakes its worker thread.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from controller.core.actions import DESCRIPTORS
from controller.core.decide import Doubt
from controller.core.guards import OVERRIDABLE
from controller.core.model import Proposal
from controller.core.policy import Gate
from controller.store.journal import Journal
from controller.store.outbox import READ_AND_DELIVER, RESOLVE, OutboxStore
from escalation.channels.base import Channel, Delivery
from escalation.notify import Notifier, ended
from escalation.render import iso8601
from escalation.situation import (
    Situation,
    fingerprint,
    sanitize,
    sanitize_fact,
    should_escalate,
    to_dict,
)

log = logging.getLogger(__name__)

HOLD = {"action": "hold", "params": {"reason": "no answer before the deadline"}}
PEOPLE_ONLY = frozenset({"approval"})  # the operator asked a person to approve these
FRESH_MAX = 1000  # situations kept as raised, for the worker of this process
STANDING = "escalation_standing"  # journal key: the situations that hold, asks since a change
ASKS_PER_CHANGE = 2  # the first ask, and one more when the answer left it as it was
TEXT_CAP = 1000  # a summary's or a reason's characters, escapes counted (the rules' run to 400)


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
    """A proposal as a situation shows it; its reason (a rule's text, which may quote what an
    instance wrote) one line, as facts are. Its params stay as they are: an approval carries
    them out (messages show them JSON-quoted)."""
    return {"action": p.action, "params": p.params, "proposer": p.proposer,
            "confidence": p.confidence, "reason": sanitize(p.reason, TEXT_CAP)}  # fmt: skip


TOKEN_SHELL = "$FLEETGATE_API_TOKEN"  # the printed curl lines' token where its source is unknown


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
        token_shell: str = TOKEN_SHELL,
        jobs: OutboxStore | None = None,
        clock: Callable[[], float] = time.time,
        unchecked: Callable[[], str | None] | None = None,
        unread: str | None = None,
    ) -> None:
        self.journal = journal
        self.notifier = notifier
        self.window_s = window_s
        self.deadline_s = deadline_s
        self.cli_prefix = cli_prefix
        self.gate = gate or Gate()
        self.reader = reader
        self.answer_url = answer_url  # the HTTP API's base URL, when it is served
        # how a shell reads the API token where the config reads it (`secrets.in_shell`)
        self.token_shell = token_shell
        self.jobs = jobs if jobs is not None else OutboxStore(journal.store)
        self.clock = clock  # the controller's: when `closed` queues a job
        # why the LLM's answers may not act now (its `llm-check` is due), asked at each answer
        # the gate would let act: the gate in force then, not the one at start, decides
        self.unchecked = unchecked
        # why people read it without the LLM when there is no reader (one configured may be off)
        self.unread = unread or "no LLM reader is configured"
        self.after_write: Callable[[float], object] | None = None
        # raised here, not yet taken by a worker (popped from its thread: atomic operations)
        self.fresh: OrderedDict[int, Situation] = OrderedDict()

    def situation(
        self, doubt: Doubt, fleet: dict[str, Any], budget: dict[str, Any], now: float
    ) -> Situation:
        recent = self.journal.actions.recent_for(doubt.subject, now - 3600)
        return Situation(
            kind=doubt.kind, subject=doubt.subject,  # type: ignore[arg-type]
            summary=sanitize(doubt.summary, TEXT_CAP),
            facts=tuple(sanitize_fact(f) for f in doubt.facts), key=dict(doubt.key),
            proposals=tuple(proposal_dict(p) for p in doubt.proposals),
            recent_actions=tuple(recent), fleet=dict(fleet), budget=dict(budget),
            allowed_actions=allowed_actions(doubt.subject, doubt.facts, doubt.proposals),
            default_action=HOLD, created_at=now,
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
        if not doubts:  # most ticks: nothing to read or write
            return []
        raised = []
        standing: dict[str, dict[str, Any]] = dict(self.journal.meta.get(STANDING, None) or {})
        before = json.dumps(standing, sort_keys=True)
        for doubt in doubts:
            s = self.situation(doubt, fleet, budget, now)
            fp = fingerprint(s)
            last = self.journal.escalations.last_escalation(fp)
            held = standing.get(fp)
            verdict = reask(last, s.kind, int(held["asks"]) if held else None, now, self.window_s)
            if not verdict.ask:
                assert last is not None  # a situation never raised is always asked
                if held is None:  # raised before it was counted here: that was its first ask
                    held = {"asks": 1, "since": float(last["created_at"]), "last": last["id"]}
                if held.get("why") != verdict.why:
                    log.debug("situation %s (%s) not raised again: %s", fp, s.subject, verdict.why)
                    standing[fp] = dict(held, why=verdict.why, at=now)
                continue
            routed = self._unread(s, doubt)
            if routed is None and not verdict.fresh:  # the LLM read it since it last changed
                routed = Routed(False, f"it is asked once more: {verdict.why}")
            with self.journal.tx() as db:  # the escalation and its job, or neither
                # under this controller's lease, when it holds one: a leader stalled past it
                # since it sensed raises nothing from that old view (StaleLeader)
                self.journal.actions.check_fence(db)
                esc_id = self.journal.escalations.add_escalation(
                    fingerprint=fp, kind=s.kind, subject=s.subject, summary=s.summary, now=now,
                    deadline=now + self.deadline_s, situation=to_dict(s), default_action=HOLD,
                )  # fmt: skip
                self.jobs.add(esc_id, READ_AND_DELIVER, now, targets=() if routed else targets,
                              routed=routed.as_dict() if routed else None)  # fmt: skip
                again = held is not None and not verdict.fresh
                asks = int(held["asks"]) + 1 if held is not None and again else 1
                since = float(held["since"]) if held is not None and again else now
                standing[fp] = {"asks": asks, "since": since, "last": esc_id,
                                "why": verdict.why, "at": now}  # fmt: skip
                self.journal.meta.put(ask_key(esc_id), {"ask": asks, "why": verdict.why})
            log.debug("situation %s (%s) raised as escalation #%d (ask %d): %s", fp, s.subject,
                      esc_id, asks, verdict.why)  # fmt: skip
            raised.append(esc_id)
            self.fresh[esc_id] = s
            while len(self.fresh) > FRESH_MAX:
                self.fresh.popitem(last=False)
            self._written(now)
        if json.dumps(standing, sort_keys=True) != before:
            self.journal.meta.put(STANDING, standing)
        return raised

    def _unread(self, s: Situation, doubt: Doubt) -> Routed | None:
        """Why the LLM will not be asked, known when the escalation is raised (None: ask)."""
        if self.reader is None:
            return Routed(False, self.unread)
        if s.kind in PEOPLE_ONLY or doubt.people_only:
            return Routed(False, f"{s.kind} situations go to people")
        return None

    def _written(self, now: float) -> None:
        if self.after_write is not None:
            self.after_write(now)

    def read(self, esc_id: int, s: Situation, targets: Collection[str], now: float) -> Routed:
        """Ask the LLM, journal the call, decide whether its answer may act (the worker's)."""
        if self.reader is None:
            return Routed(False, self.unread)
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
            off = off_subject(s.subject, s.facts, answer.params, s.proposals)
            if off:
                return Routed(False, f"the LLM's answer was refused: {off}", None)
        if answer.action in UNRESOLVING:
            said = answer.params.get("message") or answer.params.get("reason")
            told = f": {said}" if said else ""
            return Routed(False, f"the LLM answered {answer.action}{told}, which does not "
                          "resolve the situation", proposal_dict(p))  # fmt: skip
        d = gate(p, self.gate)
        unchecked = self.unchecked() if d.verdict == "act" and self.unchecked else None
        if unchecked:
            return Routed(False, f"the LLM answered {p.action}, but {unchecked}",
                          proposal_dict(p))  # fmt: skip
        if d.verdict == "act":
            return Routed(True, f"{d.why}; it runs through the guards", proposal_dict(p))
        return Routed(False, f"the LLM answered {p.action}, but {d.why}", proposal_dict(p))

    def resolve_cleared(self, doubts: Sequence[Doubt], fleet: dict[str, Any], now: float,
                        pending: Sequence[dict[str, Any]] | None = None) -> list[int]:  # fmt: skip
        """Close pending escalations whose situation no longer holds (nothing left to answer).

        `pending`: the pending escalations as the caller read them this tick, when it raised
        none since (else they are read here); one answered meanwhile is left as it is."""
        current = {fingerprint(self.situation(d, fleet, {}, now)) for d in doubts}
        standing = dict(self.journal.meta.get(STANDING, None) or {})
        gone = sorted(set(standing) - current)
        for fp in gone:  # it cleared: seen again, it is a new occurrence, asked at once
            log.debug("situation %s cleared after %s ask(s)", fp, standing.pop(fp)["asks"])
        if gone:
            self.journal.meta.put(STANDING, standing)
        closed = []
        if pending is None:
            pending = self.journal.escalations.recent(status="pending")
        for esc in pending:
            if esc["fingerprint"] in current:
                continue
            note = {"note": "the situation no longer holds"}
            with self.journal.tx() as db:  # under the lease, as a raise is
                self.journal.actions.check_fence(db)
                resolved = self.journal.escalations.answer(int(esc["id"]), status="resolved",
                                                           by="controller", now=now,
                                                           answer=note)  # fmt: skip
            if resolved:
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
        """The situation as people see it: the LLM's proposal first, and why it is theirs. A
        hold or notify it answered is said in `routed.why` and offered as nothing to approve:
        the bare approve (an Approve button) would run it and close the escalation, the
        situation left as it was."""
        if routed.proposal is None or routed.proposal["action"] in UNRESOLVING:
            return s
        reason = f"{routed.proposal['reason']} — sent to people because {routed.why}"
        return replace(s, proposals=(dict(routed.proposal, reason=reason), *s.proposals))

    def deliver(self, esc_id: int, s: Situation, fp: str, created: float, now: float, why: str,
                channels: Sequence[Channel], again: bool = False) -> list[Delivery]:  # fmt: skip
        """Send to `channels` and journal each delivery's outcome (`again`: a retry)."""
        esc = self._esc_dict(esc_id, to_dict(s), fp, created)
        esc["routing"] = why
        # Approve runs what the message shows: its first proposal, saved with the escalation
        self.journal.meta.put(shown_key(esc_id), s.proposals[0] if s.proposals else None)
        # raised in a journal the controller lost: the id alone may name another escalation
        # in the file on disk now, so the printed answers carry its fingerprint
        pin = fp if s.key.get("problem") == "journal_lost" else None
        how = self.how(esc_id, proposed=bool(s.proposals), fingerprint=pin,
                       override=overridable_cap(s))  # fmt: skip
        out = Notifier(channels, self.notifier.renderer).deliver(esc, how, again)
        for d in out:
            self.journal.escalations.add_delivery(esc_id, d.channel, now, d.ok, d.detail)
        return out

    def resolve_alerts(self, esc_id: int, esc: dict[str, Any], channels: Sequence[Channel]
                       ) -> list[str | None]:  # fmt: skip
        """End the open alerts of escalation `esc` (a journal row): per channel, the error or
        None (closed, or a channel that keeps no alerts)."""
        message = self._esc_dict(esc_id, esc["situation"], esc["fingerprint"], esc["created_at"])
        # how it ended: the situation the row keeps has no status (an alert read "answered")
        message.update(status=esc.get("status"), ended=ended(esc))
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

    def how(self, esc_id: int, proposed: bool = True, fingerprint: str | None = None,
            override: str | None = None) -> dict[str, str]:  # fmt: skip
        """How to answer escalation `esc_id`, as messages print it. Without a proposal
        (`proposed` false) there is nothing for a bare approve to run: no approve by HTTP, and
        the channels' Approve buttons are left out (the CLI line names `--action NAME`). With
        a `fingerprint`, the CLI lines answer only the escalation that has it. With an
        `override` (a budget cap, `overridable_cap`), `override_cli` approves past it."""
        pin = f" --fingerprint {fingerprint}" if fingerprint else ""
        how = {"approve_cli": f"{self.cli_prefix} escalations approve {esc_id}{pin}",
               "deny_cli": f"{self.cli_prefix} escalations deny {esc_id}{pin}"}  # fmt: skip
        if override is not None and proposed:
            how["override_cli"] = f"{how['approve_cli']} --override {override}"
        if self.answer_url:
            base = self.answer_url.rstrip("/")
            url = f"{base}/v1/escalations/{esc_id}/answer"
            how["answer_url"] = url
            how["view_url"] = f"{base}/escalations/{esc_id}"  # a GET page: how to answer
            for decision in ("approve", "deny") if proposed else ("deny",):
                how[f"{decision}_http"] = (
                    f'curl -sS -X POST -H "Authorization: Bearer {self.token_shell}" '
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


def overridable_cap(s: Situation) -> str | None:
    """The budget cap a guard_veto situation names, when a person's answer may exceed it
    (guards.OVERRIDABLE); None for any other guard (the drain before a destroy, a cooldown,
    the pause, ...): no `--override` gets past those."""
    guard = s.key.get("guard") if s.kind == "guard_veto" else None
    return guard if isinstance(guard, str) and guard in OVERRIDABLE else None


def ask_key(esc_id: int) -> str:
    """The journal key of why escalation `esc_id` was raised: {"ask": n since its situation
    last changed, "why": words}."""
    return f"escalation_ask:{esc_id}"


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


def off_subject(subject: str, facts: Sequence[dict[str, Any]], params: dict[str, Any],
                proposals: Sequence[Mapping[str, Any]] = ()) -> str:  # fmt: skip
    """Why `params` reach beyond what the situation offers, or "".

    An answer may name the subject itself (an instance, or a host), the host of an instance
    subject, and any instance or host one of the situation's proposals named; nothing else,
    whatever the subject (a fleet or demand situation names no instance of its own)."""
    kind, _, ident = subject.partition(":")
    offered: dict[str, set[str]] = {"instance": set(), "machine": set()}
    for p in proposals:
        for key, ids in offered.items():
            if key in (p.get("params") or {}):
                ids.add(str(p["params"][key]))
    if kind == "instance":
        offered["instance"].add(ident)
        offered["machine"] |= subject_host(subject, facts)
    elif kind == "machine":
        offered["machine"].add(ident)
    about = f"instance {ident}" if kind == "instance" else \
        f"host {ident}" if kind == "machine" else subject  # fmt: skip
    if "instance" in params and str(params["instance"]) not in offered["instance"]:
        if kind == "instance":
            return f"it names instance {params['instance']}, but the escalation is about {ident}"
        return f"it names instance {params['instance']}, which the escalation about {about} " \
               "did not offer"  # fmt: skip
    if "machine" in params and str(params["machine"]) not in offered["machine"]:
        if kind == "instance":
            return f"it names host {params['machine']}, which is not instance {ident}'s host"
        return f"it names host {params['machine']}, which the escalation about {about} did " \
               "not offer"  # fmt: skip
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


@dataclass(frozen=True)
class Reask:
    """Whether a situation is raised now (`ask`), why, and whether it is new or changed
    (`fresh`: its count of asks starts over)."""

    ask: bool
    why: str
    fresh: bool = False


def reask(last: Mapping[str, Any] | None, kind: str, asks: int | None, now: float,
          window_s: float) -> Reask:  # fmt: skip
    """Raise a situation again only when it changed, or once more when an answer left it.

    `last` is its fingerprint's last escalation (a journal row), `asks` how often it was raised
    since it last changed (None: it cleared since, or it was never seen holding). A changed
    situation has another fingerprint, so it is new here. Pending or approved: wait for it. An
    answer that left it as it was (the default `hold` at the deadline, a denial, an action that
    did not fix it) gets the dedup window (`held_back`), then one more ask; after
    ASKS_PER_CHANGE asks it is quiet until it changes, clears or comes back."""
    if last is None:
        return Reask(True, "first seen", fresh=True)
    n, status = int(last["id"]), str(last["status"])
    if status in _WAITING:
        waits = "waits for an answer" if status == "pending" else "has an answer to run"
        return Reask(False, f"escalation #{n} {waits}")
    if status == "resolved" or asks is None:
        return Reask(True, f"it cleared after escalation #{n} and came back", fresh=True)
    if kind in _REQUESTS and status not in _QUIET_FOR_A_WINDOW:
        return Reask(True, f"the action approved in escalation #{n} was {status}; this is a "
                     "new request", fresh=True)  # fmt: skip
    ended = _ended(last)
    if asks >= ASKS_PER_CHANGE:
        return Reask(False, f"asked {asks} times since it last changed ({ended}); asked "
                     "again when it changes or clears")  # fmt: skip
    if held_back(status, kind, float(last["created_at"]), now, window_s):
        return Reask(False, f"{ended}; the dedup window ({window_s:g} s) has not passed")
    return Reask(True, f"{ended}, and it still holds {window_s:g} s after it was raised")


def _ended(last: Mapping[str, Any]) -> str:
    """How escalation `last` ended, in words."""
    n, status = int(last["id"]), str(last["status"])
    if status == "expired":
        default = last.get("default_action")
        if isinstance(default, str):
            default = json.loads(default)
        action = default.get("action", "hold") if isinstance(default, Mapping) else "hold"
        return f"escalation #{n} expired and its default ({action}) did not resolve it"
    if status == "denied":
        return f"escalation #{n} was denied"
    return f"escalation #{n} was answered and the action was {status}"


# What each kind of subject may be answered with (`hold` and `notify` always): an instance's
# own actions as its status and stage allow, the fleet's size, a host's block.
_ALWAYS = ("hold", "notify")
_FLEET_ACTIONS = ("launch", "scale_to")
_DAEMON_STAGES = ("bench", "running")


def allowed_actions(subject: str, facts: Sequence[Mapping[str, Any]],
                    proposals: Sequence[Proposal] = ()) -> tuple[str, ...]:  # fmt: skip
    """The actions an answer about `subject` may name, in the vocabulary's order.

    An instance: replace and destroy; reboot, drain while it runs; restart_daemon once its
    daemon belongs (bench, running); undrain when drained; block_host for its host. The fleet
    (or the demand): launch, scale_to. A host: block_host. A sensor: nothing but the two
    always allowed. Any action a proposal of the situation names is allowed too (`escalate`
    never: it is a rule's way to ask)."""
    kind, _, ident = subject.partition(":")
    names = set(_ALWAYS) | {p.action for p in proposals}
    if kind == "instance":
        inst = next((f for f in facts if f.get("kind", "instance") == "instance"
                     and str(f.get("id")) == ident), {})  # fmt: skip
        names |= {"replace", "destroy"}
        if inst.get("machine_id") or inst.get("machine"):
            names.add("block_host")
        if inst.get("status") == "running":
            names |= {"reboot", "drain"}
            if inst.get("stage") in _DAEMON_STAGES:
                names.add("restart_daemon")
        if inst.get("drained"):
            names |= {"undrain"}
            names.discard("drain")
    elif kind == "machine":
        names.add("block_host")
    elif subject == "fleet" or kind == "demand":
        names |= set(_FLEET_ACTIONS)
    names.discard("escalate")
    return tuple(a for a in DESCRIPTORS if a in names)

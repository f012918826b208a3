"""Apply: the third step of a tick. Write, then act, then record the results.

1. one transaction, fenced by the leader lease: the plan's bookkeeping (closed intents, lost
   or late launches, replacement states, expired escalations), the tracks and events, and one
   row per decision worth recording (an `act` as an intent, before anything is called);
2. act: each `act` decision through the actuator, which writes its result under its intent;
   one the pause switch now holds (`fleetgate pause` given while the tick ran) is vetoed by
   `paused` instead, as the guards would have, and not carried out;
3. escalations answered by a decision are marked with what became of the answer; a carried-out
   `notify`, and a person's approved answer the guards vetoed, trimmed or found nothing to do
   for, queue a notice for people in the escalation outbox (escalation.notify).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from controller.core.actions import descriptor
from controller.core.brief import brief
from controller.core.decide import Doubt
from controller.core.model import Decision
from controller.core.reconcile import Book, repeated, veto_key
from controller.fleet.actuator import Actuator, Job
from controller.service.plan import Planned
from controller.store.backend import Tx
from controller.store.journal import Journal
from controller.store.outbox import OutboxStore
from escalation.notify import answer_notice, notify_notice

log = logging.getLogger(__name__)

_QUIET = ("noop", "superseded")


@dataclass(frozen=True)
class Applied:
    counts: dict[str, int]  # decisions by verdict
    refused: tuple[Doubt, ...]  # LLM answers the guards vetoed: for people now
    expired: tuple[int, ...]  # escalations closed by their deadline
    closed: tuple[int, ...]  # escalations whose answer was carried out, vetoed or void
    noticed: tuple[int, ...] = ()  # notices queued for people (outbox job ids)


def write(
    journal: Journal, planned: Planned, rules: str, then: Callable[[Tx], None] | None = None
) -> tuple[int, list[tuple[Decision, int]]]:
    """Step 1, in one transaction: the tick's row (started at the plan's `now`, under the
    rules digest `rules`), bookkeeping, tracks and the decisions' rows; `then` writes what
    else the tick learned, in the same one. (The tick's id, the decisions with their rows.)"""
    effective = {d.proposal.target for d in planned.plan.decisions if d.verdict not in _QUIET}
    recent = set(planned.vetoes)
    rows: list[tuple[Decision, int]] = []
    with journal.tx() as db:
        # first, whatever the plan holds: a leader stalled past its lease since it read the
        # journal would write its tracks and bookkeeping, read before, over its successor's
        journal.actions.check_fence(db)
        tick_id = journal.meta.start_tick(planned.now, rules, db)
        for b in planned.books:
            _book(journal, b, planned.now)
        journal.fleet.save_tracks(planned.tracks, planned.events)
        for d in planned.plan.decisions:
            if not _worth_recording(d, effective) or repeated(d, recent):
                continue
            if d.verdict == "veto" and d.proposal.escalation_id is None:
                recent.add(veto_key(d.effective_action, d.proposal.target, d.guard,
                                    d.effective_params))  # fmt: skip
            rows.append((d, _record(journal, d, tick_id, planned.now)))
        if then is not None:
            then(db)
    return tick_id, rows


def _book(journal: Journal, b: Book, now: float) -> None:
    a = b.args
    if b.op == "finish":
        journal.actions.finish(int(a["action_id"]), now, str(a["status"]), dict(a["result"]))
        log.warning("action #%s: %s %s", a["action_id"], a["status"],
                    a["result"].get("note", ""),
                    extra={"action_id": int(a["action_id"]), "outcome": a["status"]})  # fmt: skip
    elif b.op == "replacement":
        journal.actions.set_replacement(str(a["old_id"]), str(a["state"]), a.get("new_id"))
    elif b.op == "expire":
        journal.escalations.answer(int(a["esc_id"]), status="expired", by="deadline", now=now,
                                   answer=None)  # fmt: skip
    elif b.op == "escalation":
        journal.escalations.set_escalation_status(int(a["esc_id"]), str(a["status"]),
                                                  int(a["action_id"]))  # fmt: skip
        log.warning("escalation #%s: its answer was begun by a run that stopped (action #%s): "
                    "%s, not carried out again", a["esc_id"], a["action_id"],
                    a["status"])  # fmt: skip
    else:  # a plan only holds the ops above
        raise ValueError(f"unknown bookkeeping op {b.op!r}")


def act(journal: Journal, actuator: Actuator, planned: Planned, tick_id: int,
        rows: list[tuple[Decision, int]],
        check: Callable[[], None] | None = None) -> Applied:  # fmt: skip
    """Steps 2 and 3; `check` runs before each action and raises to stop acting (the journal
    is gone, the lease was lost: what it raises ends the step)."""
    counts: dict[str, int] = {}
    for d in planned.plan.decisions:
        counts[d.verdict] = counts.get(d.verdict, 0) + 1
    refused: list[Doubt] = []
    closed: list[int] = []
    noticed: list[int] = []
    for d, action_id in rows:
        told = False
        if d.verdict == "act" and _paused_since(journal, d):
            d = _veto_paused(journal, d, action_id, tick_id)
            counts["act"] -= 1
            counts["veto"] = counts.get("veto", 0) + 1
        if d.verdict == "act":
            if check is not None:
                check()
            job = Job(d, action_id, tick_id, planned.history, planned.now, planned.by_id)
            outcome = actuator.execute(job)
            log.info("[%s] %s %s → %s%s | %s", _clock(planned.now), d.effective_action,
                     brief(d.effective_params), outcome.status, _result(outcome.result),
                     _who(d), extra=log_fields(d, tick_id, action_id, outcome.status))  # fmt: skip
            status = "executed" if outcome.status != "failed" else "failed"
            told = d.effective_action == "notify" and outcome.status == "ok"
        else:
            status = {"veto": "vetoed"}.get(d.verdict, d.verdict)
        esc = d.proposal.escalation_id
        if esc is not None and d.verdict in ("act", "veto", "noop"):
            journal.escalations.set_escalation_status(
                esc, "void" if d.verdict == "noop" else status, action_id)  # fmt: skip
            closed.append(esc)
            if d.verdict == "veto" and d.proposal.proposer.startswith("llm:"):
                refused.append(_refused(d))
        notices = [notify_notice(d, action_id, planned.now)] if told else []
        notices += [n for n in [answer_notice(d, action_id, planned.now)] if n is not None]
        for source, notice in notices:
            queued = OutboxStore(journal.store).add_notice(d.proposal.escalation_id, source,
                                                           notice, planned.now)  # fmt: skip
            noticed += [queued] if queued is not None else []
    expired = tuple(int(b.args["esc_id"]) for b in planned.books if b.op == "expire")
    return Applied(counts, tuple(refused), expired, tuple(closed), tuple(noticed))


PAUSED_WHY = "the controller was paused after this tick decided: not carried out"


def _paused_since(journal: Journal, d: Decision) -> bool:
    """Whether `fleetgate pause` was given since the tick read the switch (an action that
    runs while paused runs all the same): asked before each action, so that once the command
    has returned, the tick in progress starts nothing more."""
    if descriptor(d.effective_action).pause_exempt:
        return False
    return bool(journal.meta.get("paused", False))


def _veto_paused(journal: Journal, d: Decision, action_id: int, tick_id: int) -> Decision:
    """The decision as the pause guard would have made it; its intent row vetoed likewise."""
    journal.actions.veto_intent(action_id, "paused", PAUSED_WHY)
    log.warning("action #%d %s %s: %s", action_id, d.effective_action,
                brief(d.effective_params), PAUSED_WHY,
                extra=log_fields(d, tick_id, action_id, "vetoed"))  # fmt: skip
    return replace(d, verdict="veto", guard="paused", why=PAUSED_WHY)


_STATUS = {"act": "intent", "veto": "vetoed", "ask": "asked", "observe": "observed"}


def _record(journal: Journal, d: Decision, tick_id: int, now: float) -> int:
    status = _STATUS.get(d.verdict, d.verdict)
    return journal.actions.record(
        tick_id=tick_id, now=now, action=d.effective_action, target=d.proposal.target,
        params=d.effective_params, proposer=d.proposal.proposer, reason=d.proposal.reason,
        confidence=d.proposal.confidence, verdict=d.verdict, why=d.why, guard=d.guard,
        status=status, escalation_id=d.proposal.escalation_id,
    )  # fmt: skip


def _worth_recording(d: Decision, effective: set[str]) -> bool:
    """Noops are not journaled (unless they answer a human); a superseded proposal only when
    the proposal that won did something (else every tick would repeat it)."""
    if d.verdict == "noop":
        return d.proposal.escalation_id is not None
    if d.verdict == "superseded":
        return d.proposal.target in effective
    return True


def _refused(d: Decision) -> Doubt:
    """An LLM answer the guards vetoed: people decide now (the LLM is not asked again)."""
    p = d.proposal
    return Doubt(
        "guard_veto",
        p.target,
        f"{p.proposer} answered escalation #{p.escalation_id} "
        f"with {p.action} {brief(p.params)}, but the guards refused it: {d.why}",
        key={"guard": d.guard, "escalation": p.escalation_id},
        proposals=(p,),
        people_only=True,
    )


def _clock(now: float) -> str:
    return time.strftime("%m-%d %H:%M", time.gmtime(now))


def _result(result: dict[str, Any]) -> str:
    shown = {k: v for k, v in result.items() if k in ("launched", "replacement", "error")}
    return f" ({brief(shown)})" if shown else ""


def log_fields(d: Decision, tick_id: int, action_id: int, outcome: str) -> dict[str, object]:
    """The fields of an action's log line (`--log-format json` shows them): tick, action,
    action_id, outcome, target, instance, rule, proposer and escalation when there is one."""
    p = d.proposal
    fields: dict[str, object] = {"tick": tick_id, "action": d.effective_action,
                                 "action_id": action_id, "outcome": outcome,
                                 "target": p.target, "proposer": p.proposer}  # fmt: skip
    kind, _, ident = (p.target or "").partition(":")
    if kind == "instance" and ident:
        fields["instance"] = ident
    if p.proposer.startswith("rule:"):
        fields["rule"] = p.proposer[5:]
    if p.escalation_id is not None:
        fields["escalation"] = p.escalation_id
    return fields


def _who(d: Decision) -> str:
    p = d.proposal
    if p.proposer.startswith("rule:"):
        return f"rule {p.proposer[5:]}: {p.reason}"
    return f"{p.proposer}: {p.reason}"

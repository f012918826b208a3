"""Reconcile: what the journal expected, against what this tick sensed. Pure.

Each function takes rows the tick read once (`controller.service.gather`) and the observation,
and returns what follows from them as data: proposals for this tick, and the bookkeeping to
write (`Book`) in the same transaction as the tick's intents (`controller.service.apply`).

- `interrupted`: intents a stopped run left between intent and result;
- `launches`: launches on their way (capacity the guards count), and those now confirmed late
  or given up on as lost;
- `followups`: replacements in flight, and when their old instance is to be destroyed;
- `expired`: escalations past their deadline, and their default actions;
- `carried`: approved answers a stopped run set out to carry out, closed, not done again;
- `repeated`: a veto journaled within `VETO_REPEAT_S` is not journaled again.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.core.model import Decision, Instance, Observation, Proposal

VETO_REPEAT_S = 600.0


@dataclass(frozen=True)
class Book:
    """One bookkeeping write: `op` names it, `args` are its keyword arguments.

    finish (action_id, status, result), replacement (old_id, state, new_id),
    expire (esc_id), escalation (esc_id, status, action_id)."""

    op: str
    args: dict[str, Any] = field(default_factory=dict)


def interrupted(intents: Sequence[dict[str, Any]], obs: Observation) -> list[Book]:
    """Intents left by a run that stopped between intent and result (single launches are
    reconciled by their label instead). A destroy whose target a good listing lacks is done;
    everything else is `interrupted`, and the rules decide again from what is sensed."""
    listed = {i.id for i in obs.instances} if obs.sensor_ok("provider") else None
    out = []
    for r in intents:
        if r["action"] == "launch" and r.get("parent_id") is not None:
            continue
        target = str(r["target"]).removeprefix("instance:")
        if r["action"] == "destroy" and listed is not None and target not in listed:
            out.append(Book("finish", {"action_id": int(r["id"]), "status": "ok", "result": {
                "instance": target, "confirmed_by": "listing"}}))  # fmt: skip
            continue
        out.append(Book("finish", {"action_id": int(r["id"]), "status": "interrupted", "result": {
            "note": "the controller stopped before the result was recorded; the rules decide "
            "again from what is sensed now"}}))  # fmt: skip
    return out


def carried(rows: Sequence[tuple[int, int, str]]) -> list[Book]:
    """Approved escalations whose answer a run set out to carry out (its intent journaled)
    and stopped before marking: closed with what came of it, never carried out again. One
    whose action the run left at `intent` may or may not have reached the provider:
    `interrupted` (the rules decide again from what is sensed; people may ask anew)."""
    out = []
    for esc_id, action_id, status in rows:
        ended = {"failed": "failed", "intent": "interrupted",
                 "interrupted": "interrupted"}.get(status, "executed")  # fmt: skip
        out.append(Book("escalation", {"esc_id": esc_id, "status": ended,
                                       "action_id": action_id}))  # fmt: skip
    return out


def launches(
    rows: Sequence[dict[str, Any]], obs: Observation, seen: Collection[str], now: float, *,
    pending_s: float, unknown_s: float,
) -> tuple[list[str], list[Book]]:  # fmt: skip
    """Labels of launches on their way (not yet listed, not given up on), and bookkeeping.

    A launch whose label is listed is confirmed (late creates included, also one already
    recorded as lost, or as failed: vast answered an error and rented anyway); one unclear
    create (`unknown`) unlisted for `unknown_s` of good listings, or any unlisted for
    `pending_s`, is lost. While the listing failed, every recent launch still open is on its
    way (never launch blind)."""
    if not obs.sensor_ok("provider"):
        return [str(r["key"]) for r in rows if r["status"] not in ("lost", "failed")], []
    by_label = {i.label: i for i in obs.instances}
    seen = set(seen) | {i.id for i in obs.instances}
    pending: list[str] = []
    books: list[Book] = []
    for r in rows:
        label, listed = str(r["key"]), by_label.get(str(r["key"]))
        if listed is not None or r["result"].get("instance") in seen:
            if r["status"] != "ok" and listed is not None:
                answer = ("vast answered the create with an error" if r["status"] == "failed"
                          else "the create's answer said nothing clear")  # fmt: skip
                note = f"instance {listed.id} listed with its label after {answer}"
                books.append(_finish(r, "ok", {"instance": listed.id, "label": label,
                                               "confirmed_late": True, "note": note}))  # fmt: skip
            continue
        if r["status"] in ("lost", "failed"):  # no capacity; confirmed above if it shows
            continue
        age = now - float(r["at"])
        if r["status"] == "unknown" and age >= unknown_s:
            books.append(_finish(r, "lost", {"label": label, "note": "the create answered "
                                             "nothing clear and its label was never listed in "
                                             f"{age:.0f}s"}))  # fmt: skip
            continue
        if age >= pending_s:
            if r["status"] != "ok":
                books.append(_finish(r, "lost", {"label": label, "note": "never listed within "
                                                 "the pending window"}))  # fmt: skip
            continue
        pending.append(label)
    return pending, books


def _finish(row: dict[str, Any], status: str, result: dict[str, Any]) -> Book:
    return Book("finish", {"action_id": int(row["id"]), "status": status, "result": result})


def serving(inst: Instance) -> bool:
    """Whether the instance proves now: running, past its benchmark, its daemon up, and not
    drained (a drained node takes no new task)."""
    return (inst.status == "running" and inst.stage == "running" and inst.daemon == "up"
            and not inst.drained)  # fmt: skip


def followups(replacements: Sequence[dict[str, Any]], obs: Observation, now: float
              ) -> tuple[list[Proposal], list[Book]]:  # fmt: skip
    """Replacements in flight: destroy the old instance once its replacement runs (or late), or
    at once when the old one serves nothing (stuck in a boot stage, frozen, its daemon down):
    it is kept only as capacity while the replacement boots, and then it is none."""
    if not obs.sensor_ok("provider"):
        return [], []
    by_label = {i.label: i for i in obs.instances}
    live = {i.id: i for i in obs.instances}
    out: list[Proposal] = []
    books: list[Book] = []
    for r in replacements:
        old, new = r["old_id"], by_label.get(r["new_label"])
        if old not in live:
            books.append(Book("replacement", {"old_id": old, "state": "done",
                                              "new_id": new.id if new else None}))  # fmt: skip
            continue
        if new is not None and not r["new_id"]:
            books.append(Book("replacement", {"old_id": old, "state": "waiting",
                                              "new_id": new.id}))  # fmt: skip
        if new is not None and new.stage == "running":
            why = f"its replacement {new.id} is running"
        elif now >= r["deadline"]:
            why = "its replacement did not run before the deadline"
        elif not serving(live[old]):
            why = "it serves nothing while its replacement boots"
        else:
            continue
        out.append(Proposal("destroy", {"instance": old}, "controller:replace",
                            f"replace (action #{r['action_id']}): {why}", 1.0, 100))  # fmt: skip
    return out, books


def expired(pending: Sequence[dict[str, Any]], now: float
            ) -> tuple[list[Decision], list[Book]]:  # fmt: skip
    """Pending escalations past their deadline are closed; their default actions go through
    the tick's one guard pass, with the tick's facts."""
    out: list[Decision] = []
    books: list[Book] = []
    for esc in pending:
        if float(esc["deadline"]) > now:
            continue
        books.append(Book("expire", {"esc_id": int(esc["id"])}))
        default = esc.get("default_action") or {"action": "hold", "params": {}}
        p = Proposal(action=default["action"], params=default.get("params", {}),
                     proposer=f"deadline:#{esc['id']}", reason=f"no answer to escalation "
                     f"#{esc['id']} before its deadline: default action", confidence=1.0,
                     priority=-1)  # fmt: skip
        out.append(Decision(p, "act", p.reason))
    return out, books


def veto_key(action: str, target: str, guard: str, params: dict[str, Any]) -> tuple[str, ...]:
    """The same veto: the same action, target, parameters and guard (not the guard's wording,
    which counts time: "30s ago", "60s ago", ...)."""
    return (action, target, guard, json.dumps(params, sort_keys=True, default=str))


def repeated(d: Decision, recent: Collection[tuple[str, ...]]) -> bool:
    """A veto journaled less than VETO_REPEAT_S ago is not journaled again (a limit that holds
    an action back would otherwise add a row every tick)."""
    if d.verdict != "veto" or d.proposal.escalation_id is not None:
        return False
    key = veto_key(d.effective_action, d.proposal.target, d.guard, d.effective_params)
    return key in recent

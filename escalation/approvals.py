"""Answers to escalations: approve (with the proposed or a named action), deny, expire.

An approved answer becomes a proposal from `human:<who>` on the next tick and passes the same
guards as any other; the journal links the action back to the escalation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controller.core import actions
from controller.core.guards import OVERRIDABLE
from controller.core.model import Proposal
from controller.store.journal import Journal


class ApprovalError(ValueError):
    """The answer cannot be taken (unknown id, already answered, invalid action)."""


def _pending(journal: Journal, esc_id: int, now: float) -> dict[str, Any]:
    """The escalation, still open to an answer: pending, and before its deadline (after it,
    its default action stands even before a tick has recorded it expired; every way of
    answering agrees on that, the buttons, the API, the dashboard and the CLI)."""
    esc = journal.escalations.escalation(esc_id)
    if esc is None:
        raise ApprovalError(f"no escalation #{esc_id}")
    if esc["status"] != "pending":
        raise ApprovalError(f"escalation #{esc_id} is {esc['status']}, not pending")
    if now >= float(esc["deadline"]):
        raise ApprovalError(f"escalation #{esc_id} passed its deadline: its default action "
                            "stands")  # fmt: skip
    return esc


def shown_proposal(journal: Journal, esc: dict[str, Any]) -> dict[str, Any] | None:
    """The proposal the escalation's message showed first (saved when it was delivered), else
    the first one it was raised with."""
    from escalation.router import shown_key

    saved = journal.meta.get(shown_key(int(esc["id"])), None)
    if isinstance(saved, dict) and "action" in saved:
        return saved
    proposals = esc["situation"].get("proposals") or []
    return proposals[0] if proposals else None


def approve(
    journal: Journal,
    esc_id: int,
    *,
    by: str,
    now: float,
    action: str | None = None,
    params: dict[str, Any] | None = None,
    override: Sequence[str] = (),
) -> dict[str, Any]:
    """Approve escalation `esc_id`: the proposal its message showed, or `action` with `params`.
    `params` without `action`, or with the shown proposal's action, change that proposal's
    parameters (the others stay as shown).

    `action` must be one the escalation offers (its allowed actions) and may only name its
    subject (the instance, its host; the host) or what its proposals named. `override` names
    budget caps (guards.OVERRIDABLE) this answer may exceed: explicit, and journaled with the
    answer and the action; nothing else can exceed them (only the operator's credential may
    send one).
    """
    from escalation.router import off_subject

    esc = _pending(journal, esc_id, now)
    situation = esc["situation"]
    shown = shown_proposal(journal, esc)
    if action is None:
        if shown is None:
            names = ", ".join(situation.get("allowed_actions") or actions.ACTIONS)
            raise ApprovalError(
                f"escalation #{esc_id} has no proposed action: name one with --action "
                f"(one of {names})"
            )
        action, params = shown["action"], {**shown["params"], **(params or {})}
    elif shown is not None and shown["action"] == action:
        params = {**shown["params"], **(params or {})}
    offered = list(situation.get("allowed_actions") or actions.ACTIONS)
    if action not in actions.ACTIONS or action not in offered:
        raise ApprovalError(
            f"action {str(action)[:40]!r} is not offered by escalation #{esc_id} "
            f"(one of {', '.join(offered)})"
        )
    try:  # the obvious target unless the answer names one: `--param` adds to it
        checked = actions.validate(action, {**_default_params(esc, action), **(params or {})})
    except actions.ActionError as exc:
        raise ApprovalError(str(exc)) from exc
    off = off_subject(str(esc["subject"]), situation.get("facts") or [], checked,
                      situation.get("proposals") or [])  # fmt: skip
    if off:
        raise ApprovalError(f"the answer is refused: {off}")
    unknown = sorted(set(override) - set(OVERRIDABLE))
    if unknown:
        raise ApprovalError(f"cannot override {', '.join(unknown)} (only {', '.join(OVERRIDABLE)})")
    answer: dict[str, Any] = {"action": action, "params": checked}
    if override:
        answer["override"] = sorted(set(override))
    if not journal.escalations.answer(esc_id, status="approved", by=by, now=now, answer=answer):
        raise ApprovalError(f"escalation #{esc_id} was answered meanwhile")
    return answer


def _default_params(esc: dict[str, Any], action: str) -> dict[str, Any]:
    """Fill the obvious target: `--action replace` on an instance situation means that one,
    `--action block_host` its host (or the host a host's situation is about)."""
    from escalation.router import subject_host

    kind, _, ident = str(esc["subject"]).partition(":")
    schema = actions.ACTIONS[action].model_fields
    if kind == "instance" and "instance" in schema:
        return {"instance": ident}
    out: dict[str, Any] = {}
    if "machine" in schema:
        facts = esc["situation"].get("facts") or []
        hosts = {ident} if kind == "machine" else subject_host(str(esc["subject"]), facts)
        if len(hosts) == 1:
            out["machine"] = next(iter(hosts))
    if "reason" in schema:
        out["reason"] = f"answer to escalation #{esc['id']}"
    return out


def same_escalation(journal: Journal, esc_id: int, fingerprint: str) -> None:
    """ApprovalError unless escalation `esc_id` of `journal` has `fingerprint`: a printed
    answer pinned to it answers nothing else (a journal replaced or restored under the
    controller numbers its escalations its own way)."""
    esc = journal.escalations.escalation(esc_id)
    if esc is None or esc["fingerprint"] != fingerprint:
        raise ApprovalError(
            f"escalation #{esc_id} of this journal is not the one the message was about "
            f"(fingerprint {fingerprint[:16]!r}): nothing answered; see the message"
        )


def deny(journal: Journal, esc_id: int, *, by: str, now: float) -> None:
    _pending(journal, esc_id, now)
    if not journal.escalations.answer(esc_id, status="denied", by=by, now=now, answer=None):
        raise ApprovalError(f"escalation #{esc_id} was answered meanwhile")


def approved_proposals(
    journal: Journal, approved: Sequence[dict[str, Any]] | None = None
) -> list[Proposal]:
    """Approved answers not yet carried out, as proposals for this tick (from `approved`,
    the approved escalations as the caller read them, when given)."""
    out = []
    rows = journal.escalations.recent(status="approved") if approved is None else approved
    for esc in rows:
        ans = esc["answer"] or {}
        out.append(Proposal(
            action=ans["action"], params=ans["params"], proposer=_proposer(str(esc["answered_by"])),
            reason=ans.get("reason") or f"approved escalation #{esc['id']}: {esc['summary']}",
            confidence=float(ans.get("confidence", 1.0)), priority=1000,
            escalation_id=int(esc["id"]),
            # only a person's answer may carry a budget override
            overrides=tuple(ans.get("override", ())) if esc["answered_by"] and not str(
                esc["answered_by"]).startswith("llm:") else (),
        ))  # fmt: skip
    return out


def expire(journal: Journal, now: float) -> list[Proposal]:
    """Close pending escalations past their deadline; their default actions, as proposals."""
    out = []
    for esc in journal.escalations.recent(status="pending"):
        if esc["deadline"] > now:
            continue
        if journal.escalations.answer(
            int(esc["id"]), status="expired", by="deadline", now=now, answer=None
        ):
            default = esc["default_action"] or {"action": "hold", "params": {}}
            out.append(Proposal(
                action=default["action"], params=default.get("params", {}),
                proposer=f"deadline:#{esc['id']}", reason=f"no answer to escalation #{esc['id']} "
                "before its deadline: default action", confidence=1.0, priority=-1,
            ))  # fmt: skip
    return out


def _proposer(answered_by: str) -> str:
    """`llm:<model>` answers keep their name; anybody else answered as a person."""
    return answered_by if answered_by.startswith("llm:") else f"human:{answered_by}"

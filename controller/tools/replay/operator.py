"""A stand-in for the person on call during a replay (opt-in: `--answer-after-s`).

Nobody reads the console in a replay, so by default every escalation runs to its deadline and
its default action, hold: an instance in a state no rule covers (a frozen one) is kept, and
billed, for the rest of the run. Given an answer delay, `answer_due` answers every pending
escalation at least that old the way `fleetgate escalations approve|deny` would, through
`escalation.approvals`:

1. a guard's veto: deny (a person who keeps the budget caps);
2. a situation with a proposed action: approve the first proposal;
3. a situation about an instance: approve `replace` (it is in a state no rule covers);
4. anything else: deny.

An approval becomes a proposal from `human:replay-operator` on the next tick and passes the same
guards as anybody's; it never overrides a budget cap. This is input to the controller, like a
person's answers, not a decision path of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controller.store.journal import Journal
from escalation import approvals

WHO = "replay-operator"


def answer(esc: dict[str, Any]) -> str | None:
    """The action this operator approves for `esc` (None: deny) — steps 1 to 4 above."""
    if esc["kind"] == "guard_veto":
        return None
    proposals = (esc.get("situation") or {}).get("proposals") or []
    if proposals:
        return str(proposals[0]["action"])
    if str(esc["subject"]).startswith("instance:"):
        return "replace"
    return None


def answer_due(journal: Journal, now: float, after_s: float,
               gathered: Sequence[dict[str, Any]] | None = None) -> dict[str, int]:  # fmt: skip
    """Answer the pending escalations raised at least `after_s` ago; counts by verdict.

    `gathered`: the escalations pending when the tick that just ran gathered (its
    `Planned.escalations`). One raised since was raised at the tick's `now`, so with a
    positive `after_s` none is due unless one of those is, and the journal is not read."""
    counts = {"approved": 0, "denied": 0}
    due = (now - float(e["created_at"]) >= after_s for e in gathered or ())
    if gathered is not None and after_s > 0 and not any(due):
        return counts
    for esc in journal.escalations.recent(status="pending"):
        if now - float(esc["created_at"]) < after_s:
            continue
        action = answer(esc)
        if action is not None:
            try:
                approvals.approve(journal, int(esc["id"]), by=WHO, now=now, action=action)
                counts["approved"] += 1
                continue
            except approvals.ApprovalError:
                pass  # an answer the action's schema refuses: deny instead
        approvals.deny(journal, int(esc["id"]), by=WHO, now=now)
        counts["denied"] += 1
    return counts

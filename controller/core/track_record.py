"""The autonomy track record: per (action, situation kind), how people took what fleetgate
proposed, and what that earns or costs the action's autonomy.

An outcome per proposal a person answered (the proposal the escalation's message showed):

    unchanged  approved as proposed (parameters compared without free text: `reason`)
    changed    approved with another action or other parameters (counts against the proposal)
    denied     denied
    reverted   carried out, on its own or approved, then undone by a person's answer within
               `revert_window_s` (1 h): a drain by an undrain of the same instance, an undrain
               by a drain of it, a destroy or replace of an instance by a launch a person asked
               for (a launch has no instance to name: any launch a person asks for that soon
               after fleetgate removed capacity says the removal was wrong)

The situation kind is that of the escalation that asked; a rule's action carried out on its
own counts as `approval`, the kind it is asked under on `propose`. Rules' proposals are asked
under `approval`, `low_confidence`, `conflict` and `rule_error` (RULE_KINDS); the other kinds
are answered by the LLM when one is configured.

What the record decides, per (action, kind), over the last `window_s` (7 days):

1. **promote** (a suggestion, never applied): the action is on `propose` (configured, or
   demoted), with at least `promote_after` proposals approved unchanged and none denied,
   changed or reverted. The operator applies it by setting `gate.actions.<action>: act`;
2. **demote** (applied at once): the action is on `act`, and a denial or a revert happened
   that no earlier demotion was journaled for. The demotion holds (the action is on
   `propose` for the rules' kinds, or for the LLM's answers, as its kind says) while the
   config's `gate` section is the one it was made under: changing the gate lifts it, and
   only what happens under the new gate demotes again.

Pure: no I/O, no clock (`now` is handed in).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from controller.core.policy import Autonomy, Gate

Verdict = Literal["unchanged", "changed", "denied", "reverted"]
RULE_KINDS = frozenset({"approval", "low_confidence", "conflict", "rule_error"})
RULES_OWN = "approval"  # the kind of a rule's action carried out on its own
INVERSE = {"drain": "undrain", "undrain": "drain"}
REMOVES = frozenset({"destroy", "replace"})  # reverted by a person's launch
FREE_TEXT = frozenset({"reason"})
NOBODY = frozenset({"", "deadline", "controller"})


@dataclass(frozen=True)
class Outcome:
    action: str
    kind: str
    verdict: Verdict
    at: float
    ref: str  # "escalation:12" or "action:34": what it is about
    why: str


@dataclass(frozen=True)
class Demotion:
    action: str
    kind: str
    cause: str  # denied | reverted
    ref: str
    at: float
    why: str
    gate: str  # the digest of the gate section it was made under


@dataclass(frozen=True)
class Suggestion:
    action: str
    kind: str
    approved_unchanged: int
    since: float
    config: str  # what to set

    def text(self) -> str:
        return (f"promote {self.action} ({self.kind}) to act: {self.approved_unchanged} "
                f"proposals approved unchanged, none denied, changed or reverted; set "
                f"{self.config}")  # fmt: skip


@dataclass(frozen=True)
class Review:
    record: dict[tuple[str, str], dict[str, int]]
    suggestions: tuple[Suggestion, ...]
    new_demotions: tuple[Demotion, ...]
    in_force: tuple[Demotion, ...]  # journaled and new, under this gate

    def doc(self) -> dict[str, Any]:
        """JSON-ready: the status document's `autonomy`."""
        return {
            "record": [
                {"action": a, "kind": k, **counts} for (a, k), counts in sorted(self.record.items())
            ],  # fmt: skip
            "suggestions": [{**asdict(s), "text": s.text()} for s in self.suggestions],
            "demoted": [asdict(d) for d in self.in_force],
        }


def gate_digest(gate: Gate) -> str:
    text = json.dumps(gate.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _plain(params: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (params or {}).items() if k not in FREE_TEXT}


def answer_outcome(esc: Mapping[str, Any], shown: Mapping[str, Any] | None) -> Outcome | None:
    """A person's answer to the proposal `shown` (None when nothing was proposed, or when the
    answer was not a person's)."""
    by = str(esc.get("answered_by") or "")
    if shown is None or "action" not in shown or by in NOBODY or by.startswith("llm:"):
        return None
    ref, at = f"escalation:{esc['id']}", float(esc.get("answered_at") or esc["created_at"])
    action, kind = str(shown["action"]), str(esc["kind"])
    if esc["status"] == "denied":
        return Outcome(action, kind, "denied", at, ref, f"{by} denied {action} (#{esc['id']})")
    answer = esc.get("answer")
    if not isinstance(answer, Mapping) or "action" not in answer:
        return None
    same = answer["action"] == action and _plain(answer.get("params")) == _plain(
        shown.get("params")
    )
    if same:
        return Outcome(action, kind, "unchanged", at, ref, f"{by} approved #{esc['id']}")
    return Outcome(action, kind, "changed", at, ref,
                   f"{by} answered #{esc['id']} with {answer['action']} instead")  # fmt: skip


def reverts(people: Sequence[Mapping[str, Any]], earlier: Sequence[Mapping[str, Any]],
            window_s: float) -> list[Outcome]:  # fmt: skip
    """The actions (`earlier`: carried out, oldest first, each with the `kind` of the
    escalation it answered, None for a rule's own) that a person's action (`people`) undid
    within `window_s`."""
    out, taken = [], set()
    for p in people:
        for a in reversed(earlier):
            if a["id"] in taken or not p["at"] - window_s <= a["at"] < p["at"]:
                continue
            undoes = (INVERSE.get(str(a["action"])) == p["action"] and a["target"] == p["target"]
                      or a["action"] in REMOVES and p["action"] == "launch")  # fmt: skip
            if not undoes:
                continue
            taken.add(a["id"])
            kind = str(a.get("kind") or RULES_OWN)
            out.append(Outcome(str(a["action"]), kind, "reverted", float(p["at"]),
                               f"action:{a['id']}", f"{p['proposer']} {p['action']} "
                               f"{p['target']} undid action #{a['id']}"))  # fmt: skip
            break
    return out


def in_force(journaled: Iterable[Mapping[str, Any]], gate: Gate) -> list[Demotion]:
    """The journaled demotions made under this gate (changing the gate lifts them)."""
    digest = gate_digest(gate)
    return [Demotion(**{k: d[k] for k in Demotion.__dataclass_fields__})
            for d in journaled if d.get("gate") == digest]  # fmt: skip


def review(outcomes: Sequence[Outcome], gate: Gate, autonomy: Autonomy, now: float,
           journaled: Sequence[Mapping[str, Any]], gate_since: float) -> Review:  # fmt: skip
    """Steps 1 and 2 (module docstring). `gate_since`: since when the gate is this one; only
    what happened since demotes (a denial made while an action was demoted does not demote it
    again once the operator changed the gate)."""
    since = now - autonomy.window_s
    recent = [o for o in outcomes if o.at >= since]
    record: dict[tuple[str, str], dict[str, int]] = {}
    for o in recent:
        counts = record.setdefault((o.action, o.kind), dict.fromkeys(
            ("unchanged", "changed", "denied", "reverted"), 0))  # fmt: skip
        counts[o.verdict] += 1
    held = in_force(journaled, gate)
    done = {str(d.get("ref")) for d in journaled}
    digest, new = gate_digest(gate), list[Demotion]()
    for o in recent:
        demoted = any((d.action, d.kind) == (o.action, o.kind) for d in [*held, *new])
        if o.verdict in ("denied", "reverted") and o.ref not in done and not demoted \
                and o.at >= gate_since and _mode(gate, o.action) == "act":  # fmt: skip
            new.append(Demotion(o.action, o.kind, o.verdict, o.ref, o.at, o.why, digest))
    down = {(d.action, d.kind) for d in [*held, *new]}
    suggestions = []
    for (action, kind), c in sorted(record.items()):
        on_propose = _mode(gate, action) == "propose" or (action, kind) in down
        clean = c["denied"] == c["changed"] == c["reverted"] == 0
        if on_propose and clean and c["unchanged"] >= autonomy.promote_after:
            suggestions.append(Suggestion(action, kind, c["unchanged"], since,
                                          f"gate.actions.{action}: act"))  # fmt: skip
    return Review(record, tuple(suggestions), tuple(new), tuple([*held, *new]))


def _mode(gate: Gate, action: str) -> str:
    return "observe" if gate.mode == "observe" else gate.actions.get(action, gate.mode)  # type: ignore[call-overload]


def demoted_actions(demotions: Iterable[Demotion]) -> tuple[set[str], set[str]]:
    """(actions demoted for rules' proposals, actions demoted for the LLM's answers)."""
    rules, llm = set[str](), set[str]()
    for d in demotions:
        (rules if d.kind in RULE_KINDS else llm).add(d.action)
    return rules, llm

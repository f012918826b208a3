"""Decide: facts and what fired in the rule engine → proposals, unmatched facts, a gated plan.

Pure: no network, no database, no clock (`now` is an argument). The rule engine's matches come
in as data; `controller.service.tick` runs the engine. Steps:

1. (in `controller.rules.fire`) each rule firing is turned into a proposal, its parameters
   from the rule's sandboxed expressions, validated against the action schema; a rule whose
   parameters do not evaluate is a doubt;
2. find unmatched facts: outside `normal` (the engine's abnormal detectors fired) and claimed by
   no rule;
3. lower confidence where the evidence is weak (a sensor not ok, a plan removing a large share);
   an `escalate` proposal becomes a `requested` doubt (it is never acted on), and an answer to
   an escalation naming an action that is not `overridable` is void;
4. merge duplicates and resolve conflicts per target by priority; a tie is a conflict (a
   `notify` competes only with the same message: it changes nothing);
5. gate each survivor: below the threshold, or on `propose` autonomy → ask; `observe` → record.
   `gate` is the one confidence/autonomy gate: the escalation router judges the LLM's answers
   with it too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from controller.core.actions import ActionName, descriptor
from controller.core.brief import brief
from controller.core.matches import Match
from controller.core.model import Decision, Proposal
from controller.core.policy import DecideSettings, Gate

# The fields that make an unmatched fact a different situation (its fingerprint's key).
KEY_FIELDS = {
    "instance": ("status", "stage", "daemon", "sidecar"),
    "sensor": ("name", "state"),
    "demand": ("task",),
    "fleet": (),
}
# Health probes follow from the status of an instance that does not run (a frozen or stopped
# container's heartbeats go stale one after the other): there they are not a change.
RUNNING_ONLY_KEY_FIELDS = ("daemon", "sidecar")


SENSOR_WORDS = {"provider": "fleet listing", "demand": "demand reading"}


@dataclass(frozen=True)
class Doubt:
    """Something rules cannot decide, to be escalated (see escalation.situation)."""

    # unmatched, sensing_failure, low_confidence, conflict, rule_error, guard_veto, approval,
    # requested
    kind: str
    subject: str
    summary: str
    facts: tuple[dict[str, Any], ...] = ()
    key: dict[str, Any] = field(default_factory=dict)
    proposals: tuple[Proposal, ...] = ()
    people_only: bool = False  # skip the LLM (e.g. its own answer was vetoed)


@dataclass(frozen=True)
class Decided:
    decisions: tuple[Decision, ...]
    doubts: tuple[Doubt, ...]
    unmatched: tuple[str, ...]  # fact ids


def subject_of(fact: dict[str, Any]) -> str:
    kind = fact.get("kind", "?")
    if kind == "instance":
        return f"instance:{fact['id']}"
    return str(fact.get("id", kind))


def unmatched(matches: Sequence[Match], facts: dict[str, dict[str, Any]]) -> list[Doubt]:
    """Step 2: facts outside `normal` that no rule claims, one doubt each."""
    abnormal = {fid for m in matches if m.abnormal_kind for fid in m.facts.values()}
    claimed = {fid for m in matches if m.rule for fid in m.facts.values()}
    doubts = []
    for fid in sorted(abnormal - claimed):
        fact = facts[fid]
        kind = str(fact["kind"])
        key = {k: fact.get(k) for k in KEY_FIELDS.get(kind, ())}
        shown = ", ".join(f"{k}={v}" for k, v in key.items())
        if kind == "instance" and fact.get("status") != "running":
            key = {k: v for k, v in key.items() if k not in RUNNING_ONLY_KEY_FIELDS}
        summary = f"{kind} {fact.get('id')} is outside the declared steady state and no rule "
        summary += f"covers it ({shown})" if shown else "covers it"
        if kind == "sensor" and fact.get("state") != "ok":  # an ok one is only unmatched
            what = SENSOR_WORDS.get(str(fact.get("name")), f"sensor {fact.get('name')}")
            summary = (f"{what} {fact.get('state')}: {fact.get('detail') or 'no detail'}; fleet "
                       "changes are held until it recovers")  # fmt: skip
            doubts.append(Doubt("sensing_failure", subject_of(fact), summary, (fact,), key))
            continue
        doubts.append(Doubt("unmatched", subject_of(fact), summary, (fact,), key))
    return doubts


def weigh(props: list[Proposal], facts: dict[str, dict[str, Any]], gate: Any) -> list[Proposal]:
    """Step 3: lower confidence where the evidence is weak."""
    # a stale sensor weakens the evidence; a failed one holds fleet changes in the guards and is
    # escalated once as a sensing failure (lowering confidence too would only add questions)
    sensors_bad = [
        f for f in facts.values() if f.get("kind") == "sensor" and f.get("state") == "stale"
    ]
    fleet = facts.get("fleet", {})
    size = max(int(fleet.get("instances", 0)), 1)
    doubtful = {p.target for p in props if _removes_work(p, facts)}
    large = len(doubtful) > 1 and len(doubtful) / size > gate.large_change_share
    out = []
    for p in props:
        c = p.confidence
        if sensors_bad:
            c *= gate.weak_evidence_factor
        if large and p.target in doubtful:
            c *= gate.large_change_factor
        out.append(replace(p, confidence=round(c, 4)) if c != p.confidence else p)
    return out


def _removes_work(p: Proposal, facts: dict[str, dict[str, Any]]) -> bool:
    """A destructive proposal on an instance that holds tasks or only looks dead.

    Many of these at once is doubtful (a host-wide outage, or a sensing glitch); removing idle
    instances when the queue is empty is routine scale-down and not counted, nor is removing
    parked ones: fleetgate stopped them itself, so stopped is what they should look like.
    """
    if not descriptor(p.action).destructive:
        return False
    inst = facts.get(str(p.params.get("instance")), {})
    if int(inst.get("tasks_running", 0)) > 0:
        return True
    return inst.get("status") != "running" and not inst.get("parked", False)


def _contest(p: Proposal) -> str:
    """What a proposal competes for. A `notify` changes nothing, so it neither conflicts with
    nor supersedes an action on the fleet (a rule that tells people of a forecast stopped the
    scaling rules that matched the same tick); notifications compete only with the same
    message, so two rules' different messages both go out."""
    if p.action == "notify":
        return f"notify:{p.params.get('message')}"
    return p.target


def _matched(
    props: Sequence[Proposal], facts: dict[str, dict[str, Any]]
) -> tuple[dict[str, Any], ...]:
    """The facts `props` matched, each once, in the order the proposals name them: the
    evidence a person or the LLM reads about a proposal put to them."""
    ids = dict.fromkeys(fid for p in props for fid in p.facts if fid in facts)
    return tuple(facts[fid] for fid in ids)


def resolve(props: list[Proposal], facts: dict[str, dict[str, Any]] | None = None
            ) -> tuple[list[Proposal], list[Decision], list[Doubt]]:  # fmt: skip
    """Step 4: merge duplicates, pick by priority per target; a tie of different actions asks
    (with the facts the tied proposals matched, from `facts`)."""
    by_target: dict[str, list[Proposal]] = defaultdict(list)
    for p in props:
        by_target[_contest(p)].append(p)
    winners: list[Proposal] = []
    lost: list[Decision] = []
    doubts: list[Doubt] = []
    for target, group in by_target.items():
        group.sort(key=lambda p: (-p.priority, -p.confidence, p.proposer))
        top = [p for p in group if p.priority == group[0].priority]
        kinds = {p.action for p in top}
        if len(kinds) > 1 and not all(p.escalation_id for p in top):
            names = ", ".join(f"{p.proposer} wants {p.action}" for p in top)
            doubts.append(
                Doubt(
                    "conflict",
                    target,
                    f"rules disagree about {target}: {names}",
                    _matched(top, facts or {}),
                    key={"actions": sorted(kinds)},
                    proposals=tuple(top),
                )
            )
            lost += [Decision(p, "ask", f"conflict on {target}: {names}") for p in top]
            continue
        winner = group[0]
        winners.append(winner)
        for p in group[1:]:
            why = (
                f"same action also proposed by {winner.proposer}"
                if p.action == winner.action
                else f"superseded by {winner.proposer} (priority {winner.priority})"
            )
            lost.append(Decision(p, "superseded", why))
    return winners, lost, doubts


def requests(props: Sequence[Proposal], facts: dict[str, dict[str, Any]]
             ) -> tuple[list[Proposal], list[Decision], list[Doubt]]:  # fmt: skip
    """Step 3, continued: take out what is never gated or acted on.

    An answer to an escalation naming an action that is not `overridable` is void (a noop the
    tick journals against that escalation); an `escalate` proposal becomes a `requested` doubt,
    its summary the proposal's reason, its facts the facts it matched. Returns the rest, the
    void answers and the requests."""
    rest: list[Proposal] = []
    void: list[Decision] = []
    asked: list[Doubt] = []
    for p in props:
        if p.escalation_id is not None and not descriptor(p.action).overridable:
            why = f"an answer cannot be {p.action!r}: nothing done (answer with an action)"
            void.append(Decision(p, "noop", why))
        elif p.action == "escalate":
            asked.append(_requested(p, facts))
        else:
            rest.append(p)
    return rest, void, asked


def _requested(p: Proposal, facts: dict[str, dict[str, Any]]) -> Doubt:
    bound = tuple(facts[fid] for fid in p.facts if fid in facts)
    subject = next((subject_of(f) for f in bound), "fleet")
    reason = str(p.params.get("reason") or "").strip() or p.reason
    return Doubt(
        "requested",
        subject,
        f"{p.proposer} asks a person to decide: {reason}",
        bound,
        key={"proposer": p.proposer},
    )


def gate(p: Proposal, settings: DecideSettings | Gate) -> Decision:
    """Step 5: act, ask or observe, with the reason in words. The one gate: rules' proposals
    (with the decide settings) and the LLM's answers (with the router's Gate) pass it alike."""
    g = settings.gate if isinstance(settings, DecideSettings) else settings
    if p.escalation_id is not None and p.proposer.startswith("human:"):
        return Decision(p, "act", f"approved by {p.proposer[6:]} (escalation #{p.escalation_id})")
    if p.escalation_id is not None and p.proposer.startswith("llm:"):
        # the LLM's confidence and the action's autonomy were checked when it answered
        return Decision(
            p,
            "act",
            f"answered by {p.proposer} with confidence {p.confidence:.2f} "
            f"(escalation #{p.escalation_id})",
        )
    if p.confidence < g.confidence_threshold:
        return Decision(
            p,
            "ask",
            f"confidence {p.confidence:.2f} is below the threshold {g.confidence_threshold:.2f}",
        )
    if g.mode == "observe":
        return Decision(p, "observe", "mode is observe: decided and recorded, not acted on")
    mode = g.actions.get(cast(ActionName, p.action), g.mode)
    if mode == "propose":
        return Decision(p, "ask", f"autonomy for {p.action!r} is propose: a human approves")
    how = "matched" if p.proposer.startswith("rule:") else "proposes it"
    return Decision(
        p,
        "act",
        f"{p.proposer} {how} with confidence {p.confidence:.2f} "
        f"≥ {g.confidence_threshold:.2f} and {p.action!r} is on act",
    )


def decide(
    facts: Sequence[dict[str, Any]], matches: Sequence[Match],
    fired: tuple[Sequence[Proposal], Sequence[Doubt]], settings: DecideSettings,
    extra: Sequence[Proposal] = (),
) -> Decided:  # fmt: skip
    """Steps 2-5. `fired` is step 1's result (`controller.rules.fire.proposals_from`: the
    rules' proposals and the rule errors); `extra` holds proposals from elsewhere (approved
    answers, follow-ups)."""
    by_id = {str(f["id"]): f for f in facts}
    props, doubts = list(fired[0]), list(fired[1])
    doubts += unmatched(matches, by_id)
    props, void, asked = requests(weigh(props, by_id, settings.gate) + list(extra), by_id)
    doubts += asked
    winners, decisions, conflicts = resolve(props, by_id)
    decisions = void + decisions
    doubts += conflicts
    for p in winners:
        d = gate(p, settings)
        decisions.append(d)
        if d.verdict == "ask":
            kind = (
                "low_confidence"
                if p.confidence < settings.gate.confidence_threshold
                else "approval"
            )
            doubts.append(
                Doubt(
                    kind,
                    p.target,
                    f"{p.proposer} proposes {p.action} {brief(p.params)}: {d.why}",
                    _matched((p,), by_id),
                    key={"action": p.action},
                    proposals=(p,),
                )
            )
    ids = tuple(
        sorted(
            {
                str(f["id"])
                for d in doubts
                if d.kind in ("unmatched", "sensing_failure")
                for f in d.facts
            }
        )
    )
    return Decided(tuple(decisions), tuple(doubts), ids)

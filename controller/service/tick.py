"""One tick of the controller, and the plan it acts on.

`Controller.plan(now)` senses and decides without writing anything (what `fleetgate explain`
prints). `Controller.tick()` is one whole pass:

1. read the clock once (the simulator's virtual clock advances first);
2. sense: fleet listing and demand; a failure is a failed sensor, never "empty";
3. track: update per-instance history (stage, status, deaths, restarts, benchmarks);
4. facts: observation + history → flat facts with derived temporal fields;
5. match: the rule engine says which rules fired and which facts are outside `normal`;
6. decide: proposals (rules, approved answers, expired defaults, replacement follow-ups),
   unmatched facts, conflicts, the confidence/autonomy gate;
7. guards: limits, budgets, cooldowns, drain before destroy, sensing holds;
8. journal each decision (intent before acting) and act on the allowed ones;
9. escalate what rules could not decide (deduplicated), and record the tick.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from controller.core import guards
from controller.core.decide import Decided, Doubt, decide
from controller.core.facts import build_facts
from controller.core.matches import Match
from controller.core.model import Decision, Instance, Observation, Plan, Proposal, SensorStatus
from controller.core.policy import DecideSettings
from controller.core.sanity import check_listing
from controller.core.track import Event, History, Track, advance
from controller.fleet.actuator import Actuator, Job
from controller.fleet.base import (
    DemandSensor,
    Provider,
    ProviderError,
    SensorError,
    StaleReading,
)
from controller.rules.fire import proposals_from
from controller.rules.source import RulesSource
from controller.store.journal import Journal
from escalation import approvals
from escalation.router import Escalator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Planned:
    """Everything one tick worked out before acting (what `explain` shows)."""

    now: float
    observation: Observation
    history: History
    tracks: dict[str, Track]
    events: list[Event]
    facts: list[dict[str, Any]]
    matches: list[Match]
    decided: Decided
    plan: Plan
    doubts: tuple[Doubt, ...]
    by_id: dict[str, dict[str, Any]]
    """The facts by id."""


def sense(provider: Provider, demand: DemandSensor, now: float,
          tracked: Collection[str] = (),
          destroyed: Collection[str] = ()) -> Observation:  # fmt: skip
    """Step 2. Each sensor independently; a failure is recorded, never read as zero.

    Tracked instances that a good listing lacks (and that we did not destroy) are looked up
    one by one where the provider can (`confirm_gone`): vast's listing has answered empty while
    instances billed, and an instance destroyed in vast's console, or by a destroy whose answer
    timed out, is gone only when vast says so. The rest stay `unconfirmed`."""
    sensors: list[SensorStatus] = []
    instances = _read("provider", provider.list_instances, sensors)
    queue = _read("demand", demand.demand, sensors)
    foreign = tuple(getattr(provider, "foreign", ()))
    obs = Observation(now, tuple(instances), tuple(queue), tuple(sensors), foreign)
    confirm = getattr(provider, "confirm_gone", None)
    if confirm is None or not obs.sensor_ok("provider"):
        return obs
    listed = {i.id for i in instances}
    missing = sorted(set(tracked) - listed - set(destroyed), key=_numeric)
    if not missing:
        return obs
    try:
        gone = set(confirm(missing))
    except (ProviderError, SensorError) as exc:
        log.warning("sensing: cannot confirm %d missing instance(s): %s", len(missing), exc)
        gone = set()
    return replace(obs, confirmed_gone=tuple(i for i in missing if i in gone),
                   unconfirmed=tuple(i for i in missing if i not in gone))  # fmt: skip


def _numeric(instance_id: str) -> tuple[int, str]:
    return (int(instance_id), "") if instance_id.isdigit() else (0, instance_id)


def _read(name: str, read: Callable[[], list[Any]], sensors: list[SensorStatus]) -> list[Any]:
    try:
        values = read()
    except StaleReading as exc:
        sensors.append(SensorStatus(name, "stale", str(exc)[:300]))
        log.error("sensing: %s is stale: %s", name, exc)
        return []
    except (ProviderError, SensorError) as exc:
        sensors.append(SensorStatus(name, "failed", str(exc)[:300]))
        log.error("sensing: %s failed: %s", name, exc)
        return []
    sensors.append(SensorStatus(name, "ok"))
    return values


def followups(journal: Journal, obs: Observation, now: float, *, write: bool) -> list[Proposal]:
    """Replacements in flight: destroy the old instance once its replacement runs (or late), or
    at once when the old one serves nothing (stuck in a boot stage, frozen, its daemon down):
    it is kept only as capacity while the replacement boots, and then it is none."""
    if not obs.sensor_ok("provider"):
        return []
    by_label = {i.label: i for i in obs.instances}
    live = {i.id: i for i in obs.instances}
    out = []
    for r in journal.replacements():
        old, new = r["old_id"], by_label.get(r["new_label"])
        if old not in live:
            if write:
                journal.set_replacement(old, "done", new.id if new else None)
            continue
        if write and new is not None and not r["new_id"]:
            journal.set_replacement(old, "waiting", new.id)
        if new is not None and new.stage == "running":
            why = f"its replacement {new.id} is running"
        elif now >= r["deadline"]:
            why = "its replacement did not run before the deadline"
        elif not serving(live[old]):
            why = "it serves nothing while its replacement boots"
        else:
            continue
        out.append(
            Proposal(
                "destroy",
                {"instance": old},
                "controller:replace",
                f"replace (action #{r['action_id']}): {why}",
                1.0,
                100,
            )
        )
    return out


def serving(inst: Instance) -> bool:
    """Whether the instance proves now: running, past its benchmark, its daemon up."""
    return inst.status == "running" and inst.stage == "running" and inst.daemon == "up"


class Controller:
    def __init__(
        self,
        *,
        journal: Journal,
        provider: Provider,
        demand: DemandSensor,
        rules: RulesSource,
        settings: DecideSettings,
        escalator: Escalator,
        clock: Callable[[], float],
        before_tick: Callable[[], None] | None = None,
        after_tick: Callable[[], None] | None = None,
        sources: Sequence[Callable[[float], list[Proposal]]] = (),
        on_gone: Callable[[str], None] | None = None,
    ) -> None:
        self.journal = journal
        self.provider = provider
        self.demand = demand
        self.rules = rules
        self.settings = settings
        self.escalator = escalator
        self.clock = clock
        self.before_tick = before_tick
        self.after_tick = after_tick
        self.sources = list(sources)  # more proposals each tick (e.g. agent timeouts)
        self.on_gone = on_gone  # an instance vanished from a good listing (forget its records)
        self.actuator = Actuator(provider, journal, settings.guards)
        self._repeats: dict[tuple[str, ...], float] = {}  # veto -> journaled again after
        self._repeats_pruned = 0.0  # vetoes past their window are dropped once per window

    def _limits(self) -> Any:
        paused = bool(self.journal.get("paused", False)) or self.settings.guards.paused
        return self.settings.guards.model_copy(update={"paused": paused})

    def plan(self, now: float, *, write: bool = False) -> Planned:
        """Steps 2-7: sense and decide. With write=False nothing is stored or changed."""
        hist = self.journal.history(now)
        destroyed = self.journal.destroyed_since(now - 3600)
        sensed = sense(self.provider, self.demand, now, hist.instances, destroyed)
        obs = check_listing(sensed, hist.instances, [*destroyed, *sensed.confirmed_gone])
        if write:  # a crashed run's unfinished actions, reconciled against this listing
            listed = {i.id for i in obs.instances} if obs.sensor_ok("provider") else None
            for r in self.journal.close_interrupted(now, listed):
                log.warning("action #%s %s on %s was interrupted: %s", r["id"], r["action"],
                            r["target"], r["status"])  # fmt: skip
        tracks, events = advance(hist, obs, now)
        recent = tuple(e for e in events if e.kind in ("death", "restart"))
        hist = replace(hist, instances=tracks, events=hist.events + recent)
        hist = replace(hist, pending_launches=len(self._in_flight(obs, now, write=write)))
        facts = build_facts(obs, hist, now)
        matches = self.rules.engine.match(facts, now)
        extra = approvals.approved_proposals(self.journal) + followups(
            self.journal, obs, now, write=write
        )
        if write:  # sources may change state (an overdue command is closed once)
            extra += [p for source in self.sources for p in source(now)]
        fired = proposals_from(matches, {str(f["id"]): f for f in facts}, self.rules.book,
                               self.settings, now)  # fmt: skip
        decided = decide(facts, matches, fired, self.settings, extra)
        by_id = {str(f["id"]): f for f in facts}
        ctx = guards.Context(by_id, hist, self._limits(), now)
        checked, vetoes = guards.check(decided.decisions, ctx)
        moot = {id(was.proposal) for was, now_ in zip(decided.decisions, checked, strict=True)
                if was.verdict == "ask" and now_.verdict != "ask"}  # fmt: skip
        if moot:  # nothing a person could approve: not asked
            decided = replace(
                decided,
                doubts=tuple(
                    x for x in decided.doubts if not any(id(p) in moot for p in x.proposals)
                ),
            )
        return Planned(
            now,
            obs,
            hist,
            tracks,
            events,
            facts,
            matches,
            decided,
            Plan(tuple(checked)),
            decided.doubts + tuple(vetoes),
            by_id,
        )

    def _in_flight(self, obs: Observation, now: float, *, write: bool) -> list[str]:
        """Labels of launches on their way: not yet listed, not yet given up on.

        A launch whose label shows up in the listing is confirmed (late creates included); one
        unconfirmed for `launch_pending_s` is recorded as lost. While the listing failed,
        every recent launch is assumed on its way (never launch blind).
        """
        window = self.settings.guards.launch_pending_s
        rows = self.journal.recent_launches(now - window)
        if not rows:
            return []
        if not obs.sensor_ok("provider"):
            return [str(r["key"]) for r in rows]
        by_label = {i.label: i for i in obs.instances}
        ours = [str(r["result"]["instance"]) for r in rows if r["result"].get("instance")]
        seen = self.journal.seen_instances(now - window, ours) | {i.id for i in obs.instances}
        pending = []
        for r in rows:
            label, listed = str(r["key"]), by_label.get(str(r["key"]))
            if listed is not None or r["result"].get("instance") in seen:
                if write and r["status"] != "ok" and listed is not None:
                    self.journal.finish(r["id"], now, "ok", {"instance": listed.id, "label": label,
                                                             "confirmed_late": True})  # fmt: skip
                continue
            unknown_for = now - float(r["at"])
            if r["status"] == "unknown" and unknown_for >= self.settings.guards.launch_unknown_s:
                if write:  # good listings this long after the create lack its label
                    self.journal.finish(r["id"], now, "lost", {"label": label, "note": "the "
                                        "create answered nothing clear and its label was never "
                                        f"listed in {unknown_for:.0f}s"})  # fmt: skip
                continue
            if now - float(r["at"]) >= window:
                if write and r["status"] != "ok":
                    self.journal.finish(r["id"], now, "lost", {"label": label, "note": "never "
                                        "listed within the pending window"})  # fmt: skip
                continue
            pending.append(label)
        return pending

    def tick(self) -> Planned:
        """Steps 1-9."""
        if self.before_tick:
            self.before_tick()
        now = self.clock()
        reloaded = self.rules.reload()  # a file change (or SIGHUP) takes effect here
        if reloaded is not None:
            self.journal.add_reload(now, reloaded.ok, reloaded.digest, reloaded.problems)
        tick_id = self.journal.start_tick(now, self.rules.book.digest)
        expired = approvals.expire(self.journal, now)
        for p in expired:
            self.escalator.closed(int(p.proposer.split("#")[1]))
        planned = self.plan(now, write=True)
        if expired:
            extra_plan, _ = guards.check(
                [Decision(p, "act", p.reason) for p in expired],
                guards.Context({}, planned.history, self._limits(), now),
            )
            planned = replace(planned, plan=Plan(planned.plan.decisions + tuple(extra_plan)))
        self.journal.save_tracks(planned.tracks, planned.events)
        if self.on_gone is not None:
            for e in planned.events:
                if e.kind == "gone":
                    self.on_gone(e.instance_id)
        by_id = planned.by_id
        counts, vetoed_answers = self._carry_out(planned, tick_id, by_id)
        fleet = by_id.get("fleet", {})
        targets: set[str] = set()
        for f in planned.facts:
            if f["kind"] == "instance":
                targets.add(str(f["id"]))
                targets.add(str(f["machine_id"]))
        doubts = planned.doubts + tuple(vetoed_answers)
        budget = self._budget(fleet, planned)
        raised = self.escalator.raise_all(doubts, fleet, budget, now, targets)
        if all(s.state == "ok" for s in planned.observation.sensors):
            self.escalator.resolve_cleared(planned.doubts, fleet, now)
        summary = {
            **counts,
            "escalated": len(raised),
            "doubts": len(planned.doubts),
            "instances": fleet.get("instances"),
            "pending": fleet.get("pending"),
            "spend_per_h": fleet.get("spend_per_h"),
            "running_tasks": fleet.get("running_tasks"),
            "foreign": [
                {"id": i.id, "label": i.label, "status": i.status}
                for i in planned.observation.foreign[:20]
            ],  # fmt: skip
        }
        self.journal.finish_tick(tick_id, self.clock(), summary)  # the real end, after acting
        if tick_id % 10 == 0:
            log.info(
                "[%s] tick %d: %s instance(s), %s task(s) pending, $%s/h, %d escalation(s) pending",
                _clock(now),
                tick_id,
                summary["instances"],
                summary["pending"],
                summary["spend_per_h"],
                len(self.journal.escalations(status="pending")),
            )
        if self.after_tick:
            self.after_tick()
        return planned

    def _carry_out(
        self, planned: Planned, tick_id: int, facts: dict[str, dict[str, Any]]
    ) -> tuple[dict[str, int], list[Doubt]]:
        """Journal and act; also returns the LLM answers the guards refused (for people)."""
        counts: dict[str, int] = {}
        refused: list[Doubt] = []
        effective = {d.proposal.target for d in planned.plan.decisions if d.verdict not in _QUIET}
        for d in planned.plan.decisions:
            counts[d.verdict] = counts.get(d.verdict, 0) + 1
            if not _worth_recording(d, effective) or self._repeated(d, planned.now):
                continue
            action_id = self._record(d, tick_id, planned.now)
            if d.verdict == "act":
                job = Job(d, action_id, tick_id, planned.history, planned.now, facts)
                outcome = self.actuator.execute(job)
                log.info("[%s] %s %s → %s%s | %s", _clock(planned.now), d.effective_action,
                         _brief(d.effective_params), outcome.status, _result(outcome.result),
                         _who(d))  # fmt: skip
                status = "executed" if outcome.status != "failed" else "failed"
            else:
                status = {"veto": "vetoed"}.get(d.verdict, d.verdict)
            if d.proposal.escalation_id is not None and d.verdict in ("act", "veto", "noop"):
                status = "void" if d.verdict == "noop" else status
                self.journal.set_escalation_status(d.proposal.escalation_id, status, action_id)
                self.escalator.closed(d.proposal.escalation_id)
                if d.verdict == "veto" and d.proposal.proposer.startswith("llm:"):
                    refused.append(_refused(d))
        return counts, refused

    def _repeated(self, d: Decision, now: float) -> bool:
        """The same veto as one journaled less than VETO_REPEAT_S ago: not journaled again
        (a limit that holds an action back would otherwise add a row every tick).

        The same veto is the same action, target, parameters and guard; the guard's wording
        is not compared, since it counts time ("30s ago", "60s ago", ...)."""
        if d.verdict != "veto" or d.proposal.escalation_id is not None:
            return False
        if now >= self._repeats_pruned + VETO_REPEAT_S:  # forget the ones past their time
            self._repeats = {k: t for k, t in self._repeats.items() if t > now}
            self._repeats_pruned = now
        key = (d.effective_action, d.proposal.target, d.guard,
               json.dumps(d.effective_params, sort_keys=True, default=str))  # fmt: skip
        if self._repeats.get(key, 0.0) > now:
            return True
        self._repeats[key] = now + VETO_REPEAT_S
        return False

    def _record(self, d: Decision, tick_id: int, now: float) -> int:
        status = (
            "intent"
            if d.verdict == "act"
            else {"veto": "vetoed", "ask": "asked", "observe": "observed"}.get(d.verdict, d.verdict)
        )
        return self.journal.record(
            tick_id=tick_id, now=now, action=d.effective_action, target=d.proposal.target,
            params=d.effective_params, proposer=d.proposal.proposer, reason=d.proposal.reason,
            confidence=d.proposal.confidence, verdict=d.verdict, why=d.why, guard=d.guard,
            status=status, escalation_id=d.proposal.escalation_id,
        )  # fmt: skip

    def _budget(self, fleet: dict[str, Any], planned: Planned) -> dict[str, Any]:
        lim = self.settings.guards
        return {
            "spend_left_per_h": round(
                lim.max_spend_per_hour - float(fleet.get("spend_per_h", 0)), 2
            ),
            "launches_left_1h": lim.max_launches_per_hour
            - planned.history.launches_since(planned.now - 3600),
            "max_instances": lim.max_instances,
        }


_QUIET = ("noop", "superseded")
VETO_REPEAT_S = 600.0


def _refused(d: Decision) -> Doubt:
    """An LLM answer the guards vetoed: people decide now (the LLM is not asked again)."""
    p = d.proposal
    return Doubt(
        "guard_veto",
        p.target,
        f"{p.proposer} answered escalation #{p.escalation_id} "
        f"with {p.action} {_brief(p.params)}, but the guards refused it: {d.why}",
        key={"guard": d.guard, "escalation": p.escalation_id},
        proposals=(p,),
        people_only=True,
    )


def _worth_recording(d: Decision, effective: set[str]) -> bool:
    """Noops are not journaled (unless they answer a human); a superseded proposal only when
    the proposal that won did something (else every tick would repeat it)."""
    if d.verdict == "noop":
        return d.proposal.escalation_id is not None
    if d.verdict == "superseded":
        return d.proposal.target in effective
    return True


def _brief(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _clock(now: float) -> str:
    return time.strftime("%m-%d %H:%M", time.gmtime(now))


def _result(result: dict[str, Any]) -> str:
    shown = {k: v for k, v in result.items() if k in ("launched", "replacement", "error")}
    return f" ({_brief(shown)})" if shown else ""


def _who(d: Decision) -> str:
    p = d.proposal
    if p.proposer.startswith("rule:"):
        return f"rule {p.proposer[5:]}: {p.reason}"
    return f"{p.proposer}: {p.reason}"

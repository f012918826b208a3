"""Guards: the limits every plan passes, whoever proposed it (a rule, the LLM, a human).

Pure: no network, no database, no clock. Decisions are checked in order, and each one's effect
(launches, removals, spend) counts against the budgets of the ones after it; the plan's
undrains count as capacity for every `scale_to` of the tick, whatever their order. A guard may
veto, trim a count, turn `scale_to` into the `launch` it implies, or turn `destroy` into `drain`
(drain before destroy). Vetoes that need a person (spend cap) become doubts to escalate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from controller.core.actions import ActionName, Sensor, descriptor
from controller.core.decide import Doubt
from controller.core.model import Decision
from controller.core.policy import Guards
from controller.core.track import History

# Why an action a failed sensor holds (its descriptor's `held_on_sensing_failure`) waits.
_HELD_WHY: dict[Sensor, str] = {
    "provider": "the fleet listing failed or is stale: holding fleet changes",
    "demand": "demand is unknown (sensor failed or stale): holding scaling",
}


@dataclass
class _Budget:
    """What this tick's earlier decisions already used."""

    launched: int = 0
    removed: int = 0
    spend: float = 0.0
    returning: int = 0
    """Drained instances this tick's plan undrains or parked ones it starts: capacity back
    without a new rental."""
    started: int = 0
    """Parked instances started so far (in `launched` for the caps, in `returning` already)."""
    parked: int = 0
    """Instances this tick's plan stops (parks)."""
    starts_wanted: int | None = None
    """Starts the plan's `scale_to` leaves room for (None: the plan has no `scale_to`)."""
    start_first: frozenset[str] | None = None
    """The parked instances those starts go to: the fastest (None: any)."""


@dataclass(frozen=True)
class Context:
    facts: dict[str, dict[str, Any]]
    hist: History
    limits: Guards
    now: float

    @property
    def fleet(self) -> dict[str, Any]:
        return self.facts.get("fleet", {})

    def sensor_ok(self, name: str) -> bool:
        fact = self.facts.get(f"sensor:{name}")
        return fact is None or fact.get("state") == "ok"


def _veto(d: Decision, guard: str, why: str) -> Decision:
    return replace(d, verdict="veto", guard=guard, why=why)


def _noop(d: Decision, why: str) -> Decision:
    return replace(d, verdict="noop", why=why)


def _launch_room(ctx: Context, b: _Budget, overridden: frozenset[str] = frozenset()
                 ) -> tuple[int, str]:  # fmt: skip
    """How many launches the limits allow now (less those overridden), and the tightest.
    Parked instances count against `max_parked`, not `max_instances`: a start of one counts
    as a launch."""
    lim, fleet = ctx.limits, ctx.fleet
    # launches on their way (created, not listed yet) bill like listed instances
    on_way = int(fleet.get("pending_launches", 0))
    spend = float(fleet.get("spend_per_h", 0.0)) + on_way * lim.launch_dph_estimate
    spend_left = lim.max_spend_per_hour - spend - b.spend
    rooms = {
        "max_instances": lim.max_instances - int(fleet.get("instances", 0))
        + int(fleet.get("parked", 0)) - on_way - b.launched,
        "max_launches_per_tick": lim.max_launches_per_tick - b.launched,
        "max_launches_per_hour": lim.max_launches_per_hour - ctx.hist.launches_since(ctx.now - 3600)
        - b.launched,
        "max_spend_per_hour": math.floor(spend_left / lim.launch_dph_estimate + 1e-9),
    }  # fmt: skip
    rooms = {k: v for k, v in rooms.items() if k not in overridden} or {"override": 1_000_000}
    name = min(rooms, key=lambda k: rooms[k])
    return max(rooms[name], 0), name


_CAPS = ("max_instances", "max_spend_per_hour")  # their vetoes escalate on their own
# a proposal these would veto is not put to a person: the caps escalate on their own, and a
# sensing failure escalates as itself while the facts the proposal was made from are not
# the fleet's (a fleet fact without the listing); the rule proposes again once they are
_UNASKED = (*_CAPS, "sensing")
# the budget caps a person's answer may exceed (per action, whether an answer may name it at
# all is the descriptor's `overridable`)
OVERRIDABLE = ("max_instances", "max_launches_per_tick", "max_launches_per_hour",
               "max_spend_per_hour")  # fmt: skip


def _launch(d: Decision, count: int, ctx: Context, b: _Budget, doubts: list[Doubt]) -> Decision:
    room, limit = _launch_room(ctx, b, frozenset(d.proposal.overrides))
    if d.proposal.overrides:
        d = replace(d, why=f"{d.why}; budget override by {d.proposal.proposer} "
                    f"({', '.join(d.proposal.overrides)}), journaled")  # fmt: skip
    if room <= 0:
        if limit in ("max_spend_per_hour", "max_instances"):
            p = d.proposal
            one = p.action in ("replace", "start")  # of an instance: its fact is evidence
            what = (f"wants to {p.action} instance {p.params['instance']}, which needs room "
                    f"for {count} more instance(s)," if one
                    else f"wants {count} more instance(s)")  # fmt: skip
            inst = ctx.facts.get(str(p.params.get("instance"))) if one else None
            doubts.append(
                Doubt(
                    "guard_veto",
                    "fleet",
                    f"{p.proposer} {what} but {limit} allows none",
                    facts=(inst,) if inst is not None else (),
                    key={"guard": limit},
                    proposals=(d.proposal,),
                )
            )
        return _veto(d, limit, f"{limit} allows no launch now (wanted {count})")
    n = min(count, room)
    b.launched += n
    b.spend += n * ctx.limits.launch_dph_estimate
    if d.proposal.action in ("replace", "start"):
        return d
    why = d.why if n == count else f"{d.why}; trimmed from {count} to {n} by {limit}"
    return replace(
        d, action="launch", params={"count": n}, why=why, guard="" if n == count else limit
    )


def _scale_to(d: Decision, ctx: Context, b: _Budget, doubts: list[Doubt]) -> Decision:
    want = int(d.proposal.params["count"])
    active = int(ctx.fleet.get("active", 0)) + b.launched - b.started + b.returning
    back = f" ({b.returning} undrained or started this tick)" if b.returning else ""
    if want <= active:
        return _noop(d, f"fleet has {active} active instance(s){back}, target {want}")
    rent_to = d.proposal.params.get("rent_to")
    if rent_to is not None and int(rent_to) < want:
        cap = int(rent_to)
        if cap <= active:
            return _noop(d, f"fleet has {active} active instance(s){back}, target {want}, "
                         f"rents up to {cap}: the rest from the warm pool only")  # fmt: skip
        return _launch(d, cap - active, ctx, b, doubts)
    return _launch(d, want - active, ctx, b, doubts)


def _cooldown(d: Decision, ctx: Context) -> Decision | None:
    action = d.effective_action
    wait = ctx.limits.cooldowns_s.get(cast(ActionName, action))
    last = ctx.hist.last_acted.get(f"{action}:{d.proposal.target}")
    if wait and last is not None and ctx.now - last < wait:
        return _veto(
            d,
            "cooldown",
            f"{action} on {d.proposal.target} {ctx.now - last:.0f}s ago (cooldown {wait:.0f}s)",
        )
    return None


def _destroy(d: Decision, inst: dict[str, Any], ctx: Context, b: _Budget,
             doubts: list[Doubt]) -> Decision:  # fmt: skip
    lim, fleet = ctx.limits, ctx.fleet
    if inst.get("status") == "running" and inst.get("sidecar") == "unknown":
        why = ("its Curio node is unknown (not in harmony_machines at its address): it may hold "
               "tasks, and it cannot be drained first")  # fmt: skip
        doubts.append(Doubt("guard_veto", f"instance:{inst.get('id')}",
                            f"{d.proposal.proposer} wants to destroy instance {inst.get('id')}, "
                            f"but {why}", facts=(inst,), key={"guard": "unknown_node"},
                            proposals=(d.proposal,)))  # fmt: skip
        return _veto(d, "drain_before_destroy", why)
    healthy = inst.get("status") == "running" and inst.get("sidecar") == "up"
    if healthy and not inst.get("drained"):
        drained = replace(
            d,
            action="drain",
            why=f"{d.why}; drain before destroy: its Curio node may still take tasks",
            guard="drain_before_destroy",
        )
        return _cooldown(drained, ctx) or drained
    if healthy and int(inst.get("tasks_running", 0)) > 0:
        return _veto(
            d,
            "drain_before_destroy",
            f"draining: {inst['tasks_running']} task(s) still running on it",
        )
    if healthy and (settling := _settling(d, inst, ctx, "drain_before_destroy")):
        return settling
    last_launch = max(ctx.hist.launches, default=None)
    scale_down = healthy and inst.get("stage") == "running" and not inst.get("retiring")
    if (
        scale_down
        and last_launch is not None
        and ctx.now - last_launch < lim.scale_down_delay_after_up_s
    ):
        return _veto(
            d,
            "scale_down_delay",
            f"launched {ctx.now - last_launch:.0f}s ago; no "
            f"scale-down for {lim.scale_down_delay_after_up_s:.0f}s after a scale-up",
        )
    live = int(fleet.get("instances", 0))
    if scale_down and live - b.removed - 1 < lim.min_instances:
        return _veto(d, "min_instances", f"would leave fewer than {lim.min_instances} instance(s)")
    cap = max(1, math.floor(live * lim.max_destroy_share_per_tick))
    if b.removed + 1 > cap:
        return _veto(
            d,
            "max_destroy_share_per_tick",
            f"already removing {b.removed} of {live} this tick; the rest waits for the next tick",
        )
    b.removed += 1
    return d


def _settling(d: Decision, inst: dict[str, Any], ctx: Context, guard: str) -> Decision | None:
    """A veto while fleetgate's drain of `inst` is younger than `cordon_settle_s`: Curio's node
    reads its cordon with its task poll (every 30 s), so a task it claims after the reading
    that showed none would die with the instance. None once the cordon has held (or when
    fleetgate did not drain it: a cordon older than the journal's window)."""
    drained_at = ctx.hist.last_acted.get(f"drain:instance:{inst.get('id')}")
    settle = ctx.limits.cordon_settle_s
    if drained_at is None or ctx.now - drained_at >= settle:
        return None
    return _veto(d, guard, f"drained {ctx.now - drained_at:.0f}s ago: its Curio node reads the "
                 f"cordon every 30 s and may still claim a task (it goes once the cordon has "
                 f"held {settle:.0f}s)")  # fmt: skip


def _on_instance(d: Decision, ctx: Context, b: _Budget, doubts: list[Doubt]) -> Decision:
    action = d.proposal.action
    inst = ctx.facts.get(str(d.proposal.params["instance"]))
    if inst is None or inst.get("kind") != "instance":
        return _noop(d, f"instance {d.proposal.params['instance']!r} is not in the fleet (gone?)")
    if action == "destroy":
        return _destroy(d, inst, ctx, b, doubts)
    if action == "replace":
        if inst.get("retiring"):
            return _noop(d, "a replacement is already under way")
        return _launch(d, 1, ctx, b, doubts)
    if action == "undrain":
        why = _not_undrainable(inst)
        if why:
            return _noop(d, why)
    if action == "stop":
        return _stop(d, inst, ctx, b, doubts)
    if action == "start":
        return _start(d, inst, ctx, b, doubts)
    if (
        action == "restart_daemon"
        and int(inst.get("restarts_1h", 0)) >= ctx.limits.crash_loop_limit
    ):
        return _veto(
            d,
            "crash_loop_limit",
            f"{inst['restarts_1h']} restarts in the last hour "
            f"(limit {ctx.limits.crash_loop_limit}): replace it instead",
        )
    person = d.proposal.proposer.startswith("human:")  # who answered knows what it cannot tell
    if action == "restart_daemon" and not person and (why := _never_answered(inst, ctx)):
        doubts.append(Doubt("guard_veto", f"instance:{inst.get('id')}",
                            f"{d.proposal.proposer} wants to restart the daemon on instance "
                            f"{inst.get('id')}, but {why}", facts=(inst,),
                            key={"guard": "daemon_never_answered"},
                            proposals=(d.proposal,)))  # fmt: skip
        return _veto(d, "daemon_never_answered", why)
    return _cooldown(d, ctx) or d


def _never_answered(inst: dict[str, Any], ctx: Context) -> str:
    """Why a daemon restart cannot help, when cuzk's status server on `inst` never answered:
    a daemon that is down and was never seen up cannot be told from one whose status server
    is off (cuzk's default) or listens on 127.0.0.1 only, and a restart of a daemon that runs
    kills the proofs in it (again at every cooldown: with no answer there is no restart to
    count toward the crash-loop limit)."""
    track = ctx.hist.instances.get(str(inst.get("id")))
    if inst.get("daemon") != "down" or track is None or track.answered:
        return ""
    return ("its cuzk never answered GET /status: its status server may be off (cuzk's "
            "[daemon] status_listen is empty by default) or listen on 127.0.0.1 only; a restart "
            "cannot tell and would kill any proof it runs")  # fmt: skip


def _stop(d: Decision, inst: dict[str, Any], ctx: Context, b: _Budget,
          doubts: list[Doubt]) -> Decision:  # fmt: skip
    """Park only an instance that holds no task and takes none (drained); beyond
    `max_parked` it is destroyed instead (its destroy lost to the stop's priority); its
    storage counts in the spend budget."""
    if inst.get("parked") or inst.get("status") == "stopped":
        return _noop(d, "it is stopped already")
    if inst.get("retiring"):
        return _veto(d, "drain_before_stop", "it is being replaced: it goes, it is not parked")
    tasks = int(inst.get("tasks_running", 0))
    if tasks > 0:
        why = f"{tasks} task(s) running on it: drain it and let them finish first"
        return _veto(d, "drain_before_stop", why)
    if (
        inst.get("status") == "running"
        and inst.get("sidecar") != "down"
        and not inst.get("drained")
    ):
        why = f"{d.why}; drain before stop: its Curio node may still take tasks"
        drained = replace(d, action="drain", guard="drain_before_stop", why=why)
        return _cooldown(drained, ctx) or drained
    if inst.get("status") == "running" and (
        settling := _settling(d, inst, ctx, "drain_before_stop")
    ):
        return settling
    parked = int(ctx.fleet.get("parked", 0)) + b.parked
    unparked = int(ctx.fleet.get("instances", 0)) - parked - b.removed
    if unparked - 1 < ctx.limits.min_instances:  # the instances kept are kept serving
        return _veto(d, "min_instances", f"would leave fewer than {ctx.limits.min_instances} "
                     "instance(s) unparked")  # fmt: skip
    if parked >= ctx.limits.max_parked:  # the pool is full: it goes, as it would unparked
        why = f"{d.why}; {parked} parked already (max_parked {ctx.limits.max_parked}): destroyed"
        return _destroy(replace(d, action="destroy", guard="max_parked", why=why), inst, ctx, b,
                        doubts)  # fmt: skip
    lim, fleet = ctx.limits, ctx.fleet
    spend = float(fleet.get("spend_per_h", 0.0)) + b.spend + lim.parked_dph_estimate
    spend -= float(inst.get("dph", 0.0))
    if spend > lim.max_spend_per_hour:
        return _veto(d, "max_spend_per_hour", f"parking it would bring the fleet to "
                     f"${spend:.2f}/h (max_spend_per_hour {lim.max_spend_per_hour:g})")  # fmt: skip
    b.parked += 1
    b.spend += lim.parked_dph_estimate - float(inst.get("dph", 0.0))
    return _cooldown(d, ctx) or d


def _start(d: Decision, inst: dict[str, Any], ctx: Context, b: _Budget,
           doubts: list[Doubt]) -> Decision:  # fmt: skip
    """Start a parked instance: a launch for the caps (spend, instances, launches per tick)."""
    if not inst.get("parked"):
        return _noop(d, "it is not parked (fleetgate did not stop it)")
    if "starting_for_s" in inst:
        return _noop(d, "its start was asked already: it waits for its host's GPUs")
    if b.starts_wanted is not None and b.started >= b.starts_wanted:
        return _noop(d, f"the plan's scale_to needs no more instances ({b.started} started, "
                     "the rest undrained or active)")  # fmt: skip
    if b.start_first is not None and str(inst.get("id")) not in b.start_first:
        return _noop(d, f"the plan's scale_to needs {b.starts_wanted} start(s): faster parked "
                     "instances start first")  # fmt: skip
    waiting = _cooldown(d, ctx)
    if waiting is not None:
        return waiting
    b.started += 1
    out = _launch(d, 1, ctx, b, doubts)
    if out.verdict != "act":
        b.started -= 1
    return out


def _not_undrainable(inst: dict[str, Any]) -> str:
    """Why undraining `inst` would give no capacity back ('' when it would)."""
    if not inst.get("drained"):
        return "it is not drained"
    if inst.get("retiring"):
        return "it is being replaced: it stays drained until it goes"
    return ""


def _returning(
    decisions: Sequence[Decision], ctx: Context
) -> tuple[int, int | None, frozenset[str] | None]:
    """Drained instances the plan undrains and parked ones it starts (counted before
    `scale_to`, whatever the order): capacity coming back that a scale-up would otherwise
    rent again; how many starts the plan's largest `scale_to` wants (None: none); and which
    parked instances get them: the fastest by their host's rate (measured by Curio where it
    timed enough tasks, else benchmarked), so a slow one stays parked until it ages out."""
    wanted = {str(d.proposal.params.get("instance")) for d in decisions
              if d.verdict == "act" and d.proposal.action == "undrain"}  # fmt: skip
    started = {str(d.proposal.params.get("instance")) for d in decisions
               if d.verdict == "act" and d.proposal.action == "start"}  # fmt: skip
    facts = ctx.facts
    back = sum(1 for i in wanted if i in facts and facts[i].get("kind") == "instance"
               and not _not_undrainable(facts[i]))  # fmt: skip
    startable = sorted(i for i in started if i in facts and facts[i].get("kind") == "instance"
                       and facts[i].get("parked") and "starting_for_s" not in facts[i])  # fmt: skip
    targets = [int(d.proposal.params["count"]) for d in decisions
               if d.verdict == "act" and d.proposal.action == "scale_to"]  # fmt: skip
    if not targets:
        return back + len(startable), None, None
    room = max(0, max(targets) - int(ctx.fleet.get("active", 0)) - back)
    rates = ctx.hist.launch_rates() if len(startable) > room else {}
    fastest = sorted(startable, key=lambda i: -_rate_of(facts[i], rates))[:room]
    return back + len(fastest), room, frozenset(fastest)


def _rate_of(inst: dict[str, Any], rates: dict[str, float]) -> float:
    """What `inst`'s host proves per hour: as offers are ranked, else its benchmark."""
    rate = rates.get(str(inst.get("machine_id")))
    return float(inst.get("bench_rate") or 0.0) if rate is None else rate


def check(decisions: Sequence[Decision], ctx: Context) -> tuple[list[Decision], list[Doubt]]:
    """Every `act` decision through the guards; other verdicts pass unchanged, except that a
    proposal waiting for approval (`ask`) that the guards would turn into nothing now (a noop,
    or a veto by a budget cap, which escalates by itself) is that instead: nobody is asked to
    approve a scale-up the fleet already has, one the caps refuse, or one made while a sensor
    it needs failed (from facts that are not the fleet's). A veto that may lift by itself
    (paused, a cooldown) leaves the question to people."""
    out: list[Decision] = []
    doubts: list[Doubt] = []
    returning, starts_wanted, start_first = _returning(decisions, ctx)
    b = _Budget(returning=returning, starts_wanted=starts_wanted, start_first=start_first)
    for d in decisions:
        if d.verdict == "ask":
            probe = _one(
                replace(d, verdict="act"),
                ctx,
                _Budget(
                    returning=b.returning, starts_wanted=starts_wanted, start_first=start_first
                ),
                doubts,
            )
            moot = probe.verdict == "noop" or (probe.verdict == "veto" and probe.guard in _UNASKED)
            out.append(replace(probe, why=f"{probe.why}; not put to a person") if moot else d)
            continue
        if d.verdict != "act":
            out.append(d)
            continue
        out.append(_one(d, ctx, b, doubts))
    return out, doubts


def _one(d: Decision, ctx: Context, b: _Budget, doubts: list[Doubt]) -> Decision:
    action = d.proposal.action
    spec = descriptor(action)
    if ctx.limits.paused and not spec.pause_exempt:
        return _veto(d, "paused", "the controller is paused: nothing is acted on")
    for sensor in spec.held_on_sensing_failure:
        if not ctx.sensor_ok(sensor):
            return _veto(d, "sensing", _HELD_WHY[sensor])
    if action == "scale_to":
        return _scale_to(d, ctx, b, doubts)
    if action == "launch":
        return _launch(d, int(d.proposal.params["count"]), ctx, b, doubts)
    if "instance" in d.proposal.params:
        return _on_instance(d, ctx, b, doubts)
    return _cooldown(d, ctx) or d

"""One tick of the controller: gather → plan → apply → escalate.

`Controller.plan(now)` is gather + plan: it reads and senses, and writes nothing (what
`fleetgate explain` prints). `Controller.tick()` is one whole pass:

1. read the clock once (the simulator's virtual clock advances first); reload changed rules;
2. gather (`controller.service.gather`): one read of the journal, then sensing, into a frozen
   snapshot; a failed sensor is a failed reading, never "empty";
3. plan (`controller.service.plan`): reconcile what the journal expected with what was sensed,
   advance each instance's history, facts, match, decide, and one guard pass over every
   decision; the bookkeeping comes back as data;
4. apply (`controller.service.apply`): one transaction fenced by the lease for the tick's
   row, bookkeeping, tracks, intents and what the tick learned (the demand reading, agent
   links), then the `for:` clocks; then act; then the results (a tick that fails before
   its transaction gets its row, unfinished, when it fails);
5. escalate what rules could not decide (deduplicated) to the outbox, and record the tick.

A tick **holds** (plans, acts on nothing, and escalates to people) when the wall clock jumped
since the last one (`controller.service.clockwatch`: the controller's time then goes on
unbroken), or when the journal it opened is gone or was replaced (checked before the
bookkeeping is written and before each action; from then on every tick holds until the
controller is restarted). `FAILURES_TO_ESCALATE` ticks failing in a row are escalated too, and
the escalation resolves itself once a tick succeeds again. All three go through the same
escalation path as any other doubt (kind `sensing_failure`, for people only).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from controller.core.decide import Doubt
from controller.core.forecast import DEFAULT_BOOT_S
from controller.core.model import Demand, Observation, Proposal
from controller.core.policy import DecideSettings
from controller.core.reconcile import followups, serving
from controller.core.track import NO_DEBOUNCE, Debounce
from controller.fleet.actuator import Actuator
from controller.fleet.base import Actuated, DemandSensor, Sensed
from controller.rules.source import RulesSource
from controller.service import apply, autonomy
from controller.service.clockwatch import ClockWatch, Jump
from controller.service.gather import ForecastCache, Gathered, MeasuredCache, gather, sense
from controller.service.plan import Planned, plan
from controller.store.backend import JournalError, JournalLost, StaleLeader, Tx
from controller.store.journal import Journal
from escalation.router import Escalator

__all__ = ["Controller", "Gathered", "Planned", "followups", "sense", "serving"]

log = logging.getLogger(__name__)

FAILURES_TO_ESCALATE = 3  # ticks failing in a row before people are told


class Controller:
    def __init__(
        self,
        *,
        journal: Journal,
        provider: Sensed,
        demand: DemandSensor,
        rules: RulesSource,
        settings: DecideSettings,
        escalator: Escalator,
        clock: Callable[[], float],
        before_tick: Callable[[], None] | None = None,
        after_tick: Callable[[], None] | None = None,
        on_gone: Callable[[str], None] | None = None,
        actions: Actuated | None = None,
        debounce: Debounce = NO_DEBOUNCE,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        """`monotonic` watches `clock` for jumps (default: `time.monotonic` when `clock` is
        the wall clock itself; none for a virtual clock, which jumps by design)."""
        if monotonic is None and clock is time.time:
            monotonic = time.monotonic
        self.watch = ClockWatch(clock, monotonic) if monotonic is not None else None
        if self.watch is not None:
            clock = self.watch  # the controller's time, for everything that shares it
            escalator.clock = clock
        self.journal = journal
        self.provider = provider
        self.demand = demand
        self.rules = rules
        self.settings = settings
        self.escalator = escalator
        self.clock = clock
        self.before_tick = before_tick
        self.after_tick = after_tick
        self.on_gone = on_gone  # an instance vanished from a good listing (forget its records)
        self.debounce = debounce  # failed health probes that make a daemon down
        # a fleet that is read and acted on through one object (a simpler fleet, a test's)
        acts = actions if actions is not None else cast(Actuated, provider)
        self.actuator = Actuator(acts, journal, settings.guards)
        self.failures = 0  # ticks failed in a row
        self.lost: str | None = None  # why the journal is not the one opened: every tick holds
        self._journal_id: str | None = None  # noted at the first tick
        self._standing: tuple[Doubt, ...] = ()  # doubts that hold while the process runs
        self._forecasts = ForecastCache()  # the last forecasts, while their inputs hold
        self._measured = MeasuredCache()  # the hosts' latest measurements read so far
        self._autonomy: dict[str, Any] = {}  # the track record's last review by this process
        self._started: tuple[float, str] | None = None  # (now, rules) of a tick not yet written

    def gather(self, now: float) -> Gathered:
        values = self.settings.values  # the forecast's default boot time and its sizing
        return gather(self.journal, self.provider, self.demand, now,
                      pending_s=self.settings.guards.launch_pending_s,
                      boot_s=float(values.get("forecast_boot_s", DEFAULT_BOOT_S)),
                      tasks_per_instance=float(values.get("tasks_per_instance", 2)),
                      cache=self._forecasts, measured_cache=self._measured)  # fmt: skip

    def plan(self, now: float, extra: Sequence[Proposal] = ()) -> Planned:
        """Gather and plan: nothing is stored or changed."""
        holds = self.journal.rule_pending.load()  # since when each `for:` condition has held
        # the track record's demotions in force (controller/service/autonomy.py), read again
        # under a new lease term: another leader may have demoted an action meanwhile
        fence = self.journal.actions.fence
        term = None if fence is None else fence.token
        if self._autonomy.get("term", term) != term:
            self._autonomy.pop("events", None)
        self._autonomy["term"] = term
        settings, self.escalator.gate = autonomy.in_force(self.journal, self.settings,
                                                          self._autonomy)  # fmt: skip
        return plan(self.gather(now), self.rules, settings, extra, self.debounce, holds)

    def tick(self) -> Planned:
        """Steps 1-5; a failure counts towards `FAILURES_TO_ESCALATE` and is raised."""
        try:
            planned = self._tick()
        except StaleLeader:  # another controller leads: not a failure of this one's, no row
            self._started = None
            raise
        except Exception as exc:
            if self._started is not None:  # it failed before its row was written: one now
                self._record_failed()
            self.failures += 1
            if self.failures >= FAILURES_TO_ESCALATE:
                self._escalate_failures(exc)
            raise
        self.failures = 0
        return planned

    def _tick(self) -> Planned:
        if self.before_tick:
            self.before_tick()
        jump = self._jump()
        now = self.clock()
        if self._journal_id is None:
            self._journal_id = self.journal.meta.identity()
        reloaded = self.rules.reload()  # a file change (or SIGHUP) takes effect here
        if reloaded is not None:
            self.journal.meta.add_reload(now, reloaded.ok, reloaded.digest, reloaded.problems)
        self._started = (now, self.rules.book.digest)  # its row is written with the plan's
        planned = self.plan(now)
        held = self._lost_doubt() or (self._clock_doubt(jump) if jump is not None else None)
        if held is not None:
            return self._hold(planned, self._start(), held)
        tick_id, rows = apply.write(self.journal, planned, self.rules.book.digest,
                                    then=lambda db: self._learned(planned, db))  # fmt: skip
        self._started = None
        self.journal.rule_pending.save(planned.pending)  # `for:` clocks, kept across restarts
        if self.on_gone is not None:
            for e in planned.events:
                if e.kind == "gone":
                    self.on_gone(e.instance_id)
        try:
            done = apply.act(self.journal, self.actuator, planned, tick_id, rows,
                             check=self._check_acting)  # fmt: skip
        except JournalLost:
            return self._hold(planned, tick_id, self._lost_doubt())
        for esc_id in (*done.expired, *done.closed):
            self.escalator.closed(esc_id)
        if done.noticed and self.escalator.after_write is not None:  # notices for people
            self.escalator.after_write(now)
        summary = self._escalate(planned, done)
        # demotions at once; promotions suggested
        autonomy.review(self.journal, self.settings, now, self._autonomy)
        self.journal.meta.finish_tick(tick_id, self.clock(), summary)  # the real end, after acting
        if tick_id % 10 == 0:
            log.info(
                "[%s] tick %d: %s instance(s), %s task(s) pending, $%s/h, %d escalation(s) pending",
                _clock(now), tick_id, *("?" if summary[k] is None else summary[k]
                                        for k in ("instances", "pending", "spend_per_h")),
                len(self.journal.escalations.recent(status="pending")),
                extra={"tick": tick_id},
            )  # fmt: skip
        if self.after_tick:
            self.after_tick()
        return planned

    def _start(self) -> int:
        """This tick's row, unfinished (a tick that stops before its plan is written)."""
        assert self._started is not None
        now, rules = self._started
        self._started = None
        return self.journal.meta.start_tick(now, rules)

    def _record_failed(self) -> None:
        try:
            self._start()
        except JournalError as exc:
            log.error("a failed tick could not be journaled either: %s", exc)

    def _learned(self, planned: Planned, db: Tx) -> None:
        """What the tick learned, in `db`, the transaction of its plan's rows: the demand the
        next forecasts learn from, the links between agents and instances that sensing found.
        (The `for:` clocks are saved after it commits: `RulePending` remembers what it left.)"""
        if planned.observation.sensor_ok("demand"):
            self.journal.demand.record(planned.now, planned.observation.demand,
                                       planned.history.forecasts, db)  # fmt: skip
        save_learned = getattr(self.provider, "save_learned", None)
        if save_learned is not None:
            save_learned()

    def _escalate(self, planned: Planned, done: apply.Applied) -> dict[str, Any]:
        """Step 5, and the tick's summary."""
        fleet = planned.by_id.get("fleet", {})
        targets: set[str] = set()
        for f in planned.facts:
            if f["kind"] == "instance":
                targets.add(str(f["id"]))
                targets.add(str(f["machine_id"]))
        doubts = planned.doubts + done.refused + self._standing
        # a failed listing is no fleet of none: the messages say the fleet is not known
        sensed = planned.observation.sensor_ok("provider")
        raised = self.escalator.raise_all(doubts, fleet if sensed else {},
                                          self._budget(fleet, planned) if sensed else {},
                                          planned.now, targets)  # fmt: skip
        if all(s.state == "ok" for s in planned.observation.sensors):
            # not what it just raised; the pending ones as gathered when it raised none
            self.escalator.resolve_cleared(doubts, fleet, planned.now,
                                           None if raised else planned.escalations)  # fmt: skip
        return {
            **done.counts,
            "escalated": len(raised),
            "doubts": len(planned.doubts),
            **_sensed_counts(fleet, planned.observation),
            # what /readyz and the dashboard show: each sensor's state, the queue per task
            "sensors": {s.name: s.state for s in planned.observation.sensors},
            "demand": [
                _queue(d, planned.history.forecasts.get(d.task))
                for d in _shown(planned.observation.demand)
            ],  # fmt: skip
            "foreign": [
                {"id": i.id, "label": i.label, "status": i.status}
                for i in planned.observation.foreign[:SHOWN_FOREIGN]
            ],  # fmt: skip
            "foreign_total": len(planned.observation.foreign),
        }

    # ---- holding --------------------------------------------------------------------------
    def _jump(self) -> Jump | None:
        if self.watch is None:
            return None
        last = self.journal.meta.last_now() if self.watch.fresh else None
        return self.watch.check(last)

    def _check_acting(self) -> None:
        """Before each action: the journal is the one opened (`JournalLost`), and the lease
        its intent was written under is still this controller's (`StaleLeader`: a leader
        paused between writing its intents and carrying them out acts on none of them)."""
        self._check_journal()
        self.journal.actions.check_fence()

    def _check_journal(self) -> None:
        """Raise `JournalLost` (and remember why) unless the journal is the one opened."""
        if self.lost is None and self._journal_id is not None:
            try:
                self.journal.meta.check_identity(self._journal_id)
            except JournalLost as exc:
                self.lost = str(exc)
        if self.lost is not None:
            raise JournalLost(self.lost)

    def _lost_doubt(self) -> Doubt | None:
        try:
            self._check_journal()
        except JournalLost as exc:
            return Doubt("sensing_failure", "journal",
                         f"{exc}: the controller acts on nothing until it is restarted on its "
                         "journal (actions it takes now would be recorded nowhere)",
                         key={"problem": "journal_lost"}, people_only=True)  # fmt: skip
        return None

    def _clock_doubt(self, jump: Jump) -> Doubt:
        assert self.watch is not None
        doubt = Doubt("sensing_failure", "clock", jump.describe(self.watch.offset),
                      key={"problem": "clock_jump", "wall": round(jump.wall)},
                      people_only=True)  # fmt: skip
        self._standing = (doubt,)  # pending while the controller runs on its own time
        return doubt

    def _hold(self, planned: Planned, tick_id: int, doubt: Doubt | None) -> Planned:
        """The tick acts on nothing: `doubt` goes to people, and the tick is recorded."""
        assert doubt is not None
        log.error("tick %d held: %s", tick_id, doubt.summary, extra={"tick": tick_id})
        fleet = planned.by_id.get("fleet", {})
        try:
            raised = self.escalator.raise_all([doubt], fleet, self._budget(fleet, planned),
                                              planned.now)  # fmt: skip
            self.journal.meta.finish_tick(tick_id, self.clock(), {
                "held": doubt.summary[:500], "escalated": len(raised),
                **_sensed_counts(fleet, planned.observation)})  # fmt: skip
        except JournalError as exc:
            log.critical("tick %d held, and the journal refused its escalation: %s (%s)",
                         tick_id, exc, doubt.summary)  # fmt: skip
        return planned

    def _escalate_failures(self, exc: Exception) -> None:
        detail = f"{type(exc).__name__}: {exc}"[:300]
        doubt = Doubt("sensing_failure", "controller",
                      f"{self.failures} ticks in a row failed (the last: {detail}); nothing is "
                      "decided or acted on while ticks fail",
                      key={"problem": "tick_failures"}, people_only=True)  # fmt: skip
        try:
            self.escalator.raise_all([doubt], {}, {}, self.clock())
        except Exception as again:  # noqa: BLE001 - the tick's own failure is raised after
            log.critical("%d ticks in a row failed, and escalating it failed too: %s",
                         self.failures, again)  # fmt: skip

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


def _sensed_counts(fleet: dict[str, Any], obs: Observation) -> dict[str, Any]:
    """The fleet's and the queue's numbers for the tick's summary (what `status`, the
    dashboard and the metrics show), None where the sensor they come from did not read ok:
    a failed listing is no fleet of 0 instances costing $0/h, a stale queue no empty one,
    and the launches counted as on their way while it failed are not all unlisted."""
    fleet_known, queue_known = obs.sensor_ok("provider"), obs.sensor_ok("demand")
    return {
        "instances": fleet.get("instances") if fleet_known else None,
        "pending": fleet.get("pending") if queue_known else None,
        "spend_per_h": fleet.get("spend_per_h") if fleet_known else None,
        "running_tasks": fleet.get("running_tasks") if fleet_known else None,
        # while the listing failed every recent launch counts as on its way, listed or not
        "pending_launches": fleet.get("pending_launches") if fleet_known else None,
    }


SHOWN_FOREIGN = 20  # instances not fleetgate's a tick's summary names (all are counted)
SHOWN_TASKS = 50  # task queues a tick's summary keeps (the metrics' and the pages' rows)


def _shown(demand: Sequence[Demand]) -> list[Demand]:
    """The first queues of `demand`, and the total (`all`, listed last) whatever their number:
    with 50 task names configured the total was cut from the metrics and the pages."""
    total = [d for d in demand if d.task == "all"][:1]
    return [*[d for d in demand if d.task != "all"][: SHOWN_TASKS - len(total)], *total]


def _queue(d: Demand, forecast: Any = None) -> dict[str, Any]:
    """One task's queue as the tick's summary keeps it, with its forecast (pending + running
    one boot time ahead, `controller.core.forecast.Forecast`) when there is one."""
    queue: dict[str, Any] = {"task": d.task, "pending": d.pending, "running": d.running,
                             "oldest_pending_s": round(d.oldest_pending_s, 1)}  # fmt: skip
    if forecast is not None:
        queue["forecast_pending"] = round(float(forecast.pending), 2)
        queue["forecast_horizon_s"] = float(forecast.horizon_s)
    return queue


def _clock(now: float) -> str:
    return time.strftime("%m-%d %H:%M", time.gmtime(now))

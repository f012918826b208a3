"""One tick of the controller: gather → plan → apply → escalate.

`Controller.plan(now)` is gather + plan: it reads and senses, and writes nothing (what
`fleetgate explain` prints). `Controller.tick()` is one whole pass:

1. read the clock once (the simulator's virtual clock advances first); reload changed rules;
2. gather (`controller.service.gather`): one read of the journal, then sensing, into a frozen
   snapshot; a failed sensor is a failed reading, never "empty";
3. plan (`controller.service.plan`): reconcile what the journal expected with what was sensed,
   advance each instance's history, facts, match, decide, and one guard pass over every
   decision; the bookkeeping comes back as data;
4. apply (`controller.service.apply`): one transaction fenced by the lease for bookkeeping,
   tracks and intents; then act; then the results;
5. escalate what rules could not decide (deduplicated) to the outbox, and record the tick.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from controller.core.model import Proposal
from controller.core.policy import DecideSettings
from controller.core.reconcile import followups, serving
from controller.core.track import NO_DEBOUNCE, Debounce
from controller.fleet.actuator import Actuator
from controller.fleet.base import Actuated, DemandSensor, Sensed
from controller.rules.source import RulesSource
from controller.service import apply
from controller.service.gather import Gathered, gather, sense
from controller.service.plan import Planned, plan
from controller.store.journal import Journal
from escalation.router import Escalator

__all__ = ["Controller", "Gathered", "Planned", "followups", "sense", "serving"]

log = logging.getLogger(__name__)


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
        self.on_gone = on_gone  # an instance vanished from a good listing (forget its records)
        self.debounce = debounce  # failed health probes that make a daemon down
        # a fleet that is read and acted on through one object (a simpler fleet, a test's)
        acts = actions if actions is not None else cast(Actuated, provider)
        self.actuator = Actuator(acts, journal, settings.guards)

    def gather(self, now: float) -> Gathered:
        return gather(self.journal, self.provider, self.demand, now,
                      pending_s=self.settings.guards.launch_pending_s)  # fmt: skip

    def plan(self, now: float, extra: Sequence[Proposal] = ()) -> Planned:
        """Gather and plan: nothing is stored or changed."""
        return plan(self.gather(now), self.rules, self.settings, extra, self.debounce)

    def tick(self) -> Planned:
        """Steps 1-5."""
        if self.before_tick:
            self.before_tick()
        now = self.clock()
        reloaded = self.rules.reload()  # a file change (or SIGHUP) takes effect here
        if reloaded is not None:
            self.journal.meta.add_reload(now, reloaded.ok, reloaded.digest, reloaded.problems)
        tick_id = self.journal.meta.start_tick(now, self.rules.book.digest)
        planned = self.plan(now)
        rows = apply.write(self.journal, planned, tick_id)
        save_learned = getattr(self.provider, "save_learned", None)
        if save_learned is not None:  # links between agents and instances, learned sensing
            save_learned()
        if self.on_gone is not None:
            for e in planned.events:
                if e.kind == "gone":
                    self.on_gone(e.instance_id)
        done = apply.act(self.journal, self.actuator, planned, tick_id, rows)
        for esc_id in (*done.expired, *done.closed):
            self.escalator.closed(esc_id)
        summary = self._escalate(planned, done)
        self.journal.meta.finish_tick(tick_id, self.clock(), summary)  # the real end, after acting
        if tick_id % 10 == 0:
            log.info(
                "[%s] tick %d: %s instance(s), %s task(s) pending, $%s/h, %d escalation(s) pending",
                _clock(now), tick_id, summary["instances"], summary["pending"],
                summary["spend_per_h"], len(self.journal.escalations.recent(status="pending")),
            )  # fmt: skip
        if self.after_tick:
            self.after_tick()
        return planned

    def _escalate(self, planned: Planned, done: apply.Applied) -> dict[str, Any]:
        """Step 5, and the tick's summary."""
        fleet = planned.by_id.get("fleet", {})
        targets: set[str] = set()
        for f in planned.facts:
            if f["kind"] == "instance":
                targets.add(str(f["id"]))
                targets.add(str(f["machine_id"]))
        doubts = planned.doubts + done.refused
        raised = self.escalator.raise_all(doubts, fleet, self._budget(fleet, planned),
                                          planned.now, targets)  # fmt: skip
        if all(s.state == "ok" for s in planned.observation.sensors):
            self.escalator.resolve_cleared(doubts, fleet, planned.now)  # not what it just raised
        return {
            **done.counts,
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


def _clock(now: float) -> str:
    return time.strftime("%m-%d %H:%M", time.gmtime(now))

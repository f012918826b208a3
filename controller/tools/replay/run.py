"""Run the real controller against the simulator replaying a task list, in virtual time.

`run_fleetgate` does what `fleetgate run` does on the built-in simulator (the same `assemble`,
the same rules, guards, journal and escalation), with `demand: trace` and without the
scheduler's sleeps: it calls `Controller.tick()` in a loop, as `fleetgate bench sim` does, with
the notification channels and WARNING logs silenced while it runs. The simulated world is saved
to the journal once, at the end, rather than after every tick (it is the simulator's state, not
the controller's, and writing it took half of each tick); `fleetgate --state DIR status` and
`actions` read the journal afterwards.

The tasks are written to `trace.csv` in the state directory first (one row per task, already
scaled), and the world replays that file: fleetgate and the baselines see exactly the same list.
"""

from __future__ import annotations

import csv
import logging
import math
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from controller.core.forecast import forecast_error
from controller.service.app import App
from controller.service.assemble import assemble
from controller.service.config import Config
from controller.sim import Simulation
from controller.sim.stats import per_situation
from controller.sim.trace import TraceTask
from controller.tools.replay import operator
from controller.tools.replay.results import Outcome, Sample

LOST = ("exited", "offline", "frozen")
STATE_FILES = ("journal.db", "journal.db-wal", "journal.db-shm", "trace.csv")


@dataclass(frozen=True)
class RunSpec:
    """One fleetgate run: what to replay, for how long, where to keep the journal."""

    tasks: Sequence[TraceTask]
    ticks: int
    state: Path
    seed: int | None = None
    sample_ticks: int = 10
    progress: bool = False
    answer_after_s: float | None = None
    """The replay operator answers escalations this old (None: nobody answers)."""


@dataclass(frozen=True)
class FleetgateRun:
    outcome: Outcome
    journal: dict[str, Any]
    """Counts from the journal (see `journal_counts`)."""
    sim: dict[str, Any]
    """The simulator's totals (`Simulation.stats`)."""
    hours_by_state: dict[str, float]
    """Instance-hours by state, tick by tick: booting, busy, idle, drained, lost."""
    answers: dict[str, int]
    """The replay operator's answers by verdict."""
    wall_s: float
    seconds_per_tick: float


@dataclass
class _Trail:
    """What the tick loop keeps: samples, the largest fleet, hours by state, answers."""

    series: list[Sample] = field(default_factory=list)
    peak: int = 0
    hours: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    answers: Counter[str] = field(default_factory=Counter)


def run_fleetgate(config: Config, spec: RunSpec) -> FleetgateRun:
    """Tick the controller `spec.ticks` times over the replayed tasks; the journal stays."""
    spec.state.mkdir(parents=True, exist_ok=True)
    for name in STATE_FILES:  # a new world: an old journal would continue its saved one
        (spec.state / name).unlink(missing_ok=True)
    trace = spec.state / "trace.csv"
    write_tasks(trace, spec.tasks)
    world = trace_config(config, trace)
    app = assemble(world, state=spec.state, clock=time.time, sleep=time.sleep, seed=spec.seed)
    assert app.sim is not None
    app.controller.escalator.notifier.channels = []  # nobody to notify in a replay
    app.controller.rules.check_every_s = 1.0  # an edit still counts, within a second
    save, app.controller.after_tick = app.controller.after_tick, None
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    started = time.perf_counter()
    try:
        trail = _tick(app, app.sim, spec)
        wall_s = time.perf_counter() - started
        if save is not None:
            save()
        return FleetgateRun(
            outcome=_outcome(app.sim, trail),
            journal=journal_counts(app),
            sim=app.sim.stats,
            hours_by_state={k: round(v, 2) for k, v in sorted(trail.hours.items())},
            answers=dict(trail.answers),
            wall_s=wall_s,
            seconds_per_tick=config.sim.seconds_per_tick,
        )
    finally:
        logging.disable(previous)
        app.close()


def trace_config(config: Config, trace: Path) -> Config:
    """`config` with the simulator replaying `trace` as it is (scales of 1)."""
    world = {**config.sim.world, "demand": "trace", "trace_path": str(trace),
             "trace_time_scale": 1.0, "trace_service_scale": 1.0}  # fmt: skip
    return config.model_copy(update={"sim": config.sim.model_copy(update={"world": world})})


def write_tasks(path: Path, tasks: Sequence[TraceTask]) -> None:
    """The tasks as a CSV in the shared trace's columns (times exact, one GPU each)."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle)
        out.writerow(["creation_time", "deletion_time", "num_gpu"])
        for task in tasks:
            out.writerow([repr(task.arrival_s), repr(task.arrival_s + task.service_s), 1])


def _tick(app: App, sim: Simulation, spec: RunSpec) -> _Trail:
    """Tick `spec.ticks` times, the replay operator answering after each tick if there is one."""
    start, step_h = sim.now(), app.config.sim.seconds_per_tick / 3600.0
    trail = _Trail(series=[sample(sim, start)])
    with tqdm(total=spec.ticks, desc="simulate", unit="tick", file=sys.stderr,
              disable=not spec.progress, mininterval=0.5) as bar:  # fmt: skip
        for n in range(1, spec.ticks + 1):
            planned = app.controller.tick()
            if spec.answer_after_s is not None:
                trail.answers.update(operator.answer_due(
                    app.journal, sim.now(), spec.answer_after_s, planned.escalations))  # fmt: skip
            states = fleet_states(sim)
            trail.peak = max(trail.peak, sum(states.values()))
            for state, count in states.items():
                trail.hours[state] += count * step_h
            if n % spec.sample_ticks == 0 or n == spec.ticks:
                trail.series.append(sample(sim, start))
                bar.update(n - bar.n)
    return trail


def fleet_states(sim: Simulation) -> Counter[str]:
    """Live instances by what they do: booting, busy (every slot), part_busy (some), idle,
    drained (serving), parked (stopped, billing storage) or lost."""
    owned = sim.world.queue.owned_counts()
    slots = sim.world.config.slots_per_instance
    states: Counter[str] = Counter()
    for inst in sim.world.live_instances():
        if inst.status in LOST or inst.status == "rebooting":
            states["lost_or_rebooting"] += 1
        elif inst.status == "stopped":
            states["parked"] += 1
        elif inst.stage != "running":
            states["booting"] += 1
        elif owned[inst.id]:
            states["busy" if owned[inst.id] >= slots else "part_busy"] += 1
        else:
            states["drained_idle" if inst.drained else "idle"] += 1
    return states


def sample(sim: Simulation, start: float) -> Sample:
    """The fleet by state, the queue and the spend so far, at the simulation's now."""
    world, now = sim.world, sim.now()
    live = world.live_instances()
    serving = sum(1 for i in live if i.status == "running" and i.stage == "running")
    other = sum(1 for i in live if i.status in LOST or i.status == "rebooting")
    total = next(d for d in world.demand(now) if d.task == "all")
    spend = world.counters.spend_closed_usd + sum(
        world.machines[i.machine_id].dph * i.billed_s(now) / 3600.0 for i in live
    )
    return Sample(now - start, total.pending, total.running, len(live) - serving - other,
                  serving, other, spend)  # fmt: skip


def _outcome(sim: Simulation, trail: _Trail) -> Outcome:
    """Fleetgate's bill and every task's wait (censored at the end when it never started)."""
    stats = sim.stats
    waits, censored = waits_and_censored(sim)
    hours = stats["gpu_hours"]
    gpu_spend = stats["spend_usd"] - stats.get("storage_usd", 0.0)  # the oracle parks nothing
    return Outcome(
        name="fleetgate", instance_s=hours * 3600.0, dph=gpu_spend / hours if hours
        else 0.0, gpus_per_instance=1, waits=tuple(waits), censored=censored,
        instances_started=stats["instances_launched"],
        peak_instances=trail.peak,
        series=tuple(trail.series), spend_usd=stats["spend_usd"],
    )  # fmt: skip


def waits_and_censored(sim: Simulation) -> tuple[list[float], int]:
    """Every task's wait so far, and how many of them never started (waited until now)."""
    now = sim.now()
    waits = list(sim.world.counters.waits)
    censored = 0
    for task in sim.world.queue.to_json()["tasks"]:  # not completed: running or waiting
        if task["first_claimed_at"] is not None:
            waits.append(task["first_claimed_at"] - task["posted"])
        else:
            waits.append(now - task["posted"])
            censored += 1
    return waits, censored


def journal_counts(app: App) -> dict[str, Any]:
    """From the journal: decisions acted on by kind (a `launch count=3` is one; the launches it
    made, and a replace's launch, are `instance_launches`), their outcomes, every decision's
    verdict, escalations by kind and by how they ended, LLM calls, the forecast's error."""
    everything = app.journal.actions.recent(limit=sys.maxsize)
    acted = [a for a in everything if a["verdict"] == "act" and a["parent_id"] is None]
    parts = [a for a in everything if a["parent_id"] is not None and a["action"] == "launch"]
    escalations = app.journal.escalations.recent(limit=sys.maxsize)
    return {
        "actions": dict(sorted(Counter(a["action"] for a in acted).items())),
        "instance_launches": len(parts),
        "action_status": dict(sorted(Counter(a["status"] for a in acted).items())),
        "verdicts": dict(sorted(Counter(a["verdict"] for a in everything).items())),
        "escalation_status": dict(sorted(Counter(e["status"] for e in escalations).items())),
        "escalations": len(escalations),
        "escalations_by_kind": dict(sorted(Counter(e["kind"] for e in escalations).items())),
        "llm_calls": len(app.journal.llm.llm_calls()),
        "per_situation": per_situation(
            escalations, app.journal.llm.llm_calls(), app.controller.escalator.jobs.jobs()
        ),
        # the demand forecast (task all) against the demand one horizon later
        "forecast": forecast_error(app.journal.demand.scored("all")),
    }


def ticks_for(horizon_s: float, seconds_per_tick: float) -> int:
    """Whole ticks covering the horizon."""
    return max(1, math.ceil(horizon_s / seconds_per_tick - 1e-9))

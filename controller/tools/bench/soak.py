"""`fleetgate bench soak`: many ticks at one fleet size; resident memory at the start and end.

Two paths, as `fleetgate bench tick` has:

- `real` (the default): what `fleetgate run` runs on the built-in simulator (`assemble`, the
  production fleet path: vast client and provider over HTTP, the Curio sensor's SQL, health
  probes, agent records, the journal in SQLite, the escalator), ticking with no scheduler
  waits. The world is sized for `instances`: a market three times as large, a proving queue
  whose busy phases (4 h) want more than the cap and whose quiet ones (3 h) a tenth of it, the
  simulator's faults (daemon deaths, exits, hosts gone, freezes, stuck boots), and a vast
  account as a real one is: five foreign instances, a tenth of labels shown empty, creates
  listed up to 2 minutes late, and 1 % of calls refused (429), failed (503) or cut short, 1 %
  of creates lost or failed. Escalations are answered after 10 minutes, as `simulate
  --answer-after-s 600` does. Instances come, serve, fail and go as the world makes them.
- `synthetic`: the fixed fleet of `fleetgate bench tick --path synthetic`, with churn: every
  tick `churn` instances leave and as many new ones take their place; the provider is a fake
  that accepts every action (the figures from before the real path).

Resident memory is the current RSS (from /proc/self/statm, not the peak), sampled every
`sample_every` ticks; "start" is taken after `warmup` ticks, once the engine, caches and
SQLite's page cache are warm (on the real path, once the fleet has filled and emptied once).
Numbers, never assertions.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from controller.core.model import Instance
from controller.fleet.base import LaunchRequest
from controller.service.assemble import assemble
from controller.service.config import Config
from controller.sim import Simulation, curio_rows, vast_api, vast_views
from controller.store.journal import Journal
from controller.tools.bench.tick import _T0, SyntheticFleet, _controller, synthetic_instances
from controller.tools.replay import operator

_PAGE = os.sysconf("SC_PAGE_SIZE")
PATHS = ("real", "synthetic")
ANSWER_AFTER_S = 600.0  # escalations are answered at this age, as `simulate --answer-after-s`
BUSY_S, QUIET_S = 4 * 3600.0, 3 * 3600.0
# The longest the controller looks back is the forecast's week (and a day of history): what it
# keeps in memory fills for that long. Warm-up: 8 days of virtual time; by default as many after.
WARMUP_S = 8 * 86_400.0


def rss_mb() -> float:
    """Current resident set size of this process, MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE / 2**20


class ChurningFleet(SyntheticFleet):
    """The synthetic fleet, as a fleet in service behaves: `churn` instances per tick leave and
    new ones take their place (on machines from a market five times the fleet's size, as are
    launched ones: a real market is finite, and the journal remembers every host); a
    destroyed instance is gone and another arrives in its slot; a restarted daemon or rebooted
    instance comes back serving; a launch joins the listing."""

    def __init__(self, n: int, clock: Callable[[], float], churn: int) -> None:
        super().__init__(n, clock)
        self.churn, self.tick = churn, 0
        self.extra = [0] * n  # per slot: replacements beyond the churn schedule (destroys)
        self.slot_of: dict[str, int] = {}
        self.healed: set[str] = set()
        self.launches: list[Instance] = []

    def prepare(self) -> None:
        now = self.clock()
        base = synthetic_instances(self.n, now)
        listing = [self._renamed(i, inst, now) for i, inst in enumerate(base)]
        self.slot_of = {inst.id: i for i, inst in enumerate(listing)}
        self._listing = listing + self.launches
        self.healed &= {i.id for i in self._listing}  # the fleet's memory: of listed ones only
        self.tick += 1

    def _renamed(self, i: int, inst: Instance, now: float) -> Instance:
        # slot i gets a new instance each time tick * churn passes it (mod n), and on a destroy
        generation = (self.tick * self.churn + self.n - 1 - i) // self.n + self.extra[i]
        if generation:
            serial = generation * self.n + i
            inst = replace(inst, id=str(10_000_000 + serial), label=f"fg-bench-{serial}",
                           machine_id=str(500_000 + serial // 2 % (5 * self.n)))  # fmt: skip
        if inst.id in self.healed:
            inst = _serving(inst, now)
        return inst

    def launch(self, request: LaunchRequest) -> str:
        new_id = super().launch(request)
        template = synthetic_instances(6, self.clock())[-1]  # a serving instance
        machine = str(500_000 + (self.n + int(new_id)) % (5 * self.n))  # from the same market
        self.launches.append(replace(template, id=new_id, label=request.label,
                                     machine_id=machine))  # fmt: skip
        return new_id

    def destroy(self, instance_id: str) -> None:
        if instance_id in self.slot_of:
            self.extra[self.slot_of[instance_id]] += 1
        self.launches = [i for i in self.launches if i.id != instance_id]

    def reboot(self, instance_id: str) -> None:
        self.healed.add(instance_id)

    def restart_daemon(self, instance_id: str) -> None:
        self.healed.add(instance_id)


def _serving(inst: Instance, now: float) -> Instance:
    return replace(inst, status="running", stage="running", daemon="up", sidecar="up",
                   tasks_running=1, bench_rate=inst.bench_rate or 30.0,
                   daemon_uptime_s=60.0)  # fmt: skip


def soak_synthetic(config: Config, *, ticks: int, instances: int, churn: int = 10,
                   step_s: float = 30.0,
                   warmup: int = 1000, sample_every: int = 10_000,
                   progress: TextIO | None = None) -> dict[str, Any]:  # fmt: skip
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # measure the controller, not its log lines
    samples: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "journal.db"
            journal = Journal(db)
            try:
                clock = [_T0]
                c, _ = _controller(config, instances, journal, clock)
                fleet = ChurningFleet(instances, lambda: clock[0], churn)
                c.provider = c.demand = c.actuator.provider = fleet
                warmup = min(warmup, max(ticks // 10, 1))
                started = time.monotonic()
                times: list[float] = []
                for n in range(1, ticks + 1):
                    clock[0] += step_s
                    fleet.prepare()
                    t0 = time.perf_counter()
                    c.tick()
                    times.append(time.perf_counter() - t0)
                    if n in (warmup, ticks) or n % sample_every == 0:
                        samples.append(_sample(n, times, db, started))
                        times = []
                        _report(progress, samples[-1], ticks)
            finally:
                journal.close()
    finally:
        logging.disable(previous)
    return {
        "path": "synthetic", "ticks": ticks, "instances": instances, "churn_per_tick": churn,
        "step_s": step_s, **_memory(samples, warmup),
        "instances_seen": instances + churn * ticks,
    }  # fmt: skip


def soak_world(config: Config, instances: int) -> Config:
    """`config` as `fleetgate run` on the built-in simulator, its world and guards sized for a
    fleet of `instances` (see the module docstring)."""
    n = instances
    world = {
        **config.sim.world,
        "machines": 3 * n + 10, "busy_s": BUSY_S, "quiet_s": QUIET_S,
        # two slots an instance, tasks of 15-30 min at the reference rate: 5 n an hour wants
        # more than n instances busy; 0.5 n a tenth of them
        "busy_rate_per_h": 5.0 * n, "quiet_rate_per_h": 0.5 * n,
        "foreign_instances": 5, "empty_label_fraction": 0.1, "late_create_s": (0.0, 120.0),
        "vast_429_fraction": 0.01, "vast_5xx_fraction": 0.01, "vast_truncated_fraction": 0.01,
        "create_lost_fraction": 0.01, "create_failed_fraction": 0.01,
    }  # fmt: skip
    guards = config.guards.model_copy(update={
        "max_instances": n, "max_spend_per_hour": 1.0 * n + 10,
        "max_launches_per_tick": max(10, n // 10), "max_launches_per_hour": 2 * n + 10,
        "max_parked": max(1, n // 4), "paused": False})  # fmt: skip
    sim = config.sim.model_copy(update={"world": world})
    return config.model_copy(update={
        "provider": "sim", "demand": "sim", "sim": sim, "guards": guards,
        "gate": config.gate.model_copy(update={"mode": "act"})})  # fmt: skip


def forget_world_records(sim: Simulation) -> None:
    """Empty what the simulator keeps for a replay's report or its own speed, bounded but
    large next to a fleet's state: every task's wait and the simulated vast's and Curio's
    rendered objects (up to 16,384 listing rows and their JSON, 65,536 Curio nodes). Done at
    every sample, so that the RSS compared is the controller's, the wire's and the world's
    current state, not the simulator's caches filling."""
    sim.world.counters.waits.clear()
    vast_views._row.cache_clear()
    vast_api._TEXTS.clear()
    curio_rows._node.cache_clear()


def soak_real(config: Config, *, ticks: int | None, instances: int, warmup: int | None = None,
              sample_every: int | None = None, seed: int = 7,
              progress: TextIO | None = None) -> dict[str, Any]:  # fmt: skip
    """`ticks` ticks (default: 16 days of virtual time) of the controller `fleetgate run`
    builds on the simulator, sized by `soak_world`; warm-up: `WARMUP_S` of virtual time, at
    most half the ticks; a sample every tenth of the ticks unless told."""
    world = soak_world(config, instances)
    step_s = world.sim.seconds_per_tick
    days8 = math.ceil(WARMUP_S / step_s)
    ticks = ticks if ticks is not None else 2 * days8
    warmup = warmup if warmup is not None else min(days8, max(ticks // 2, 1))
    sample_every = sample_every if sample_every is not None else max(ticks // 10, 1)
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # measure the controller, not its log lines
    samples: list[dict[str, Any]] = []
    answers = {"approved": 0, "denied": 0}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            state = Path(tmp)
            app = assemble(world, state=state, clock=time.time, sleep=time.sleep, seed=seed)
            try:
                assert app.sim is not None  # provider sim
                sim, counters = app.sim, app.sim.world.counters
                forget_world_records(sim)
                app.controller.escalator.notifier.channels = []  # nobody to notify
                # the simulator's state is saved to the journal after every tick in service;
                # it is the world's, not the controller's, and would be half of each tick
                app.controller.after_tick = None
                started = time.monotonic()
                times: list[float] = []
                for n in range(1, ticks + 1):
                    t0 = time.perf_counter()
                    planned = app.controller.tick()
                    times.append(time.perf_counter() - t0)
                    got = operator.answer_due(app.journal, sim.now(), ANSWER_AFTER_S,
                                              planned.escalations)  # fmt: skip
                    for verdict, count in got.items():
                        answers[verdict] += count
                    if n in (warmup, ticks) or n % sample_every == 0:
                        sample = _sample(n, times, state / "journal.db", started)
                        own = len(sim.world.live_instances())  # foreign ones are the account's
                        sample["live_instances"] = own
                        sample["launched"] = counters.instances_launched
                        samples.append(sample)
                        times = []
                        forget_world_records(sim)
                        _report(progress, sample, ticks, f", {own} instances")
                stats = sim.stats
            finally:
                app.close()
    finally:
        logging.disable(previous)
    return {
        "path": "real", "ticks": ticks, "instances": instances, "step_s": step_s, "seed": seed,
        "days": round(ticks * step_s / 86_400.0, 2), **_memory(samples, warmup),
        "instances_seen": stats["instances_launched"],
        "instances_destroyed": stats["instances_destroyed"],
        "tasks_completed": stats["tasks_completed"], "escalations_answered": answers,
    }  # fmt: skip


def _memory(samples: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """RSS after the warm-up and at the end, the wall time, every sample."""
    start = next(s for s in samples if s["tick"] == warmup)
    end = samples[-1]
    return {"warmup_ticks": warmup, "rss_start_mb": start["rss_mb"],
            "rss_end_mb": end["rss_mb"],
            "rss_growth_pct": round((end["rss_mb"] / start["rss_mb"] - 1) * 100, 2),
            "wall_s": end["wall_s"], "samples": samples}  # fmt: skip


def _report(progress: TextIO | None, s: dict[str, Any], ticks: int, more: str = "") -> None:
    if progress is not None:
        print(f"tick {s['tick']:>7}/{ticks}: RSS {s['rss_mb']} MB, median tick "
              f"{s['median_tick_ms']} ms, journal {s['journal_mb']} MB{more}, {s['wall_s']} s",
              file=progress, flush=True)  # fmt: skip


def _sample(n: int, times: list[float], db: Path, started: float) -> dict[str, Any]:
    size = sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))
    return {"tick": n, "rss_mb": round(rss_mb(), 1),
            "median_tick_ms": round(statistics.median(times) * 1000, 2) if times else None,
            "journal_mb": round(size / 2**20, 1),
            "wall_s": round(time.monotonic() - started, 1)}  # fmt: skip


def render(r: dict[str, Any]) -> str:
    real = r["path"] == "real"
    head = "    tick   RSS MB  median tick ms  journal MB   wall s"
    lines = [head + ("  instances  launched" if real else "")]
    for s in r["samples"]:
        line = (f"{s['tick']:>8} {s['rss_mb']:>8} {s['median_tick_ms']!s:>15} "
                f"{s['journal_mb']:>11} {s['wall_s']:>8}")  # fmt: skip
        if real:
            line += f" {s['live_instances']:>10} {s['launched']:>9}"
        lines.append(line)
    days = f", {r['days']:g} days of virtual time" if real else ""
    if real:
        esc = r["escalations_answered"]
        fleet = (f"cap of {r['instances']} instances on the simulator, {r['instances_seen']} "
                 f"launched and {r['instances_destroyed']} destroyed, {r['tasks_completed']} "
                 f"tasks done, {esc['approved']} escalations approved and {esc['denied']} "
                 f"denied")  # fmt: skip
    else:
        fleet = (f"{r['instances']} instances ({r['churn_per_tick']} replaced per tick, "
                 f"{r['instances_seen']} seen in all)")  # fmt: skip
    lines.append(
        f"{r['ticks']} ticks ({r['path']} path{days}), {fleet}: RSS {r['rss_start_mb']} MB after "
        f"{r['warmup_ticks']} warm-up ticks, {r['rss_end_mb']} MB at the end "
        f"({r['rss_growth_pct']:+.1f} %)"
    )
    return "\n".join(lines)

"""`fleetgate bench soak`: many ticks at one fleet size; resident memory at the start and end.

Runs the real `Controller.tick()` (with a SQLite journal in a temporary directory) against the
synthetic fleet of `fleetgate bench tick`, with churn: every tick `churn` instances leave and as
many new ones (new ids, labels and machines) take their place, so per-instance state is created
and dropped all the time, and the journal grows as it would in service (events, hosts, actions,
escalations). The clock advances `step_s` virtual seconds per tick.

Resident memory is the current RSS (from /proc/self/statm, not the peak), sampled every
`sample_every` ticks; "start" is taken after `warmup` ticks, once the engine, caches and
SQLite's page cache are warm. Numbers, never assertions.
"""

from __future__ import annotations

import logging
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
from controller.service.config import Config
from controller.store.journal import Journal
from controller.tools.bench.tick import _T0, SyntheticFleet, _controller, synthetic_instances

_PAGE = os.sysconf("SC_PAGE_SIZE")


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


def soak(config: Config, *, ticks: int, instances: int, churn: int = 10, step_s: float = 30.0,
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
                        if progress is not None:
                            s = samples[-1]
                            print(f"tick {n:>7}/{ticks}: RSS {s['rss_mb']} MB, median tick "
                                  f"{s['median_tick_ms']} ms, journal {s['journal_mb']} MB, "
                                  f"{s['wall_s']} s", file=progress, flush=True)  # fmt: skip
            finally:
                journal.close()
    finally:
        logging.disable(previous)
    start = next(s for s in samples if s["tick"] == warmup)
    end = samples[-1]
    return {
        "ticks": ticks, "instances": instances, "churn_per_tick": churn, "step_s": step_s,
        "warmup_ticks": warmup, "rss_start_mb": start["rss_mb"], "rss_end_mb": end["rss_mb"],
        "rss_growth_pct": round((end["rss_mb"] / start["rss_mb"] - 1) * 100, 2),
        "instances_seen": instances + churn * ticks, "wall_s": end["wall_s"],
        "samples": samples,
    }  # fmt: skip


def _sample(n: int, times: list[float], db: Path, started: float) -> dict[str, Any]:
    size = sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))
    return {"tick": n, "rss_mb": round(rss_mb(), 1),
            "median_tick_ms": round(statistics.median(times) * 1000, 2) if times else None,
            "journal_mb": round(size / 2**20, 1),
            "wall_s": round(time.monotonic() - started, 1)}  # fmt: skip


def render(r: dict[str, Any]) -> str:
    lines = ["    tick   RSS MB  median tick ms  journal MB   wall s"]
    for s in r["samples"]:
        lines.append(f"{s['tick']:>8} {s['rss_mb']:>8} {s['median_tick_ms']!s:>15} "
                     f"{s['journal_mb']:>11} {s['wall_s']:>8}")  # fmt: skip
    lines.append(
        f"{r['ticks']} ticks at {r['instances']} instances ({r['churn_per_tick']} replaced per "
        f"tick, {r['instances_seen']} seen in all): RSS {r['rss_start_mb']} MB after "
        f"{r['warmup_ticks']} warm-up ticks, {r['rss_end_mb']} MB at the end "
        f"({r['rss_growth_pct']:+.1f} %)"
    )
    return "\n".join(lines)

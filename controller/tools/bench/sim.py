"""`fleetgate bench sim`: time whole ticks of the controller on the simulator.

Measures `Controller.tick()` end to end (sense, track, facts, match, decide, guards, journal,
act, escalate) with no scheduler waits and no terminal output, and prints the distribution.
Numbers, never assertions: the machine may be shared and noisy.
"""

from __future__ import annotations

import logging
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from controller.service.assemble import assemble
from controller.service.config import Config


def bench_sim(config: Config, ticks: int, seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        app = assemble(config, state=Path(tmp), clock=time.time, sleep=time.sleep, seed=seed)
        app.controller.escalator.notifier.channels = []  # time the controller, not the terminal
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            times = []
            for _ in range(ticks):
                start = time.perf_counter()
                app.controller.tick()
                times.append(time.perf_counter() - start)
        finally:
            logging.disable(previous)
            stats = app.sim.stats if app.sim else {}
            app.close()
    times.sort()
    return {
        "ticks": ticks, "seed": seed, "total_s": round(sum(times), 3),
        "median_ms": round(statistics.median(times) * 1000, 2),
        "p95_ms": round(times[int(0.95 * (len(times) - 1))] * 1000, 2),
        "max_ms": round(times[-1] * 1000, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "instances_launched": stats.get("instances_launched"),
        "tasks_completed": stats.get("tasks_completed"),
    }  # fmt: skip


def render(r: dict[str, Any]) -> str:
    return (
        f"{r['ticks']} ticks (seed {r['seed']}): total {r['total_s']} s, "
        f"median {r['median_ms']} ms, "
        f"p95 {r['p95_ms']} ms, max {r['max_ms']} ms, peak RSS {r['peak_rss_mb']} MB; "
        f"{r['instances_launched']} instances launched, {r['tasks_completed']} tasks completed"
    )

"""Task arrivals: a synthetic busy/quiet Poisson process, or a trace replayed in virtual time.

Pure: the RNG and the times are passed in.
"""

from __future__ import annotations

import math
import random

from controller.sim.config import SimConfig


def phase_at(t: float, start: float, config: SimConfig) -> tuple[float, float]:
    """(arrival rate per hour, end of the phase) at `t`; phases start busy at `start`."""
    cycle = config.busy_s + config.quiet_s
    cycle_start = start + ((t - start) // cycle) * cycle
    busy_end = cycle_start + config.busy_s
    if t < busy_end:
        return config.busy_rate_per_h, busy_end
    return config.quiet_rate_per_h, cycle_start + cycle


def next_synthetic_arrival(
    t: float, start: float, config: SimConfig, rng: random.Random
) -> float | None:
    """When the next synthetic task arrives after `t`, or None if none ever will.

    Memoryless: an exponential gap drawn at the current phase's rate; if it reaches past the
    phase's end, draw again from that end at the next phase's rate.
    """
    busy = config.busy_rate_per_h > 0
    quiet = config.quiet_rate_per_h > 0 and config.quiet_s > 0
    if not (busy or quiet):
        return None
    while True:
        rate, end = phase_at(t, start, config)
        if rate > 0:
            candidate = t + rng.expovariate(rate / 3600.0)
            if candidate < end:
                return candidate
        # Move to the next phase; nudge past float rounding so the loop always advances.
        t = end if end > t else math.nextafter(t, math.inf)


def draw_task_name(config: SimConfig, rng: random.Random) -> str:
    """A task name drawn by `config.task_weights`."""
    names = list(config.task_weights)
    weights = [config.task_weights[n] for n in names]
    return rng.choices(names, weights=weights)[0]


def draw_service_s(config: SimConfig, rng: random.Random) -> float:
    """A synthetic task's base service time, seconds."""
    return rng.uniform(config.service_min_s, config.service_max_s)

"""Generated workloads ("shapes") shipped with the simulator, as trace tasks.

`short`: short proving requests (SNARK-like: 20 to 120 s each) with a strong daily cycle, a
weekly one and bursts. The arrival rate at time t (seconds from the start, which is a Monday
00:00 of the shape's own clock) is

    rate(t) = peak_per_h x daily(t) x weekly(t) + bursts(t)

- `daily`: a raised cosine between `trough_ratio` (at 02:00) and 1 (at 14:00), so the peak is
  1 / trough_ratio times the trough (12 x by default);
- `weekly`: 1 on weekdays, `weekend_factor` on Saturday and Sunday;
- `bursts`: `bursts_per_day` on average (a Poisson process), each adding `burst_per_h`
  arrivals an hour for a uniform 5 to 20 minutes.

Arrivals are a non-homogeneous Poisson process drawn by thinning, run times are uniform in
[`service_min_s`, `service_max_s`]. Deterministic: the same parameters and seed give the same
tasks. Pure: no I/O, no clock; the RNG is made from the seed here.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass

from controller.sim.trace import TraceTask

DAY = 86_400.0
WEEK = 7 * DAY
SHAPES = ("short",)


@dataclass(frozen=True)
class ShortShape:
    """The `short` shape's parameters (see the module docstring)."""

    peak_per_h: float = 900.0
    trough_ratio: float = 1.0 / 12.0
    peak_hour: float = 14.0
    weekend_factor: float = 0.5
    bursts_per_day: float = 3.0
    burst_per_h: float = 1200.0
    burst_s: tuple[float, float] = (300.0, 1200.0)
    service_min_s: float = 20.0
    service_max_s: float = 120.0

    def daily(self, t: float) -> float:
        """The daily factor at `t`: 1 at `peak_hour`, `trough_ratio` twelve hours away."""
        phase = 2.0 * math.pi * ((t % DAY) / 3600.0 - self.peak_hour) / 24.0
        return self.trough_ratio + (1.0 - self.trough_ratio) * 0.5 * (1.0 + math.cos(phase))

    def weekly(self, t: float) -> float:
        """1 on weekdays, `weekend_factor` on days 5 and 6 of each week (Saturday, Sunday)."""
        return self.weekend_factor if (t % WEEK) // DAY >= 5 else 1.0

    def base_rate_per_h(self, t: float) -> float:
        """Arrivals an hour at `t` without bursts."""
        return self.peak_per_h * self.daily(t) * self.weekly(t)


def short_tasks(days: float, seed: int, shape: ShortShape | None = None) -> list[TraceTask]:
    """The `short` shape's tasks over `days` days, sorted by arrival (seconds from 0)."""
    if days <= 0:
        raise ValueError(f"days must be > 0, got {days!r}")
    p = shape or ShortShape()
    if not 0 < p.trough_ratio <= 1 or p.service_min_s <= 0 or p.service_max_s < p.service_min_s:
        raise ValueError("trough_ratio must be in (0, 1] and 0 < service_min_s <= service_max_s")
    rng = random.Random(f"shape:short:{seed}")
    horizon = days * DAY
    bursts = _bursts(horizon, p, rng)
    top = p.peak_per_h + (p.burst_per_h if bursts else 0.0)  # the thinning's bound, per hour
    tasks: list[TraceTask] = []
    t = 0.0
    started = 0  # bursts (sorted by start) begun by t; of them, those not yet over are `ends`
    ends: list[float] = []
    while True:
        t += rng.expovariate(top / 3600.0)
        if t >= horizon:
            break
        while started < len(bursts) and bursts[started][0] <= t:
            heapq.heappush(ends, bursts[started][1])
            started += 1
        while ends and ends[0] <= t:
            heapq.heappop(ends)
        # one term a burst under way, added one by one as a sum over the bursts added them
        rate = p.base_rate_per_h(t) + sum(p.burst_per_h for _ in ends)
        if rng.random() * top < rate:
            tasks.append(TraceTask(t, rng.uniform(p.service_min_s, p.service_max_s)))
    return tasks


def _bursts(horizon: float, p: ShortShape, rng: random.Random) -> list[tuple[float, float]]:
    """(start, end) of each burst: a Poisson process of starts, uniform lengths."""
    out: list[tuple[float, float]] = []
    if p.bursts_per_day <= 0 or p.burst_per_h <= 0:
        return out
    t = 0.0
    while True:
        t += rng.expovariate(p.bursts_per_day / DAY)
        if t >= horizon:
            return out
        out.append((t, t + rng.uniform(*p.burst_s)))


def tasks_of(name: str, days: float, seed: int) -> list[TraceTask]:
    """The tasks of shape `name` (one of `SHAPES`); ValueError for another name."""
    if name == "short":
        return short_tasks(days, seed)
    raise ValueError(f"unknown shape {name!r} (expected one of {', '.join(SHAPES)})")

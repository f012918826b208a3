"""The market oracle: the oracle with stop and start, run on the simulated market's own machines.

`baselines.oracle` proves every task at the reference rate and prices every instance at one
price (fleetgate's average), so on a market with fast hosts a policy can come in under it. This
one knows what a perfect renter would: every machine's true rate and price. Its fleet is the
market's machines that never crash-loop and that nobody else holds, best first by price per
unit of work (dph x reference rate / true rate), at most `max_instances` of them ("levels").
Knowing every arrival, it serves each task first come, first served on the lowest level with a
free slot, in the task's service time scaled by that machine's speed (true rate / reference
rate); when every slot is taken the task waits for the first to free. Each level then pays as
one level of `baselines.oracle(warm=True)` at its own machine's price and storage: its busy
ticks, and for each gap between two needs the least of idling, a new boot, and a stop and start.
No faults, no benchmark noise, no start ever waits for the host's GPUs.

It is the yardstick, not a proof of optimality: the assignment is a greedy first fit, and the
best machines by price per unit of work are not the best for a level that mostly idles. Pure:
machines, tasks and parameters in, an `Outcome` out.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from controller.sim.machines import Machine
from controller.sim.trace import TraceTask
from controller.tools.replay import baselines
from controller.tools.replay.results import BaselineParams, Outcome, Sample


@dataclass(frozen=True)
class Level:
    """One machine of the oracle's fleet."""

    machine_id: str
    speed: float
    """True rate / the reference rate: a task takes its service time / this."""
    dph: float
    storage_dph: float
    """Dollars an hour while stopped: the machine's storage price x the disk."""


def levels(
    machines: Iterable[Machine], *, reference_rate: float, disk_gb: float,
    held: frozenset[str] = frozenset(), cap: int | None = None,
) -> list[Level]:  # fmt: skip
    """The market's usable machines, best price per unit of work first, at most `cap`."""
    usable = [m for m in machines if not m.crash_loop and m.rate > 0 and m.machine_id not in held]
    usable.sort(key=lambda m: (m.dph / m.rate, m.machine_id))
    return [Level(m.machine_id, m.rate / reference_rate, m.dph, m.storage_per_gb_h * disk_gb)
            for m in usable[:cap]]  # fmt: skip


def assign(
    tasks: Sequence[TraceTask], fleet: Sequence[Level], slots: int, horizon_s: float
) -> tuple[list[list[TraceTask]], list[float]]:
    """Each task (by arrival) on the lowest level with a slot free at its arrival, else on the
    slot that frees first: (the tasks each level runs, as run there; every task's wait, up to
    the horizon for one that never starts)."""
    free = [[-math.inf] * slots for _ in fleet]  # per level, when each slot frees (a heap)
    ran: list[list[TraceTask]] = [[] for _ in fleet]
    waits = []
    for task in sorted(tasks, key=lambda t: t.arrival_s):
        k = next((k for k, f in enumerate(free) if f[0] <= task.arrival_s), None)
        if k is None:
            k = min(range(len(free)), key=lambda j: (free[j][0], j), default=None)
        start = math.inf if k is None else max(task.arrival_s, free[k][0])
        waits.append(min(start, horizon_s) - task.arrival_s)
        if k is None or start >= horizon_s:
            continue
        took = task.service_s / fleet[k].speed
        heapq.heapreplace(free[k], start + took)
        ran[k].append(TraceTask(start, took))
    return ran, waits


def market_oracle(tasks: Sequence[TraceTask], p: BaselineParams, fleet: Sequence[Level]) -> Outcome:
    """The market oracle (see the module docstring) over `fleet` (from `levels`)."""
    kept = baselines.within(tasks, p.horizon_s)
    ran, waits = assign(kept, fleet, p.slots, p.horizon_s)
    censored = len(kept) - sum(len(run) for run in ran)  # never started before the horizon
    parts = []
    for level, run in zip(fleet, ran, strict=True):
        if run:
            one = replace(p, dph=level.dph, storage_dph=level.storage_dph, max_instances=None)
            parts.append(baselines.oracle(run, one, warm=True))
    cost = sum(o.cost_usd for o in parts)
    instance_s = sum(o.instance_s for o in parts)
    return Outcome(
        name="oracle_market", instance_s=instance_s,
        dph=cost / instance_s * 3600.0 if instance_s else 0.0,
        gpus_per_instance=p.gpus_per_instance, waits=tuple(waits), censored=censored,
        instances_started=sum(o.instances_started for o in parts),
        peak_instances=_peak(ran, p), series=_series(parts), spend_usd=cost,
        notes={"starts_from_stopped": sum(o.notes.get("starts_from_stopped", 0) for o in parts),
               "machines_used": len(parts), "machines_usable": len(fleet)},
    )  # fmt: skip


def _peak(ran: Sequence[Sequence[TraceTask]], p: BaselineParams) -> int:
    """The most levels holding a task at once."""
    changes: dict[float, int] = {}
    for run in ran:
        for start, end in _on_intervals(run, p.horizon_s):
            changes[start] = changes.get(start, 0) + 1
            changes[end] = changes.get(end, 0) - 1
    peak = level = 0
    for when in sorted(changes):
        level += changes[when]
        peak = max(peak, level)
    return peak


def _on_intervals(run: Sequence[TraceTask], horizon_s: float) -> list[tuple[float, float]]:
    """The spans in which a level holds at least one task."""
    spans: list[tuple[float, float]] = []
    for start, level in baselines.concurrency_steps(run, horizon_s):
        if level > 0 and (not spans or spans[-1][1] != math.inf):
            spans.append((start, math.inf))
        elif level == 0 and spans and spans[-1][1] == math.inf:
            spans[-1] = (spans[-1][0], start)
    if spans and spans[-1][1] == math.inf:
        spans[-1] = (spans[-1][0], horizon_s)
    return spans


def _series(parts: Sequence[Outcome]) -> tuple[Sample, ...]:
    """The levels' series summed point by point (they share the sample grid)."""
    if not parts:
        return ()
    out = []
    for points in zip(*(o.series for o in parts), strict=False):
        out.append(Sample(points[0].t, 0, sum(s.running for s in points), 0,
                          sum(s.serving for s in points), 0,
                          sum(s.spend_usd for s in points)))  # fmt: skip
    return tuple(out)

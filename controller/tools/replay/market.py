"""The market oracle: the oracle with stop and start, run on the simulated market's own machines.

`baselines.oracle` proves every task at the reference rate and prices every instance at one
price (fleetgate's average), so on a market with fast hosts a policy can come in under it. This
one knows what a perfect renter would: every machine's true rate and price. Its fleet is the
market's machines that never crash-loop and that nobody else holds, best first by price per
unit of work (dph x reference rate / true rate), at most `max_instances` of them ("levels").
Knowing every arrival, it starts each task on the lowest level with a free slot, or lets it
wait first come, first served for the first slot to free; when a slot frees and nobody waits,
the task on the highest level moves down into it for free, its remaining work at the new
machine's speed (true rate / reference rate). The occupied slots are so always the lowest, as
in `baselines.oracle`'s stack: on identical machines it is `oracle(warm=True)` exactly. Each
level then pays as one level of that oracle at its own machine's price and storage: its busy
ticks, and for each gap between two needs the least of idling, a new boot, and a stop and
start. No faults, no benchmark noise, no start ever waits for the host's GPUs.

It is a yardstick, not a proof of a minimum: machines are ranked by price per unit of work
alone, though a level that mostly idles or stays stopped would rather have the lowest price or
storage. Pure: machines, tasks and parameters in, an `Outcome` out.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
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


def identical(p: BaselineParams, count: int) -> list[Level]:
    """`count` machines as the other oracles see them: each proves at the reference rate, at
    `p.dph` running and `p.storage_dph` stopped."""
    return [Level(f"same-{k}", 1.0, p.dph, p.storage_dph) for k in range(count)]


def assign(
    tasks: Sequence[TraceTask], fleet: Sequence[Level], slots: int, horizon_s: float,
    *, moves: bool = True,
) -> tuple[list[list[TraceTask]], list[float]]:  # fmt: skip
    """Run the tasks (by arrival) on the fleet: (what each level ran, as spans of its slots'
    time; every task's wait, up to the horizon for one that never starts).

    A task starts on the lowest level with a free slot, or waits first come, first served for
    the first slot to free. When a slot frees and nobody waits, the task on the highest level
    moves down into it, its remaining work at the new machine's speed: the occupied slots are
    always the lowest, as in the other oracles' stack, and on identical machines the levels are
    on exactly when theirs are.

    `moves=False`: a task stays where it started, as a Curio task does on its node. Knowing
    every task's end, a new task starts beside the running task whose level frees nearest its
    own end (the lowest such level on a tie), else on the lowest empty level: tasks that end
    together share a machine, which then stops with them (`_nearest_end`)."""
    order = sorted(range(len(tasks)), key=lambda i: tasks[i].arrival_s)
    held: list[list[int | None]] = [[None] * slots for _ in fleet]
    where: dict[int, tuple[int, int, float, float]] = {}  # task -> level, slot, since, finish
    ran: list[list[TraceTask]] = [[] for _ in fleet]
    waits = [horizon_s - t.arrival_s for t in tasks]
    ends: list[tuple[float, int]] = []  # (finish, task), stale once the task moved
    waiting: deque[int] = deque()

    def place(i: int, k: int, slot: int, t: float, work: float) -> None:
        finish = t + work / fleet[k].speed
        held[k][slot], where[i] = i, (k, slot, t, finish)
        heapq.heappush(ends, (finish, i))

    def leave(i: int, t: float) -> tuple[int, int, float]:
        k, slot, since, finish = where.pop(i)
        held[k][slot] = None
        ran[k].append(TraceTask(since, t - since))
        return k, slot, (finish - t) * fleet[k].speed  # reference work left

    def free_slot(t: float, work: float) -> tuple[int, int] | None:
        if not moves:
            return _nearest_end(held, where, fleet, t, work)
        return next(((k, j) for k, row in enumerate(held) for j, i in enumerate(row)
                     if i is None), None)  # fmt: skip

    def top_task() -> int | None:
        return next((i for row in reversed(held) for i in row if i is not None), None)

    arrivals = iter(order)
    nxt = next(arrivals, None)
    while True:
        while ends and (ends[0][1] not in where or where[ends[0][1]][3] != ends[0][0]):
            heapq.heappop(ends)  # a task that moved: its old finish
        done = ends[0][0] if ends else math.inf
        come = tasks[nxt].arrival_s if nxt is not None else math.inf
        t = min(done, come)
        if t >= horizon_s:
            break
        if done <= come:  # a slot frees (before an arrival at the same moment)
            k, slot, _ = leave(heapq.heappop(ends)[1], t)
            if waiting:
                i = waiting.popleft()
                waits[i] = t - tasks[i].arrival_s
                place(i, k, slot, t, tasks[i].service_s)
            elif moves and (top := top_task()) is not None and where[top][0] > k:
                place(top, k, slot, t, leave(top, t)[2])
            continue
        assert nxt is not None  # t came from an arrival
        new, nxt = nxt, next(arrivals, None)
        spot = free_slot(t, tasks[new].service_s)
        if spot is None:
            waiting.append(new)
        else:
            waits[new] = 0.0
            place(new, *spot, t, tasks[new].service_s)
    for i in list(where):
        k, _, since, finish = where[i]
        ran[k].append(TraceTask(since, finish - since))
    return ran, waits


def _nearest_end(
    held: Sequence[Sequence[int | None]], where: Mapping[int, tuple[int, int, float, float]],
    fleet: Sequence[Level], t: float, work: float,
) -> tuple[int, int] | None:  # fmt: skip
    """The free slot for a task starting at `t` with `work` seconds at the reference rate, when
    tasks never move: beside the running tasks whose level frees nearest the task's own end on
    that level (the lowest level on a tie), else the lowest empty level; None if all are full."""
    best: tuple[float, int, int] | None = None
    empty: tuple[int, int] | None = None
    for k, row in enumerate(held):
        if None not in row:
            continue
        running = [where[i][3] for i in row if i is not None]
        if not running:
            empty = empty or (k, row.index(None))
            continue
        gap = abs(max(running) - (t + work / fleet[k].speed))
        if best is None or gap < best[0]:
            best = (gap, k, row.index(None))
    return (best[1], best[2]) if best is not None else empty


def market_oracle(
    tasks: Sequence[TraceTask], p: BaselineParams, fleet: Sequence[Level],
    *, moves: bool = True, name: str = "oracle_market",
) -> Outcome:  # fmt: skip
    """The market oracle (see the module docstring) over `fleet` (from `levels`); with
    `moves=False` no task moves (see `assign`)."""
    kept = baselines.within(tasks, p.horizon_s)
    ran, waits = assign(kept, fleet, p.slots, p.horizon_s, moves=moves)
    censored = sum(1 for w, t in zip(waits, kept, strict=True) if t.arrival_s + w >= p.horizon_s)
    parts = []
    for level, run in zip(fleet, ran, strict=True):
        if run:
            one = replace(p, dph=level.dph, storage_dph=level.storage_dph, max_instances=None)
            parts.append(baselines.oracle(run, one, warm=True))
    cost = sum(o.cost_usd for o in parts)
    instance_s = sum(o.instance_s for o in parts)
    return Outcome(
        name=name, instance_s=instance_s,
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

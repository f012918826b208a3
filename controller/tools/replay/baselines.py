"""Three ways to run the same tasks without fleetgate, to judge its cost and waits against.

- `static_peak`: a fixed fleet sized for the trace's peak concurrency, up for the whole horizon.
- `proportional`: a KEDA/HPA-style scaler. Every `interval_s` it wants
  ceil((waiting + running) / tasks_per_instance) instances; it launches at once to grow and
  shrinks only to the highest target of the last `cooldown_s` (the scale-down stabilization
  window), giving back idle instances only. A new instance serves after `boot_s`.
- `oracle`: a lower bound on cost. It knows every arrival in advance; each task starts the
  moment it arrives on an instance started exactly one boot time before it is needed, tasks
  pack perfectly (ceil(running / slots) instances), and between two needs an instance is kept
  idle when that is cheaper than another boot. Cost = busy instance-time + boot per start (+ the
  idle gaps kept), so no policy with these instances can pay less without making tasks wait.
  Under a fleet cap (`max_instances`) it never runs more than the cap: when every slot of the
  capped fleet is taken, tasks wait for one in arrival order (as on a capped fleet always
  booted ahead of need). Its waits are then the least a capped first-come-first-served policy
  can give, and its cost the least for those waits (a policy that lets tasks wait longer may
  pack them tighter and pay less).
- `oracle(warm=True)`: the same, with vast's stop and start too (fleetgate's warm pool): a gap
  between two needs may be spent stopped, paying storage and a start's loading time, when
  that is cheaper than idling or a new boot. It is the lower bound for a fleet that parks.
- With `tick_s` both oracles change the fleet only at ticks, as every controller in the
  simulator does (a rent, destroy, stop or start happens at a tick and bills from it): a
  need bills whole ticks, a stop and a start are two ticks apart. Still lower bounds there,
  and higher than at any moment by the rounding alone.

All assume every instance serves a task in its trace service time (the simulator's reference
rate) and never fails. Pure: tasks and parameters in, an `Outcome` out.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from controller.sim.trace import TraceTask
from controller.tools.replay.fifo import FifoFleet
from controller.tools.replay.results import BaselineParams, Outcome, Sample


def within(tasks: Sequence[TraceTask], horizon_s: float) -> list[TraceTask]:
    """The tasks that arrive before the horizon, by arrival."""
    return sorted((t for t in tasks if t.arrival_s < horizon_s), key=lambda t: t.arrival_s)


def concurrency_steps(tasks: Sequence[TraceTask], horizon_s: float) -> list[tuple[float, int]]:
    """(time, tasks running from then on) if every task ran from its arrival, up to the horizon."""
    changes: dict[float, int] = {}
    for task in within(tasks, horizon_s):
        end = task.arrival_s + task.service_s
        changes[task.arrival_s] = changes.get(task.arrival_s, 0) + 1
        if end < horizon_s:
            changes[end] = changes.get(end, 0) - 1
    steps, level = [], 0
    for when in sorted(changes):
        level += changes[when]
        steps.append((when, level))
    return steps


def peak_concurrency(tasks: Sequence[TraceTask], horizon_s: float) -> int:
    """Most tasks running at once if each started on arrival (intervals are [start, end))."""
    return max((level for _, level in concurrency_steps(tasks, horizon_s)), default=0)


def static_peak(tasks: Sequence[TraceTask], p: BaselineParams) -> Outcome:
    """A fixed fleet for the peak: ceil(peak concurrency / slots), capped at max_instances.

    Booted before the trace starts (its boot is billed), serving from 0 to the horizon.
    """
    kept = within(tasks, p.horizon_s)
    size = math.ceil(peak_concurrency(kept, p.horizon_s) / p.slots)
    if p.max_instances is not None:
        size = min(size, p.max_instances)
    fleet = FifoFleet(kept, p.slots)
    for _ in range(size):
        fleet.launch(-p.boot_s, 0.0)
    series = [_sample(fleet, t, p) for t in _sample_times(p, fleet)]
    return _outcome("static", fleet, p, series, notes={"instances": size})


def proportional(tasks: Sequence[TraceTask], p: BaselineParams) -> Outcome:
    """The KEDA/HPA-style scaler (see the module docstring)."""
    fleet = FifoFleet(within(tasks, p.horizon_s), p.slots)
    window: deque[tuple[float, int]] = deque()  # (time, target) within the cooldown
    series: list[Sample] = []
    hours = {"booting": 0.0, "busy": 0.0, "idle": 0.0}  # per poll, until the next one
    next_sample = 0.0
    polls = math.floor(p.horizon_s / p.interval_s)
    for k in range(polls + 1):
        t = k * p.interval_s
        fleet.run_until(t)
        target = math.ceil(fleet.in_system() / p.tasks_per_instance)
        if p.max_instances is not None:
            target = min(target, p.max_instances)
        window.append((t, target))
        while window[0][0] < t - p.cooldown_s:
            window.popleft()
        live = fleet.live()
        if target > live:
            for _ in range(target - live):
                fleet.launch(t, t + p.boot_s)
        else:
            fleet.remove_idle(live - max(w for _, w in window), t)
        for state, count in fleet.states(t).items():
            hours[state] += count * min(p.interval_s, p.horizon_s - t) / 3600.0
        if t >= next_sample:
            series.append(_sample(fleet, t, p))
            next_sample += p.sample_s
    fleet.run_until(p.horizon_s)
    notes = {"cooldown_s": p.cooldown_s, "interval_s": p.interval_s,
             "instance_hours_by_state": {k: round(v, 4) for k, v in hours.items()}}  # fmt: skip
    return _outcome("proportional", fleet, p, series, notes=notes)


def capped_starts(tasks: Sequence[TraceTask], slots: int) -> list[TraceTask]:
    """Each task (by arrival) as it runs on `slots` slots always ready, first come first
    served: started at max(arrival, the first slot free), for its service time."""
    free: list[float] = [-math.inf] * slots  # when each slot is next free (a heap)
    out = []
    for task in sorted(tasks, key=lambda t: t.arrival_s):
        start = max(task.arrival_s, heapq.heappop(free))
        heapq.heappush(free, start + task.service_s)
        out.append(TraceTask(start, task.service_s))
    return out


def oracle(tasks: Sequence[TraceTask], p: BaselineParams, *, warm: bool = False) -> Outcome:
    """The lower bound (see the module docstring): every wait is 0 without a fleet cap; with
    one, a task waits only while every slot of the capped fleet is taken.

    `warm`: it may also stop an instance between two needs and start it again (vast's stop
    and start, as fleetgate's warm pool does), at the best a stop can cost: storage for the
    gap until the start and `p.start_s` of loading, never a wait for the host's GPUs nor a
    lost machine. A gap then costs the least of keeping it idle, a new boot, and that
    (`oracle_warm`)."""
    kept = within(tasks, p.horizon_s)
    waits: list[float] = [0.0] * len(kept)
    censored = 0
    run = kept
    if p.max_instances is not None:
        room = p.max_instances * p.slots
        started = (capped_starts(kept, room) if room
                   else [TraceTask(math.inf, t.service_s) for t in kept])  # fmt: skip
        waits = [min(s.arrival_s, p.horizon_s) - t.arrival_s
                 for s, t in zip(started, kept, strict=True)]  # fmt: skip
        run = [s for s in started if s.arrival_s < p.horizon_s]
        censored = len(kept) - len(run)
    steps = concurrency_steps(run, p.horizon_s)
    if p.tick_s:
        return _ticked(steps, p, warm, waits, censored)
    on_since: dict[int, float] = {}  # level -> when it last turned on
    off_since: dict[int, float] = {}  # level -> when it last turned off
    paid, starts, restarts, peak, now_running = 0.0, 0, 0, 0, 0
    series: list[Sample] = []
    samples = iter(_grid(p))
    next_sample = next(samples, math.inf)
    for when, running in [*steps, (math.inf, 0)]:
        while next_sample < when and next_sample <= p.horizon_s:
            open_s = sum(next_sample - s for s in on_since.values())
            spend = (paid + open_s) / 3600.0 * p.dph
            series.append(Sample(next_sample, 0, now_running, 0, len(on_since), 0, spend))
            next_sample = next(samples, math.inf)
        if when == math.inf:
            break
        need = math.ceil(running / p.slots)
        for k in range(len(on_since) + 1, need + 1):  # levels turning on
            gap = when - off_since.pop(k, -math.inf)
            parked = math.inf  # stopped through the gap: storage, then a start's loading
            if warm and p.start_s is not None and p.start_s <= gap < math.inf:
                parked = p.start_s + (gap - p.start_s) * p.storage_dph / p.dph
            if min(gap, parked) > p.boot_s:
                starts, paid = starts + 1, paid + p.boot_s
            elif parked < gap:
                restarts, paid = restarts + 1, paid + parked
            else:
                paid += gap  # kept idle through a gap shorter than a boot
            on_since[k] = when
        for k in range(need + 1, len(on_since) + 1):  # levels turning off
            paid += when - on_since.pop(k)
            off_since[k] = when
        peak, now_running = max(peak, need), running
    paid += sum(p.horizon_s - s for s in on_since.values())
    return Outcome(
        name="oracle_warm" if warm else "oracle", instance_s=paid, dph=p.dph,
        gpus_per_instance=p.gpus_per_instance, waits=tuple(waits), censored=censored,
        instances_started=starts, peak_instances=peak, series=tuple(series),
        notes={"starts_from_stopped": restarts} if warm else {},
    )  # fmt: skip


def needs_by_tick(
    steps: Sequence[tuple[float, int]], p: BaselineParams
) -> list[tuple[int, dict[int, float]]]:
    """Per tick of `p.tick_s`: the most instances needed in it (ceil(running / slots)), and for
    each level above the tick's opening need, the moment in the tick it is first needed."""
    tick = float(p.tick_s or 0.0)
    out: list[tuple[int, dict[int, float]]] = []
    need, j = 0, 0
    for k in range(math.ceil(p.horizon_s / tick)):
        while j < len(steps) and steps[j][0] <= k * tick:  # changes at the tick open it
            need, j = math.ceil(steps[j][1] / p.slots), j + 1
        top, first = need, {}
        while j < len(steps) and steps[j][0] < (k + 1) * tick:
            when, running = steps[j]
            need = math.ceil(running / p.slots)
            for level in range(top + 1, need + 1):
                first[level] = when
            top, j = max(top, need), j + 1
        out.append((top, first))
    return out


def _ticked(
    steps: Sequence[tuple[float, int]], p: BaselineParams, warm: bool,
    waits: list[float], censored: int,
) -> Outcome:  # fmt: skip
    """The oracle when the fleet changes only at ticks (`p.tick_s`), as in the simulator, where
    every rent, destroy, stop and start happens at a tick and bills from it: a level bills
    every tick it is needed in; one first needed at t in tick j was rented at the last tick
    at least a boot before t, or started at the last tick at least `start_s` before it (a stop
    and a start are two ticks apart at least), or kept idle since it was last needed; each
    gap costs the least of those. Never cheaper than the same oracle at any moment."""
    tick = float(p.tick_s or 0.0)

    def lead(t: float, j: int, ahead: float) -> float:  # billed before tick j to serve by t
        return j * tick - math.floor((t - ahead) / tick) * tick

    off_since: dict[int, float] = {}  # level -> the tick it stopped billing at
    paid, starts, restarts, peak, on = 0.0, 0, 0, 0, 0
    spend_at: list[tuple[float, int]] = []  # per tick: spent by its end, levels billed
    for j, (need, first) in enumerate(needs_by_tick(steps, p)):
        for level in range(on + 1, need + 1):
            t = first.get(level, j * tick)
            boot = lead(t, j, p.boot_s)
            s = off_since.pop(level, None)
            idle = math.inf if s is None else j * tick - s
            parked = math.inf
            if warm and p.start_s is not None and s is not None:
                b = math.floor((t - p.start_s) / tick) * tick  # the start's tick
                if b >= s + tick:
                    parked = (b - s) * p.storage_dph / p.dph + j * tick - b
            cost = min(boot, idle, parked)
            if cost == boot and boot < idle:
                starts += 1
            elif cost == parked and parked < idle:
                restarts += 1
            paid += cost
        for level in range(need + 1, on + 1):
            off_since[level] = j * tick
        on, peak = need, max(peak, need)
        paid += need * (min((j + 1) * tick, p.horizon_s) - j * tick)
        spend_at.append((paid / 3600.0 * p.dph, need))
    running = iter([*steps, (math.inf, 0)])
    series, now_running = [], 0
    step = next(running)
    for t in _grid(p):
        while step[0] <= t:
            now_running, step = step[1], next(running)
        spend, billed = spend_at[min(int(t // tick), len(spend_at) - 1)]
        series.append(Sample(t, 0, now_running, 0, billed, 0, spend))
    return Outcome(
        name="oracle_warm" if warm else "oracle", instance_s=paid, dph=p.dph,
        gpus_per_instance=p.gpus_per_instance, waits=tuple(waits), censored=censored,
        instances_started=starts, peak_instances=peak, series=tuple(series),
        notes={"starts_from_stopped": restarts, "tick_s": tick} if warm else {"tick_s": tick},
    )  # fmt: skip


def _grid(p: BaselineParams) -> Iterator[float]:
    n = math.floor(p.horizon_s / p.sample_s)
    return (k * p.sample_s for k in range(n + 1))


def _sample_times(p: BaselineParams, fleet: FifoFleet) -> Iterator[float]:
    """The sample grid, moving `fleet` to each point before it is sampled."""
    for t in _grid(p):
        fleet.run_until(t)
        yield t
    fleet.run_until(p.horizon_s)


def _sample(fleet: FifoFleet, t: float, p: BaselineParams) -> Sample:
    booting = fleet.booting()
    spend = fleet.instance_seconds(t) / 3600.0 * p.dph
    return Sample(t, fleet.queued(), fleet.running(), booting, fleet.live() - booting, 0, spend)


def _outcome(
    name: str, fleet: FifoFleet, p: BaselineParams, series: list[Sample], notes: dict[str, Any]
) -> Outcome:
    censored = fleet.censored_waits(p.horizon_s)
    return Outcome(
        name=name, instance_s=fleet.instance_seconds(p.horizon_s), dph=p.dph,
        gpus_per_instance=p.gpus_per_instance, waits=tuple(fleet.waits + censored),
        censored=len(censored), instances_started=fleet.started, peak_instances=fleet.peak,
        series=tuple(series), notes=dict(notes),
    )  # fmt: skip

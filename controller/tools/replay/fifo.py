"""A small discrete-event model of a task queue served by rented instances, first come first served.

Instances are rented at a time and can take tasks from `ready_at` (after their boot); each runs
up to `slots` tasks at once. A task goes to the lowest-numbered ready instance with a free slot.
At one moment, completions come first, then instances becoming ready, then arrivals, then
dispatch. Pure and deterministic: time moves only through `run_until`.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from controller.sim.trace import TraceTask


@dataclass
class _Instance:
    id: int
    launched: float
    ready_at: float
    busy: int = 0


class FifoFleet:
    """The queue, the instances and the bill of one baseline's run."""

    def __init__(self, tasks: Sequence[TraceTask], slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots!r}")
        self._tasks = sorted(tasks, key=lambda t: t.arrival_s)
        self._slots = slots
        self._next_arrival = 0
        self._queue: deque[int] = deque()
        self._finishing: list[tuple[float, int, int]] = []  # (done_at, task index, instance id)
        self._instances: dict[int, _Instance] = {}
        self._next_id = 0
        self._now = float("-inf")
        self._closed_s = 0.0  # instance-seconds of removed instances
        self.waits: list[float] = []
        self.started = 0
        self.peak = 0

    # --- the fleet

    def launch(self, at: float, ready_at: float) -> None:
        """Rent one instance at `at`; it takes tasks from `ready_at`."""
        self._instances[self._next_id] = _Instance(self._next_id, at, ready_at)
        self._next_id += 1
        self.started += 1
        self.peak = max(self.peak, len(self._instances))

    def live(self) -> int:
        return len(self._instances)

    def booting(self) -> int:
        return sum(1 for i in self._instances.values() if i.ready_at > self._now)

    def states(self, t: float) -> dict[str, int]:
        """Live instances at `t` by what they do: booting, busy (holding a task) or idle."""
        out = {"booting": 0, "busy": 0, "idle": 0}
        for inst in self._instances.values():
            out["booting" if inst.ready_at > t else "busy" if inst.busy else "idle"] += 1
        return out

    def remove_idle(self, count: int, at: float) -> int:
        """Give back up to `count` instances holding no task (booting ones first, newest first).

        Returns how many went; busy instances are never removed (they drain first).
        """
        idle = [i for i in self._instances.values() if i.busy == 0]
        idle.sort(key=lambda i: (i.ready_at <= at, -i.id))
        gone = idle[: max(count, 0)]
        for inst in gone:
            self._closed_s += max(0.0, at - inst.launched)
            del self._instances[inst.id]
        return len(gone)

    # --- the queue

    def queued(self) -> int:
        return len(self._queue)

    def running(self) -> int:
        return sum(i.busy for i in self._instances.values())

    def in_system(self) -> int:
        """Tasks arrived and not finished: waiting plus running."""
        return self.queued() + self.running()

    # --- time

    def run_until(self, t: float) -> None:
        """Apply every event due by `t`, in time order."""
        while (when := self._next_event()) is not None and when <= t:
            self._now = when
            self._complete(when)
            while self._next_arrival < len(self._tasks) and (
                self._tasks[self._next_arrival].arrival_s <= when
            ):
                self._queue.append(self._next_arrival)
                self._next_arrival += 1
            self._dispatch(when)
        self._now = max(self._now, t)

    def _next_event(self) -> float | None:
        times = [self._finishing[0][0]] if self._finishing else []
        if self._next_arrival < len(self._tasks):
            times.append(self._tasks[self._next_arrival].arrival_s)
        times += [i.ready_at for i in self._instances.values() if i.ready_at > self._now]
        return min(times, default=None)

    def _complete(self, t: float) -> None:
        while self._finishing and self._finishing[0][0] <= t:
            _, _, inst_id = heapq.heappop(self._finishing)
            self._instances[inst_id].busy -= 1

    def _dispatch(self, t: float) -> None:
        if not self._queue:
            return
        for inst in sorted(self._instances.values(), key=lambda i: i.id):
            if inst.ready_at > t:
                continue
            while inst.busy < self._slots and self._queue:
                index = self._queue.popleft()
                task = self._tasks[index]
                inst.busy += 1
                heapq.heappush(self._finishing, (t + task.service_s, index, inst.id))
                self.waits.append(t - task.arrival_s)
            if not self._queue:
                return

    # --- the end

    def instance_seconds(self, t: float) -> float:
        """Billed instance-seconds up to `t` (removed instances up to their removal)."""
        return self._closed_s + sum(max(0.0, t - i.launched) for i in self._instances.values())

    def censored_waits(self, t: float) -> list[float]:
        """`t` - arrival for every task still waiting at `t`."""
        return [t - self._tasks[i].arrival_s for i in self._queue]

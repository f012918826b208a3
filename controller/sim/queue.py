"""The simulated proving queue, shaped like Curio's `harmony_task` table.

Pending = no owner; running = owned by an instance's node. Finished tasks leave the queue;
released ones go back to pending with `retries + 1`. No I/O, no clock.

Indexes (a heap of pending tasks, a heap of finish times, tasks per owner) are rebuilt from the
tasks on load, so the JSON holds only the tasks themselves.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from controller.core.model import Demand


@dataclass
class Task:
    """One proving task."""

    id: int
    name: str
    posted: float
    base_s: float  # service time on a node benchmarked at the reference rate
    owner: str | None = None
    retries: int = 0
    first_claimed_at: float | None = None
    claimed_at: float | None = None  # by its current owner (Curio's work_start)
    done_at: float | None = None  # None while pending or while its node is stalled

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class TaskQueue:
    """Tasks by id, with the oldest pending task and the next finish at hand."""

    def __init__(self, tasks: list[Task] | None = None, next_id: int = 1) -> None:
        self._tasks: dict[int, Task] = {t.id: t for t in tasks or []}
        self._next_id = next_id
        self._pending: list[tuple[float, int]] = []  # heap of (posted, id)
        self._finishing: list[tuple[float, int]] = []  # heap of (done_at, id), may hold stale
        self._owned: dict[str, set[int]] = {}
        for task in self._tasks.values():
            self._index(task)

    def _index(self, task: Task) -> None:
        if task.owner is None:
            heapq.heappush(self._pending, (task.posted, task.id))
            return
        self._owned.setdefault(task.owner, set()).add(task.id)
        if task.done_at is not None:
            heapq.heappush(self._finishing, (task.done_at, task.id))

    def add(self, name: str, posted: float, base_s: float) -> Task:
        """Post a new pending task."""
        task = Task(id=self._next_id, name=name, posted=posted, base_s=base_s)
        self._tasks[task.id] = task
        self._next_id += 1
        self._index(task)
        return task

    def has_pending(self) -> bool:
        return bool(self._pending)

    def owned_count(self, owner: str) -> int:
        """How many tasks `owner`'s node holds."""
        return len(self._owned.get(owner, ()))

    def owned_counts(self) -> Counter[str]:
        """Instance id -> number of tasks its node owns."""
        return Counter({owner: len(ids) for owner, ids in self._owned.items() if ids})

    def claim_oldest(
        self, owner: str, now: float, service_s_of: Callable[[Task], float]
    ) -> Task | None:
        """`owner` takes the oldest pending task at `now`, or None if there is none.

        `service_s_of(task)` gives how long `owner` will take over it.
        """
        if not self._pending:
            return None
        _, task_id = heapq.heappop(self._pending)
        task = self._tasks[task_id]
        task.owner, task.claimed_at = owner, now
        task.done_at = now + service_s_of(task)
        if task.first_claimed_at is None:
            task.first_claimed_at = now
        self._index(task)
        return task

    def complete_due(self, until: float) -> list[Task]:
        """Remove and return the tasks finished by `until`, in the order they finished."""
        done: list[Task] = []
        while self._finishing and self._finishing[0][0] <= until:
            when, task_id = heapq.heappop(self._finishing)
            task = self._tasks.get(task_id)
            if task is None or task.owner is None or task.done_at != when:
                continue  # stale: released, stalled or already done
            del self._tasks[task_id]
            self._owned[task.owner].discard(task_id)
            done.append(task)
        return done

    def release_owned(self, owner: str) -> int:
        """Return `owner`'s tasks to pending with retries + 1; how many went back."""
        ids = sorted(self._owned.pop(owner, set()))
        for task_id in ids:
            task = self._tasks[task_id]
            task.owner, task.done_at, task.claimed_at = None, None, None
            task.retries += 1
            self._index(task)
        return len(ids)

    def stall_owned(self, owner: str) -> None:
        """`owner`'s tasks stop progressing (its node is gone but Curio does not know yet)."""
        for task_id in self._owned.get(owner, ()):
            self._tasks[task_id].done_at = None

    def demand(self, now: float) -> list[Demand]:
        """One Demand per task name with pending or running tasks, then the `all` total."""
        tasks = list(self._tasks.values())
        names = sorted({t.name for t in tasks})
        rows = [_summary(n, [t for t in tasks if t.name == n], now) for n in names]
        rows.append(_summary("all", tasks, now))
        return rows

    def to_json(self) -> dict[str, Any]:
        return {"next_id": self._next_id, "tasks": [t.to_json() for t in self._tasks.values()]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TaskQueue:
        tasks = [Task(**t) for t in data["tasks"]]
        return cls(tasks, next_id=int(data["next_id"]))

    def __len__(self) -> int:
        return len(self._tasks)


def _summary(name: str, tasks: list[Task], now: float) -> Demand:
    pending = [t for t in tasks if t.owner is None]
    oldest = min((t.posted for t in pending), default=now)
    return Demand(
        task=name,
        pending=len(pending),
        running=len(tasks) - len(pending),
        oldest_pending_s=max(0.0, now - oldest),
        max_retries=max((t.retries for t in tasks), default=0),
    )

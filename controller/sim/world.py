"""The simulated world: machines, instances, the proving queue, arrivals and stats.

`step(t)` moves the world to time `t` (one short sub-step), in this order:

1. tasks whose service ended by `t` complete (their queue wait is recorded, and the run kept
   in `completed`, Curio's task history, bounded by `COMPLETED_KEEP` and `COMPLETED_KEEP_S`);
2. each live instance, by id, applies its scheduled events due by `t`, at their own times
   (lifecycle stages, daemon deaths and restarts, reboots, exits, freezes, task releases);
   then each instance whose sidecar is up is seen at `t` (its Curio node's last_contact);
3. tasks arriving by `t` are posted (synthetic process or trace);
4. eligible nodes claim pending tasks, oldest first, up to their free slots.

Operations (launch, destroy, reboot, ...) act at the `now` they are given. No I/O, no clock.
`account` holds what only vast's API shows (foreign instances, API labels, late creates).
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from controller.core.model import Demand
from controller.fleet.base import PermanentProviderError
from controller.sim import account
from controller.sim import instance_life as lifecycle
from controller.sim.account import Account
from controller.sim.arrivals import draw_service_s, draw_task_name, next_synthetic_arrival
from controller.sim.config import SimConfig
from controller.sim.instance import SimInstance
from controller.sim.machines import Machine, choose_machine, generate_machines
from controller.sim.queue import Task, TaskQueue
from controller.sim.stats import Stats
from controller.sim.trace import TraceTask, load_trace

log = logging.getLogger(__name__)

FIRST_INSTANCE_ID = 10001
COMPLETED_KEEP = 2000  # finished runs kept for Curio's task history (saved with the world)
COMPLETED_KEEP_S = 6 * 3600.0  # ...and only this recent


class Completed(NamedTuple):
    """One successful run, as Curio's `harmony_task_history` holds it (times virtual)."""

    task_id: int
    name: str
    posted: float
    work_start: float
    work_end: float
    instance_id: str  # its node's instance (the node's host_and_port is derived from it)
    machine_id: str


class World:
    """Everything that changes in a simulation except the clock and the RNG it is handed."""

    def __init__(self, config: SimConfig, rng: random.Random, state: Mapping[str, Any]) -> None:
        self.config = config
        self._rng = rng
        self.start: float = state["start"]
        self.machines = {m["machine_id"]: Machine.from_json(m) for m in state["machines"]}
        self._instances = {i["id"]: SimInstance.from_json(i) for i in state["instances"]}
        self._by_id: list[SimInstance] | None = None  # live_instances(), until one comes or goes
        self._next_instance_id: int = state["next_instance_id"]
        self.queue = TaskQueue.from_json(state["queue"])
        self._next_arrival_at: float | None = state["next_arrival_at"]
        self._trace_index: int = state["trace_index"]
        self._next_odd_at: float | None = state.get("next_odd_at")
        # operator Curio nodes (1-based, see sim.addresses) marked unschedulable
        self.drained_operators: set[int] = set(state.get("drained_operators", []))
        self.counters = Stats.from_json(state["stats"])
        self.completed: deque[Completed] = deque(
            (Completed(*c) for c in state.get("completed", [])), maxlen=COMPLETED_KEEP
        )
        self.account = Account.from_json(state.get("account"))  # vast-only: foreign, labels
        self._trace: list[TraceTask] = self._load_trace()

    @classmethod
    def create(cls, config: SimConfig, rng: random.Random, start: float) -> World:
        """A new world: machines drawn from `rng`, no instances, an empty queue."""
        salt = account.salt_of(rng)  # the account's hashes: fixed by the seed, no draw
        machines = generate_machines(config, rng)
        held = Account.create(config, [m.machine_id for m in machines], salt, start)
        first_arrival = None
        if config.demand == "synthetic":
            first_arrival = next_synthetic_arrival(start, start, config, rng)
        state = {
            "start": start,
            "machines": [m.to_json() for m in machines],
            "instances": [],
            "next_instance_id": FIRST_INSTANCE_ID,
            "queue": TaskQueue().to_json(),
            "next_arrival_at": first_arrival,
            "trace_index": 0,
            "stats": Stats().to_json(),
            "next_odd_at": _next_odd(start, config, rng),
            "account": held.to_json(),
        }
        return cls(config, rng, state)

    def to_json(self) -> dict[str, Any]:
        """The world's state as plain JSON data (the RNG and config are the caller's)."""
        return {
            "start": self.start,
            "machines": [m.to_json() for m in self.machines.values()],
            "instances": [i.to_json() for i in self._instances.values()],
            "next_instance_id": self._next_instance_id,
            "queue": self.queue.to_json(),
            "next_arrival_at": self._next_arrival_at,
            "trace_index": self._trace_index,
            "stats": self.counters.to_json(),
            "next_odd_at": self._next_odd_at,
            "drained_operators": sorted(self.drained_operators),
            "completed": [list(c) for c in self.completed],
            "account": self.account.to_json(),
        }

    def _load_trace(self) -> list[TraceTask]:
        if self.config.demand != "trace" or self.config.trace_path is None:
            return []
        return load_trace(
            self.config.trace_path,
            time_scale=self.config.trace_time_scale,
            service_scale=self.config.trace_service_scale,
        )

    # --- moving time

    def step(self, t: float) -> None:
        """Move the world to `t` (see the module docstring for the order)."""
        self._complete(t)
        for inst in self.live_instances():
            self._run_events(inst, t)
        self._odd_status(t)
        self._heartbeat(t)
        self._arrive(t)
        self._claim(t)

    def _complete(self, t: float) -> None:
        for task in self.queue.complete_due(t):
            self.counters.tasks_completed += 1
            if task.first_claimed_at is not None:
                self.counters.waits.append(task.first_claimed_at - task.posted)
            inst = self._instances.get(task.owner or "")
            start, end = task.claimed_at, task.done_at
            if inst is not None and start is not None and end is not None:
                self.completed.append(Completed(task.id, task.name, task.posted, start, end,
                                                inst.id, inst.machine_id))  # fmt: skip
        while self.completed and self.completed[0].work_end < t - COMPLETED_KEEP_S:
            self.completed.popleft()

    def _run_events(self, inst: SimInstance, t: float) -> None:
        machine = self.machines[inst.machine_id]
        while (due := inst.next_event()) is not None and due[0] <= t:
            when, kind = due
            effect = lifecycle.apply_event(inst, kind, when, machine, self.config, self._rng)
            self._task_effect(inst.id, effect)

    def _odd_status(self, t: float) -> None:
        """The fleet-wide process: now and then a running instance freezes."""
        while self._next_odd_at is not None and self._next_odd_at <= t:
            when = self._next_odd_at
            running = [i for i in self.live_instances() if i.status == "running"]
            if running:
                victim = self._rng.choice(running)
                self._task_effect(victim.id, lifecycle.lose(victim, "frozen", when, self.config))
            self._next_odd_at = _next_odd(when, self.config, self._rng)

    def _heartbeat(self, t: float) -> None:
        for inst in self._instances.values():
            if inst.sidecar == "up":
                inst.sidecar_seen_at = t

    def _task_effect(self, instance_id: str, effect: lifecycle.Effect) -> None:
        if effect == "release":
            self.counters.tasks_released += self.queue.release_owned(instance_id)
        elif effect == "stall":
            self.queue.stall_owned(instance_id)

    def _arrive(self, t: float) -> None:
        if self.config.demand == "synthetic":
            while self._next_arrival_at is not None and self._next_arrival_at <= t:
                posted = self._next_arrival_at
                self._post(posted, draw_service_s(self.config, self._rng))
                self._next_arrival_at = next_synthetic_arrival(
                    posted, self.start, self.config, self._rng
                )
            return
        while self._trace_index < len(self._trace):
            task = self._trace[self._trace_index]
            if self.start + task.arrival_s > t:
                break
            self._post(self.start + task.arrival_s, task.service_s)
            self._trace_index += 1

    def _post(self, posted: float, base_s: float) -> None:
        self.queue.add(draw_task_name(self.config, self._rng), posted, base_s)
        self.counters.tasks_arrived += 1

    def _claim(self, t: float) -> None:
        if not self.queue.has_pending():
            return
        for inst in self.live_instances():
            if not self._can_claim(inst):
                continue
            for _ in range(self.config.slots_per_instance - self.queue.owned_count(inst.id)):
                if self.queue.claim_oldest(inst.id, t, self._service_time(inst)) is None:
                    return

    def _service_time(self, inst: SimInstance) -> Callable[[Task], float]:
        """How long `inst` takes over a task: base x reference rate / its bench rate."""
        factor = self.config.reference_rate / (inst.bench_rate or self.config.reference_rate)
        return lambda task: task.base_s * factor

    @staticmethod
    def _can_claim(inst: SimInstance) -> bool:
        return (
            inst.status == "running"
            and inst.stage == "running"
            and inst.daemon == "up"
            and inst.sidecar == "up"
            and not inst.drained
            and (inst.bench_rate or 0.0) > 0.0
        )

    # --- operations

    def live_instances(self) -> list[SimInstance]:
        """Instances not destroyed, by numeric id (one list, kept until an instance comes or
        goes: the listing asks for it once per page). Don't change it."""
        if self._by_id is None:
            self._by_id = sorted(self._instances.values(), key=lambda i: int(i.id))
        return self._by_id

    def get(self, instance_id: str) -> SimInstance:
        """The live instance `instance_id`; PermanentProviderError if there is none."""
        inst = self._instances.get(instance_id)
        if inst is None:
            raise PermanentProviderError(f"no instance {instance_id!r}")
        return inst

    def launch(
        self,
        label: str,
        now: float,
        *,
        exclude: frozenset[str] = frozenset(),
        prefer_rates: Mapping[str, float] | None = None,
        max_dph: float | None = None,
    ) -> str:
        """Rent the best rentable machine (see machines.choose_machine); returns the new id."""
        busy = self.busy_machines()
        machine = choose_machine(
            self.machines.values(),
            busy=busy,
            exclude=exclude,
            prefer_rates=prefer_rates or {},
            max_dph=max_dph,
        )
        if machine is None:
            raise PermanentProviderError(
                f"no offer matches label {label!r}: {len(self.machines)} machines, "
                f"{len(busy)} rented, {len(exclude)} excluded, max_dph {max_dph!r}"
            )
        return self._rent(machine, label, now)

    def launch_on(self, machine_id: str, label: str, now: float) -> str:
        """Rent machine `machine_id` (a create on its offer); PermanentProviderError if taken."""
        machine = self.machines.get(machine_id)
        if machine is None or machine_id in self.busy_machines():
            raise PermanentProviderError(f"machine {machine_id!r} is not for rent")
        return self._rent(machine, label, now)

    def busy_machines(self) -> frozenset[str]:
        """Machines rented now: by a live instance or a foreign one."""
        live = frozenset(i.machine_id for i in self._instances.values())
        return live | self.account.busy_machines()

    def _rent(self, machine: Machine, label: str, now: float) -> str:
        instance_id = str(self._next_instance_id)
        self._next_instance_id += 1
        inst = lifecycle.new_instance(instance_id, label, machine, now, self.config, self._rng)
        self._instances[instance_id] = inst
        self._by_id = None
        self.counters.instances_launched += 1
        log.debug(
            "sim: launched %s (%r) on %s at %.0f", instance_id, label, machine.machine_id, now
        )
        return instance_id

    def destroy(self, instance_id: str, now: float) -> None:
        """The instance disappears now: billing stops and its tasks go back to pending."""
        inst = self.get(instance_id)
        self.counters.tasks_released += self.queue.release_owned(instance_id)
        machine = self.machines[inst.machine_id]
        self.counters.close_billing(machine.dph, machine.num_gpus, inst.billed_s(now),
                                    self._storage_usd(inst, now))  # fmt: skip
        self.counters.instances_destroyed += 1
        del self._instances[instance_id]
        self._by_id = None
        self.account.forget(instance_id)
        log.debug("sim: destroyed instance %s at %.0f", instance_id, now)

    def reboot(self, instance_id: str, now: float) -> None:
        """Restart the container (see lifecycle.reboot)."""
        inst = self.get(instance_id)
        self._task_effect(instance_id, lifecycle.reboot(inst, now, self.config))

    def set_state(self, instance_id: str, state: str, now: float) -> None:
        """vast's stop ("stopped") or start ("running") of the container (see account.stop)."""
        inst = self.get(instance_id)
        salt = self.account.salt
        if state == "stopped":
            self._task_effect(instance_id, account.stop(inst, now, self.config, salt))
        else:
            self._task_effect(instance_id, account.start(inst, now, self.config, salt))

    def _storage_usd(self, inst: SimInstance, now: float) -> float:
        """What `inst`'s disk billed while it was stopped."""
        stopped_s = inst.storage_s(now)
        if not stopped_s:
            return 0.0
        per_gb_h = self.machines[inst.machine_id].storage_per_gb_h
        return per_gb_h * self.config.disk_gb * stopped_s / 3600.0

    def restart_daemon(self, instance_id: str, now: float) -> None:
        """Restart the proving daemon (see lifecycle.restart_daemon)."""
        inst = self.get(instance_id)
        self._task_effect(instance_id, lifecycle.restart_daemon(inst, now, self.config))

    def drain(self, instance_id: str) -> None:
        """The instance's node claims no new tasks from now on."""
        self.get(instance_id).drained = True

    def undrain(self, instance_id: str) -> None:
        """The instance's node claims tasks again."""
        self.get(instance_id).drained = False

    def drain_operator(self, node: int, drained: bool = True) -> None:
        """Set operator node `node`'s (1-based) unschedulable flag; it owns no tasks anyway."""
        if not 1 <= node <= self.config.operator_nodes:
            raise PermanentProviderError(
                f"no operator node {node} (operator_nodes is {self.config.operator_nodes})"
            )
        if drained:
            self.drained_operators.add(node)
        else:
            self.drained_operators.discard(node)

    def demand(self, now: float) -> list[Demand]:
        """The queue as the demand sensor reports it."""
        return self.queue.demand(now)

    def stats(self, now: float) -> dict[str, Any]:
        """Totals so far; live instances are billed up to `now`."""
        bills = []
        storage = 0.0
        for inst in self._instances.values():
            machine = self.machines[inst.machine_id]
            bills.append((machine.dph, machine.num_gpus, inst.billed_s(now)))
            storage += self._storage_usd(inst, now)
        summary = self.counters.summary(bills, storage)
        if self.config.foreign_instances:
            summary["foreign_destroyed"] = self.account.foreign_destroyed
        return summary


def _next_odd(t: float, config: SimConfig, rng: random.Random) -> float | None:
    if config.odd_status_per_h <= 0:
        return None
    return t + rng.expovariate(config.odd_status_per_h / 3600.0)

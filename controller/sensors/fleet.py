"""The real fleet as the controller sees it: vast's listing joined with what the instances
reported (lifecycle), whether cuzk answers (health) and what Curio says of their nodes.

`enrich` is pure; `RealFleet` does the I/O around it and is the controller's provider:

- list: vast listing (a failed or implausibly empty one raises: never "zero instances"),
  lifecycle records, daemon health for instances past registration, Curio machines;
- restart_daemon: a command queued for the instance's agent (pulled on its next heartbeat);
  one not picked up in time becomes a vast reboot (`overdue`);
- drain: Curio's `unschedulable` on the instance's node;
- launch, destroy, reboot, find_by_label: vast.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from controller.model import Instance, Proposal
from controller.providers.base import LaunchRequest, PermanentProviderError, SensorError

log = logging.getLogger(__name__)

BOOTING = frozenset({"provisioning", "created", "loading"})
# The agent reports milestones reached; the controller's stage is what the instance is doing:
# registered → fetching parameters; parameters done → benchmarking; benchmark done → still
# in the benchmark stage until it reports running (its 45-minute limit covers both).
DOING = {"registered": "params", "params": "bench", "bench": "bench", "running": "running"}


class Record(Protocol):
    """What an instance's agent reported (controller.lifecycle)."""

    @property
    def label(self) -> str: ...

    @property
    def stage(self) -> str: ...

    @property
    def bench_rate(self) -> float | None: ...

    @property
    def host_and_port(self) -> str | None: ...


class Health(Protocol):
    @property
    def up(self) -> bool: ...

    @property
    def uptime_s(self) -> float | None: ...


class Machine(Protocol):
    @property
    def host_and_port(self) -> str: ...

    @property
    def last_contact_age_s(self) -> float: ...

    @property
    def unschedulable(self) -> bool: ...

    @property
    def running_tasks(self) -> int: ...

    @property
    def stale(self) -> bool: ...


@dataclass(frozen=True)
class Probe:
    """A health answer as the controller reports it (possibly the last known one)."""

    up: bool
    uptime_s: float | None


def persisted(health: Mapping[str, Health], failures: dict[str, list[float]], now: float,
              count: int, after_s: float) -> dict[str, Probe]:  # fmt: skip
    """Down only after `count` failed probes in a row spanning `after_s`; until then up.

    `failures` maps an instance to [first failure time, failures in a row] and is updated.
    """
    out: dict[str, Probe] = {}
    for iid, h in health.items():
        if h.up:
            failures.pop(iid, None)
            out[iid] = Probe(True, h.uptime_s)
            continue
        first, n = failures.get(iid, [now, 0])
        failures[iid] = [first, n + 1]
        out[iid] = Probe(not (n + 1 >= count and now - first >= after_s), None)
    for iid in set(failures) - set(health):
        del failures[iid]  # no longer checked (gone, or not past registration)
    return out


def stage_of(inst: Instance, record: Record | None) -> str:
    """vast says whether the container runs; the agent says how far it got."""
    if inst.status in BOOTING:
        return "loading" if inst.status == "loading" else "provisioning"
    if record is not None and record.stage in DOING:
        return DOING[record.stage]
    return "loading"  # running container, agent not registered yet: unregistered


def enrich(
    listed: Sequence[Instance], records: Mapping[str, Record], health: Mapping[str, Health],
    machines: Sequence[Machine], sidecar_stale_s: float,
) -> list[Instance]:  # fmt: skip
    """One Instance per listed instance, with stage, daemon, sidecar, tasks and drain state."""
    by_node = {m.host_and_port: m for m in machines}
    out = []
    for inst in listed:
        record = records.get(inst.label) or records.get(f"C.{inst.id}") or records.get(inst.id)
        node = by_node.get(record.host_and_port or "") if record else None
        check = health.get(inst.id)
        alive = node is not None and not node.stale and node.last_contact_age_s < sidecar_stale_s
        out.append(replace(
            inst,
            stage=stage_of(inst, record),
            daemon="up" if check and check.up else ("down" if check else "unknown"),
            daemon_uptime_s=check.uptime_s if check and check.up else None,
            sidecar="up" if alive else "down",
            tasks_running=node.running_tasks if node else 0,
            drained=bool(node and node.unschedulable),
            bench_rate=record.bench_rate if record else None,
        ))  # fmt: skip
    return out


class RealFleet:
    """The controller's provider for a vast fleet with Curio nodes and fleetgate agents."""

    def __init__(
        self,
        *,
        vast: Any,
        lifecycle: Any,
        curio: Any,
        check_health: Callable[[Sequence[Instance]], Mapping[str, Health]],
        clock: Callable[[], float],
        sidecar_stale_s: float = 180.0,
        command_deadline_s: float = 300.0,
        failures_to_down: int = 2,
        down_after_s: float = 60.0,
        failures: dict[str, list[float]] | None = None,
    ) -> None:
        self.vast = vast
        self.lifecycle = lifecycle
        self.curio = curio
        self.check_health = check_health
        self.clock = clock
        self.sidecar_stale_s = sidecar_stale_s
        self.command_deadline_s = command_deadline_s
        self.failures_to_down = failures_to_down
        self.down_after_s = down_after_s
        self.failures = {} if failures is None else failures  # kept by the caller across runs
        self._last: dict[str, Instance] = {}

    def list_instances(self) -> list[Instance]:
        listed = self.vast.list_instances()  # it knows when an empty listing is implausible
        records = self.lifecycle.records()
        try:
            machines = self.curio.machines()
        except SensorError as exc:
            raise SensorError(f"Curio nodes unknown: {exc}") from exc
        past_registration = [i for i in listed if stage_of(i, records.get(i.label)) in
                             ("bench", "running")]  # fmt: skip
        health = persisted(self.check_health(past_registration), self.failures, self.clock(),
                           self.failures_to_down, self.down_after_s)  # fmt: skip
        fleet = enrich(listed, records, health, machines, self.sidecar_stale_s)
        self._last = {i.id: i for i in fleet}
        return fleet

    def launch(self, request: LaunchRequest) -> str:
        return str(self.vast.launch(request))

    def find_by_label(self, label: str) -> Instance | None:
        found: Instance | None = self.vast.find_by_label(label)
        return found

    def destroy(self, instance_id: str) -> None:
        self.vast.destroy(instance_id)

    def reboot(self, instance_id: str) -> None:
        self.vast.reboot(instance_id)

    def restart_daemon(self, instance_id: str) -> None:
        """Queue it for the agent; without a registered agent, reboot through vast at once."""
        record = self.lifecycle.resolve(instance_id)
        if record is None:
            log.warning("instance %s has no registered agent: rebooting it instead", instance_id)
            self.vast.reboot(instance_id)
            return
        self.lifecycle.queue_command(record.label, "restart_daemon", self.clock(),
                                     self.command_deadline_s)  # fmt: skip

    def drain(self, instance_id: str) -> None:
        record = self.lifecycle.resolve(instance_id)
        if record is None or not record.host_and_port:
            raise PermanentProviderError(f"instance {instance_id!r} has no known Curio node")
        try:
            self.curio.drain(record.host_and_port)
        except SensorError as exc:  # not allowed by the config, or Curio unreachable
            raise PermanentProviderError(f"cannot drain instance {instance_id!r}: {exc}") from exc

    def gone(self, instance_id: str) -> None:
        """The controller saw this instance vanish from vast: drop what its agent reported."""
        record = self.lifecycle.resolve(instance_id)
        if record is not None:
            self.lifecycle.forget(record.label)

    def overdue(self, now: float) -> list[Proposal]:
        """Restart commands the agent did not pick up in time: reboot through vast instead."""
        out = []
        for cmd in self.lifecycle.overdue_commands(now):
            record = self.lifecycle.resolve(cmd.label)
            target = getattr(record, "vast_id", None) if record else None
            self.lifecycle.complete(cmd.id, {"ok": False, "detail": "not picked up in time"}, now)
            if target:
                out.append(Proposal("reboot", {"instance": str(target)}, "controller:agent",
                                    f"its agent did not pick up {cmd.command} within "
                                    f"{self.command_deadline_s:.0f}s", 1.0, 50))  # fmt: skip
        return out

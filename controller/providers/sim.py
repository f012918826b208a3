"""The simulator as a fleet provider and demand sensor.

`SimProvider` implements `base.Provider` and `base.DemandSensor` on top of a
`controller.sim.Simulation`; every call acts at the simulation's virtual `now()`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from controller.model import Demand, Health, Instance
from controller.providers.base import LaunchRequest

if TYPE_CHECKING:
    from controller.sim import Simulation
    from controller.sim.instance import SimInstance
    from controller.sim.machines import Machine

log = logging.getLogger(__name__)

_HEALTH: dict[str, Health] = {"up": "up", "down": "down", "unknown": "unknown"}


class SimProvider:
    """Provider and DemandSensor backed by a Simulation."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim

    def list_instances(self) -> list[Instance]:
        """Live (not destroyed) instances, by id."""
        world, now = self._sim.world, self._sim.now()
        owned = world.queue.owned_counts()
        return [
            _to_instance(inst, world.machines[inst.machine_id], owned[inst.id], now)
            for inst in world.live_instances()
        ]

    def launch(self, request: LaunchRequest) -> str:
        """Rent one machine for `request.label`; PermanentProviderError when no offer matches."""
        return self._sim.world.launch(
            request.label,
            self._sim.now(),
            exclude=request.exclude_machines,
            prefer_rates=dict(request.prefer_rates),
            max_dph=request.max_dph,
        )

    def find_by_label(self, label: str) -> Instance | None:
        """The live instance labelled `label` (the lowest id if several), or None."""
        for inst in self.list_instances():
            if inst.label == label:
                return inst
        return None

    def destroy(self, instance_id: str) -> None:
        self._sim.world.destroy(instance_id, self._sim.now())

    def reboot(self, instance_id: str) -> None:
        self._sim.world.reboot(instance_id, self._sim.now())

    def restart_daemon(self, instance_id: str) -> None:
        self._sim.world.restart_daemon(instance_id, self._sim.now())

    def drain(self, instance_id: str) -> None:
        """Mark the instance's node unschedulable: it claims no new tasks."""
        self._sim.world.drain(instance_id)

    def demand(self) -> list[Demand]:
        """Pending/running per task name with tasks, plus the `all` total."""
        return self._sim.world.demand(self._sim.now())


def _to_instance(inst: SimInstance, machine: Machine, tasks: int, now: float) -> Instance:
    return Instance(
        id=inst.id,
        label=inst.label,
        machine_id=machine.machine_id,
        host_id=machine.host_id,
        status=inst.status,
        stage=inst.stage,
        daemon=_HEALTH[inst.daemon],
        sidecar=_HEALTH[inst.sidecar],
        gpu_name=machine.gpu_name,
        num_gpus=machine.num_gpus,
        dph=machine.dph,
        tasks_running=tasks,
        drained=inst.drained,
        bench_rate=inst.bench_rate,
        daemon_uptime_s=inst.uptime(now),
        status_msg=inst.status_msg,
        start_date=inst.launched_at,
    )

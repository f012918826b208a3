"""Test helpers for the simulator: the world seen directly, and the fleet path on its wire.

`WorldView` reads and drives a `Simulation`'s world as plain `Instance`s: for tests of the
world itself (lifecycle, faults, the queue), never of the controller. `sim_fleet` builds the
production fleet path (vast client, Curio sensor, probes, agent records) on the simulator's
wire, as `fleetgate run` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controller.core.model import Demand, Health, Instance
from controller.fleet.base import LaunchRequest
from controller.fleet.instance_api import InstanceService
from controller.sim import Simulation
from controller.sim.agents import AgentSettings
from controller.sim.wire import SimWire
from controller.store.journal import Journal

_HEALTH: dict[str, Health] = {"up": "up", "down": "down", "unknown": "unknown"}


class WorldView:
    """The simulated world's own state, for tests of the simulator."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim

    def list_instances(self) -> list[Instance]:
        world, now = self._sim.world, self._sim.now()
        owned = world.queue.owned_counts()
        out = []
        for inst in world.live_instances():
            m = world.machines[inst.machine_id]
            out.append(Instance(
                id=inst.id, label=inst.label, machine_id=m.machine_id, host_id=m.host_id,
                status=inst.status, stage=inst.stage, daemon=_HEALTH[inst.daemon],
                sidecar=_HEALTH[inst.sidecar], gpu_name=m.gpu_name, num_gpus=m.num_gpus,
                dph=m.dph, tasks_running=owned[inst.id], drained=inst.drained,
                bench_rate=inst.bench_rate, daemon_uptime_s=inst.uptime(now),
                status_msg=inst.status_msg, start_date=inst.launched_at,
            ))  # fmt: skip
        return out

    def launch(self, request: LaunchRequest) -> str:
        return self._sim.world.launch(request.label, self._sim.now(),
                                      exclude=request.exclude_machines,
                                      prefer_rates=dict(request.prefer_rates),
                                      max_dph=request.max_dph)  # fmt: skip

    def find_by_label(self, label: str) -> Instance | None:
        return next((i for i in self.list_instances() if i.label == label), None)

    def destroy(self, instance_id: str) -> None:
        self._sim.world.destroy(instance_id, self._sim.now())

    def reboot(self, instance_id: str) -> None:
        self._sim.world.reboot(instance_id, self._sim.now())

    def restart_daemon(self, instance_id: str) -> None:
        self._sim.world.restart_daemon(instance_id, self._sim.now())

    def drain(self, instance_id: str) -> None:
        self._sim.world.drain(instance_id)

    def undrain(self, instance_id: str) -> None:
        self._sim.world.undrain(instance_id)

    def demand(self) -> list[Demand]:
        return self._sim.world.demand(self._sim.now())


def sim_fleet(sim: Simulation, journal: Journal, agents: dict[str, Any] | None = None
              ) -> tuple[Any, Any, SimWire]:  # fmt: skip
    """(fleet provider, demand sensor, wire): the production fleet path on `sim`'s wire."""
    from controller.service.fleet_path import real_fleet, sim_settings

    wire = SimWire(sim, AgentSettings.model_validate(agents or {}))
    fleet, curio, store, actions = real_fleet(sim_settings(), journal, sim.now, wire.seams)
    wire.attach(InstanceService(store, sim.now))
    provider = ReadAndAct(fleet, actions, journal, sim.now)
    provider.own([(i.id, i.label) for i in sim.world.live_instances()])  # booted by the test
    return provider, curio, wire


class ReadAndAct:
    """The fleet path's sensor and its actions as one provider (what a test drives by hand).
    What it launches, and what the test put in the world, is the journal's: only a journal's
    launches are a fleet's own."""

    def __init__(self, sensor: Any, actions: Any, journal: Journal,
                 now: Callable[[], float]) -> None:  # fmt: skip
        self.sensor, self.actions, self.journal, self.now = sensor, actions, journal, now

    def own(self, rented: list[tuple[str, str]]) -> None:
        """Record these as the journal's launches, unless one is already (the actuator's own
        launch rows), before the launch budgets' windows: a test's set-up spends none."""
        query = self.journal.store.query
        new = [(iid, label) for iid, label in rented
               if not query("SELECT 1 FROM actions WHERE key = ?", (label,))]  # fmt: skip
        if new:
            self.journal.actions.import_launches(new, self.now() - 2 * 86_400.0, "test")

    def launch(self, request: Any) -> str:
        iid: str = self.actions.launch(request)
        self.own([(iid, request.label)])
        return iid

    def list_instances(self) -> list[Instance]:
        found: list[Instance] = self.sensor.list_instances()
        self.sensor.save_learned()
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.actions, name)

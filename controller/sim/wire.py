"""The simulated world behind the production fleet path: what replaces the wire, and only that.

`provider: sim` runs the same code as a real fleet (`controller.service.fleet_path.real_fleet`:
the vast client and provider, the Curio sensor, the health probes, the agent records and
linking), with four seams answered by the simulator instead of the world outside:

    seam                              real                          simulated
    vast's HTTP API                   requests to console.vast.ai   SimVastAPI (a transport)
    Curio's database                  psycopg.connect(dsn)          SimCurio.connect (rows)
    cuzk's status server              health.check_many (HTTP)      SimProbes.check_many
    the agents calling the instance   fleetgate-agent over HTTP     SimAgents -> InstanceService
    API

Nothing above these seams knows it is simulated. `SimWire.before_tick(step)` moves the world
(the agents act after every sub-step, at its virtual time); `state()` is what to save so that
the next `fleetgate tick` continues the same world.

Must not: decide anything for the controller, or be imported by code above the wire other than
the composition root.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import requests
from pydantic import SecretStr

from controller.fleet.instance_api import InstanceService
from controller.sim.agents import AgentSettings, SimAgents
from controller.sim.curio_rows import SimCurio
from controller.sim.probes import SimProbes
from controller.sim.simulation import Simulation
from controller.sim.vast_api import SimVastAPI

VAST_URL = "https://console.vast.ai"
API_KEY = "sim-vast-key"  # what the simulated vast accepts; not a secret of anybody's
CURIO_DSN = "host=curio.sim dbname=yugabyte user=yugabyte"
IMAGE = "fleetgate/sim-cuzk-curio:latest"


@dataclass
class Seams:
    """What the fleet path is built on: production's is built by the composition root
    (`controller.service.assemble`, with its injected clock and sleep), `SimWire.seams` is the
    simulator's."""

    session: requests.Session
    curio_connect: Any
    check_many: Any
    clock: Any  # for the vast client's pacing
    sleep: Any
    counts: dict[str, Any] = field(default_factory=dict)


class SimWire:
    """The four simulated seams over one `Simulation`."""

    def __init__(self, sim: Simulation, agent_settings: AgentSettings,
                 agent_state: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.sim = sim
        self.vast = SimVastAPI(sim, API_KEY)
        self.curio = SimCurio(sim.world, sim.now)
        self.probes = SimProbes(sim.world, sim.now)
        self.agent_settings = agent_settings
        self.agent_state = agent_state
        self.agents: SimAgents | None = None
        session = requests.Session()
        self.vast.mount(session, VAST_URL)
        self.seams = Seams(session, self.curio.connect, self.probes.check_many, sim.now,
                           lambda _s: None)  # fmt: skip

    def attach(self, service: InstanceService) -> None:
        """The instance API the agents call (built with the controller's lifecycle store)."""
        self.agents = SimAgents(self.sim.world, service, self.agent_settings, self.sim.seed,
                                self.agent_state)  # fmt: skip

    def before_tick(self, seconds: float) -> None:
        """Move the world `seconds` on; the agents act after each sub-step."""
        agents = self.agents
        self.sim.advance(seconds, on_step=agents.step if agents is not None else None)

    def state(self) -> dict[str, Any]:
        return {"agents": self.agents.to_json() if self.agents is not None else {}}

    @property
    def vast_key(self) -> SecretStr:
        return SecretStr(API_KEY)

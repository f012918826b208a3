"""The fleetgate agent on each simulated instance, calling the instance API as the real one does.

The real agent (`controller/fleet/agent/fleetgate_agent.py`) runs in the container's boot script:
`register` once the container runs, `stage params-done | bench-done --rate R | running` as the
boot goes on, and a heartbeat loop that reports the daemon's state and runs the commands the
controller queued. `SimAgents.step(now)` does the same for every simulated instance whose
container runs, with the same bodies, through `InstanceService` (the instance API minus its
HTTP hop). Like real agents, some are configured differently:

- an agent set up as the README says knows its launch label (`FLEETGATE_LABEL`), its own
  token (`FLEETGATE_INSTANCE_TOKEN`: both from the create's env, `World.account.env`) and, when
  vast set `VAST_CONTAINERLABEL`, its vast id; `vast_id_fraction` of them send it;
- `host_and_port_fraction` were started with `--host-and-port` (the others leave it to the
  controller to find their Curio node);
- `late_register_fraction` register minutes late, `never_register_fraction` never do.

Each instance's kind of agent is drawn from a private RNG seeded by the seed and the instance
id, so it neither changes nor depends on the world's random draws.

Every call carries the instance's own token, as the real agent's bearer token; an instance
whose environment holds none gets 401s, as a real one would.

Must not: read or write the controller's journal except through `InstanceService`, decide
anything for the controller, read the wall clock.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from controller.fleet.instance_api import (
    BenchDone,
    CommandDone,
    Heartbeat,
    InstanceAPIError,
    InstanceService,
    Registration,
)
from controller.sim import addresses
from controller.store.instance_tokens import TOKEN_ENV

if TYPE_CHECKING:
    from controller.sim.instance import SimInstance
    from controller.sim.world import World

log = logging.getLogger(__name__)

VERSION = "sim-agent"
# the sim's stages after which the real agent has made each report, in order
_REPORTS = (("registered", "register"), ("bench", "params-done"), ("running", "bench-done"),
            ("running", "running"))  # fmt: skip
_ORDER = ("provisioning", "loading", "registered", "params", "bench", "running")


class AgentSettings(BaseModel):
    """How the simulated instances' agents are set up and behave."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True)

    heartbeat_s: float = Field(60.0, gt=0, description="Seconds between two heartbeats.")
    vast_id_fraction: float = Field(
        0.5, ge=0, le=1, description="Share of agents that send their vast id when registering."
    )
    host_and_port_fraction: float = Field(
        0.0, ge=0, le=1, description="Share started with --host-and-port (their Curio node)."
    )
    late_register_fraction: float = Field(
        0.0, ge=0, le=1, description="Share of agents that register late."
    )
    late_register_s: tuple[float, float] = Field(
        (300.0, 1200.0), description="How late a late agent registers, seconds (range)."
    )
    never_register_fraction: float = Field(
        0.0, ge=0, le=1, description="Share of agents that never register (a broken image)."
    )


@dataclass
class AgentState:
    """What one instance's agent has done so far."""

    kind: str  # "normal", "late" or "never"
    delay_s: float
    vast_id: bool
    host_and_port: bool
    seen_at: float | None = None  # first step its container ran past the boot
    reported: int = 0  # how many of _REPORTS it has made
    heartbeat_at: float | None = None


class SimAgents:
    """Every simulated instance's agent; `step(now)` after the world moved to `now`."""

    def __init__(self, world: World, service: InstanceService, settings: AgentSettings,
                 seed: int, state: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.world = world
        self.service = service
        self.settings = settings
        self.seed = seed
        self.agents = {k: AgentState(**v) for k, v in (state or {}).items()}

    def to_json(self) -> dict[str, Any]:
        return {k: asdict(v) for k, v in self.agents.items()}

    def step(self, now: float) -> None:
        live = self.world.live_instances()
        for inst in live:
            if inst.status == "running":
                self._act(inst, self._agent(inst), now)
        if len(self.agents) > len(live):
            ids = {i.id for i in live}
            self.agents = {k: v for k, v in self.agents.items() if k in ids}

    def _agent(self, inst: SimInstance) -> AgentState:
        agent = self.agents.get(inst.id)
        if agent is None:
            agent = self.agents[inst.id] = self._draw(inst.id)
        return agent

    def _draw(self, instance_id: str) -> AgentState:
        s, rng = self.settings, random.Random(f"{self.seed}:{instance_id}:agent")
        roll = rng.random()
        kind = (
            "never"
            if roll < s.never_register_fraction
            else (
                "late" if roll < s.never_register_fraction + s.late_register_fraction else "normal"
            )
        )
        delay = rng.uniform(*s.late_register_s) if kind == "late" else 0.0
        return AgentState(kind, delay, rng.random() < s.vast_id_fraction,
                          rng.random() < s.host_and_port_fraction)  # fmt: skip

    def _act(self, inst: SimInstance, agent: AgentState, now: float) -> None:
        if agent.kind == "never" or _ORDER.index(inst.stage) < _ORDER.index("registered"):
            return
        if agent.seen_at is None:
            agent.seen_at = now
        if now < agent.seen_at + agent.delay_s:
            return
        self._report(inst, agent)
        if agent.reported and (
            agent.heartbeat_at is None or now - agent.heartbeat_at >= self.settings.heartbeat_s
        ):
            agent.heartbeat_at = now
            self._heartbeat(inst, now)  # fmt: skip

    def _report(self, inst: SimInstance, agent: AgentState) -> None:
        """Every report the boot has reached and the agent has not made yet, in order."""
        reached = _ORDER.index(inst.stage)
        while agent.reported < len(_REPORTS):
            stage, call = _REPORTS[agent.reported]
            if reached < _ORDER.index(stage):
                return
            if self._call(inst, partial(self._send, inst, agent, call)) is None:
                return
            agent.reported += 1

    def _token(self, inst: SimInstance) -> str:
        """The token in the instance's environment (its create's env), as the agent reads it."""
        return self.world.account.env.get(inst.id, {}).get(TOKEN_ENV, "")

    def _send(self, inst: SimInstance, agent: AgentState, call: str) -> dict[str, Any]:
        token = self._token(inst)
        if call == "register":
            body = {"label": inst.label, "min_rate": None, "agent_version": VERSION,
                    "vast_id": inst.id if agent.vast_id else None,
                    "host_and_port": addresses.curio_node(inst.id, inst.machine_id)
                    if agent.host_and_port else None}  # fmt: skip
            return self.service.register(token, Registration.model_validate(body))
        if call == "bench-done":
            rate = BenchDone.model_validate({"rate": inst.bench_rate or 0.0}).rate
            return self.service.advance(token, inst.label, "bench", rate)
        stage = "params" if call == "params-done" else call
        return self.service.advance(token, inst.label, stage)

    def _heartbeat(self, inst: SimInstance, now: float) -> None:
        up = inst.daemon == "up"
        body = Heartbeat.model_validate(
            {
                "daemon_uptime_s": inst.uptime(now) if up else None,
                "daemon_state": "RUNNING" if up else "FATAL",
            }
        )
        token = self._token(inst)
        reply = self._call(inst, lambda: self.service.heartbeat(token, inst.label, body))
        for command in (reply or {}).get("commands", []):
            self._execute(inst, int(command["id"]), str(command["command"]), now)

    def _execute(self, inst: SimInstance, command_id: int, command: str, now: float) -> None:
        if command == "restart_daemon":
            self.world.restart_daemon(inst.id, now)
            result = {"ok": True, "detail": "supervisorctl restart cuzk: started"}
        else:
            result = {"ok": False, "detail": f"unknown command {command!r}"}
        done = CommandDone.model_validate(result)
        token = self._token(inst)
        self._call(inst, lambda: self.service.command_done(token, inst.label, command_id, done))

    @staticmethod
    def _call(inst: SimInstance, do: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        """One call; a refusal is logged and the agent goes on, as the real one does."""
        try:
            return do()
        except InstanceAPIError as exc:
            if exc.status == 409:  # a later stage is already recorded: not an error
                return {}
            log.debug("sim agent on %s: HTTP %d %s", inst.id, exc.status, exc)
            return None

"""The controller's data: frozen dataclasses passed between sense, decide and act.

No I/O here, no clock: every timestamp is a float of epoch seconds handed in by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# Lifecycle stages an instance moves through (DOMAIN.md, the replaced manager's stages).
STAGES = ("provisioning", "loading", "registered", "params", "bench", "running")

Health = Literal["up", "down", "unknown"]


@dataclass(frozen=True)
class Instance:
    """One rented machine as sensed this tick (provider listing joined with health)."""

    id: str
    label: str
    machine_id: str
    host_id: str
    status: str  # vast actual_status, "provisioning" when the API says null
    stage: str  # one of STAGES
    daemon: Health  # cuzk answers /status
    sidecar: Health  # Curio node heartbeats
    gpu_name: str = ""
    num_gpus: int = 1
    dph: float = 0.0  # $/hour
    tasks_running: int = 0  # Curio tasks this instance's node owns
    drained: bool = False  # Curio unschedulable
    bench_rate: float | None = None  # measured proofs/hour, once benchmarked
    daemon_uptime_s: float | None = None  # from cuzk /status
    # when the daemon started: its answer's time less its uptime, on the clock that probed it;
    # one that moved on between two answers restarted (uptime alone hides a restart whose
    # uptime passed the last answer's)
    daemon_started_at: float | None = None
    status_msg: str = ""
    start_date: float | None = None
    intended_status: str = ""  # vast's: "running" on a stopped one whose start waits
    command_overdue_s: float = 0.0
    """How long past its deadline a command queued for the instance's agent (a daemon restart)
    has waited with no heartbeat picking it up; 0 when none has."""


@dataclass(frozen=True)
class Demand:
    """Proving queue for one task name, or `task="all"` for the total."""

    task: str
    pending: int
    running: int
    oldest_pending_s: float = 0.0
    max_retries: int = 0


@dataclass(frozen=True)
class SensorStatus:
    name: str  # "provider", "demand", "health"
    state: Literal["ok", "stale", "failed"]
    detail: str = ""


@dataclass(frozen=True)
class Observation:
    """Everything sensed in one tick. A failed sensor is reported, never replaced by empties."""

    now: float
    instances: tuple[Instance, ...]
    demand: tuple[Demand, ...]
    sensors: tuple[SensorStatus, ...]
    foreign: tuple[Instance, ...] = ()
    """Instances on the account that fleetgate did not launch: shown, never managed."""
    confirmed_gone: tuple[str, ...] = ()
    """Tracked instances missing from the listing that the provider confirmed gone."""
    unconfirmed: tuple[str, ...] = ()
    """Tracked instances missing from the listing that the provider did not confirm gone
    (still there, or unknown): their tracks and records are kept, nothing acts on them."""

    def sensor_ok(self, name: str) -> bool:
        return all(s.state == "ok" for s in self.sensors if s.name == name)


@dataclass(frozen=True)
class Proposal:
    """An action somebody (a rule, the LLM, a human, the controller) wants taken."""

    action: str  # a name from controller.core.actions.ACTIONS
    params: dict[str, Any]
    proposer: str  # "rule:<name>", "llm:<model>", "human:<who>", "controller:<what>"
    reason: str
    confidence: float = 1.0
    priority: int = 0
    facts: tuple[str, ...] = ()  # ids of the facts that matched
    escalation_id: int | None = None  # set when the proposal answers an escalation
    overrides: tuple[str, ...] = ()  # budget caps a person explicitly allowed it to exceed

    @property
    def target(self) -> str:
        """What the action acts on: conflicts and cooldowns are per target."""
        for key in ("instance", "machine"):
            if key in self.params:
                return f"{key}:{self.params[key]}"
        return "fleet"


Verdict = Literal["act", "ask", "observe", "veto", "superseded", "noop"]


@dataclass(frozen=True)
class Decision:
    """A proposal and what the gate made of it, with the reason in words."""

    proposal: Proposal
    verdict: Verdict
    why: str
    guard: str = ""  # the guard that vetoed or trimmed it
    params: dict[str, Any] = field(default_factory=dict)  # params after guards (e.g. trimmed count)
    action: str = ""  # the action after guards, when a guard changed it (destroy -> drain)

    @property
    def effective_action(self) -> str:
        return self.action or self.proposal.action

    @property
    def effective_params(self) -> dict[str, Any]:
        return self.params or self.proposal.params


@dataclass(frozen=True)
class Plan:
    decisions: tuple[Decision, ...]

    @property
    def to_act(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.verdict == "act")

    @property
    def to_ask(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.verdict == "ask")

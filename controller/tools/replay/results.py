"""What the baselines are given and what every policy's run produces.

Pure: dataclasses and arithmetic, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.sim.config import SimConfig
from controller.sim.stats import wait_summary

BOOT_STAGES = ("boot_s", "pull_s", "register_s", "params_s", "bench_s")
# per running instance-hour, what loses the tasks it holds: a silent daemon death, a container
# that exits, a host gone offline, a freeze (a fleet-wide odd status is not per instance)
TASK_HAZARDS = ("daemon_death_per_h", "exit_per_h", "offline_per_h", "frozen_per_h")
LABELS = {
    "proportional_sim": "proportional, sim",
    "oracle_warm": "oracle, stop/start",
    "oracle_market": "oracle, market",
    "oracle_placed": "oracle, no moves",
}  # how a policy is named where people read it


def label(name: str) -> str:
    """A policy's name in tables and charts."""
    return LABELS.get(name, name)


@dataclass(frozen=True)
class BaselineParams:
    """The same fleet for every baseline, taken from the simulator config of the fleetgate run."""

    boot_s: float
    """Seconds from renting an instance until it can take its first task."""
    dph: float
    """Dollars per instance-hour."""
    slots: int
    """Tasks one instance runs at once."""
    horizon_s: float
    """Costs and waits are counted over [0, horizon_s]; a task still waiting then is censored."""
    deadline_s: float
    """A task that waits longer than this before it starts misses its deadline."""
    tasks_per_instance: int = 2
    """The proportional scaler's target: tasks in the system per instance."""
    interval_s: float = 60.0
    """How often the proportional scaler reads the queue and scales."""
    cooldown_s: float = 300.0
    """Proportional scale-down window: it shrinks only to the highest target seen in it."""
    max_instances: int | None = None
    """The fleet cap of the static and proportional baselines (None: none)."""
    gpus_per_instance: int = 1
    """GPUs per instance, for GPU-hours."""
    sample_s: float = 600.0
    """Spacing of the time series kept for the chart."""
    start_s: float | None = None
    """Seconds a stopped instance takes to serve again once started (None: no stop/start)."""
    storage_dph: float = 0.0
    """Dollars per hour a stopped instance bills (its disk)."""
    tick_s: float | None = None
    """The oracles change the fleet only every `tick_s` seconds, as a controller that acts
    once a tick does (None: at any moment)."""


@dataclass(frozen=True)
class Sample:
    """The state of one policy's fleet and queue at time `t` (seconds from the trace start)."""

    t: float
    queued: int
    running: int
    booting: int
    serving: int
    other: int
    spend_usd: float


@dataclass(frozen=True)
class Outcome:
    """One policy's run over the horizon."""

    name: str
    instance_s: float
    """Billed instance-seconds (boot included)."""
    dph: float
    gpus_per_instance: int
    waits: tuple[float, ...]
    """Per task that arrived before the horizon: start - arrival, or horizon - arrival if it
    never started (censored)."""
    censored: int
    """Tasks still waiting at the horizon."""
    instances_started: int
    peak_instances: int
    series: tuple[Sample, ...] = ()
    spend_usd: float | None = None
    """The bill when instances had different prices (fleetgate); None: instance_s x dph."""
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def cost_usd(self) -> float:
        if self.spend_usd is not None:
            return self.spend_usd
        return self.instance_s / 3600.0 * self.dph

    @property
    def gpu_hours(self) -> float:
        return self.instance_s / 3600.0 * self.gpus_per_instance

    def figures(self, deadline_s: float) -> dict[str, Any]:
        """Cost, GPU-hours, wait percentiles and deadline misses, rounded for reading."""
        waits = wait_summary(list(self.waits))
        return {
            "cost_usd": round(self.cost_usd, 2),
            "gpu_hours": round(self.gpu_hours, 2),
            "instance_hours": round(self.instance_s / 3600.0, 2),
            "waits_s": {k: round(v, 1) if isinstance(v, float) else v for k, v in waits.items()},
            "deadline_misses": deadline_misses(self.waits, deadline_s),
            "tasks_waiting_at_end": self.censored,
            "instances_started": self.instances_started,
            "peak_instances": self.peak_instances,
            **self.notes,
        }


def deadline_misses(waits: tuple[float, ...] | list[float], deadline_s: float) -> int:
    """How many waits are longer than the deadline."""
    return sum(1 for w in waits if w > deadline_s)


def mean_boot_s(world: SimConfig) -> float:
    """Mean seconds from renting a simulated instance to its first task: the stages' midpoints."""
    return sum(float(sum(getattr(world, name))) / 2.0 for name in BOOT_STAGES)


def task_hazard_per_h(world: SimConfig) -> float:
    """The chance an hour that a running task is lost with its instance (`TASK_HAZARDS`)."""
    return float(sum(getattr(world, name) for name in TASK_HAZARDS))


def fault_rework(service_s: Sequence[float], hazard_per_h: float) -> float:
    """The share of task time the faults add in expectation: a task lost at `hazard_per_h` (a
    constant hazard while it runs) is run again from its start, so a task of s seconds takes
    (e^(ls) - 1) / l in all (l the hazard a second), whatever runs it. The oracles meet no
    fault; no policy avoids these. 0.0 without tasks or hazard; inf when a task is so long that
    its expectation is past any float (at 0.095/h, from about 311 days)."""
    total = sum(service_s)
    rate = hazard_per_h / 3600.0
    if total <= 0 or rate <= 0:
        return 0.0
    try:
        taken = sum(math.expm1(rate * s) / rate for s in service_s)
    except OverflowError:
        return math.inf
    return taken / total - 1.0

"""The simulator's settings: one strict, frozen pydantic model.

Times are virtual seconds, hazards are events per hour of virtual time, `(low, high)` pairs are
uniform ranges drawn from the simulation's seeded RNG.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

TASK_NAMES = ("PoRep", "UpdateProve", "PSProve", "WdPost", "WinPost")


def _check_range(value: tuple[float, float]) -> tuple[float, float]:
    low, high = value
    if low < 0 or high < low:
        raise ValueError(f"expected 0 <= low <= high, got ({low!r}, {high!r})")
    return value


Range = Annotated[tuple[float, float], AfterValidator(_check_range)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
Hazard = Annotated[float, Field(ge=0.0)]


def _default_weights() -> dict[str, float]:
    return {"PoRep": 0.6, "UpdateProve": 0.15, "PSProve": 0.15, "WdPost": 0.05, "WinPost": 0.05}


class SimConfig(BaseModel):
    """How the simulated fleet, its faults and its proving queue behave."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True)

    # --- stepping
    step_s: float = Field(
        default=10.0, gt=0, description="Longest internal sub-step of `advance`, s."
    )

    # --- the offer market
    machines: int = Field(
        default=80, ge=0, description="Number of host machines in the offer pool."
    )
    gpu_names: tuple[str, ...] = Field(
        default=("RTX 4090", "RTX 5090", "A100 PCIE", "H100 SXM"),
        min_length=1,
        description="GPU models machines are drawn from (uniformly).",
    )
    dph_range: Range = Field(default=(0.35, 0.90), description="Machine price range, $/hour.")
    slow_host_fraction: Fraction = Field(
        default=0.12, description="Share of machines whose true rate is in `slow_rate_range`."
    )
    slow_rate_range: Range = Field(
        default=(8.0, 18.0), description="True rate of slow hosts, proofs/h."
    )
    fast_rate_range: Range = Field(
        default=(25.0, 60.0), description="True rate of other hosts, proofs/h."
    )
    crash_loop_host_fraction: Fraction = Field(
        default=0.08,
        description="Share of machines whose daemon dies a while after every (re)start.",
    )
    crash_loop_s: Range = Field(
        default=(120.0, 420.0),
        description="On a crash-loop host, daemon lifetime after each start, s.",
    )

    # --- instance lifecycle (each stage's duration, drawn per launch)
    boot_s: Range = Field(
        default=(60.0, 240.0), description="Stage provisioning (status provisioning)."
    )
    pull_s: Range = Field(default=(60.0, 300.0), description="Stage loading (status loading).")
    register_s: Range = Field(
        default=(20.0, 90.0), description="Stage registered (status running, sidecar up)."
    )
    params_s: Range = Field(
        default=(300.0, 1200.0), description="Stage params (proof parameter fetch)."
    )
    bench_s: Range = Field(
        default=(300.0, 900.0),
        description="Stage bench (daemon up); restarts if the daemon restarts.",
    )
    bench_noise: Range = Field(
        default=(0.9, 1.1), description="Measured bench_rate = machine true rate x this factor."
    )
    stuck_fraction: Fraction = Field(
        default=0.05,
        description="Chance per launch of sticking forever in loading, params or bench.",
    )
    status_closed_fraction: Fraction = Field(
        default=0.0,
        description="Chance per launch that cuzk's status server never answers from outside "
        "the container while the daemon runs (cuzk's status_listen is empty by default, or "
        "127.0.0.1 only).",
    )

    # --- faults (hazards apply only while the instance's status is "running")
    daemon_death_per_h: Hazard = Field(
        default=0.06, description="Silent daemon death while stage is running (sidecar stays up)."
    )
    exit_per_h: Hazard = Field(
        default=0.01, description="Container exits: status exited, for good."
    )
    offline_per_h: Hazard = Field(
        default=0.01, description="Host disconnects: status offline, for good."
    )
    frozen_per_h: Hazard = Field(
        default=0.015, description="Container frozen by the host, for good (per instance)."
    )
    odd_status_per_h: Hazard = Field(
        default=0.25,
        description="Fleet-wide: a random running instance freezes (a status no shipped rule "
        "knows), so one shows up now and then whatever the instances' lifetimes.",
    )
    restart_delay_s: float = Field(
        default=20.0, ge=0, description="restart_daemon: seconds until the daemon is up again."
    )
    supervised_restart_s: float | None = Field(
        default=None,
        gt=0,
        description="cuzk under supervisord with autorestart: a daemon that dies (silently or "
        "on a crash-loop host) is started again by itself this many seconds later, its tasks "
        "lost; None (the default): it stays down until restarted.",
    )
    reboot_s: float = Field(default=60.0, ge=0, description="reboot: seconds in status rebooting.")

    # --- stop and start (vast keeps a stopped instance's disk and bills only its storage)
    disk_gb: float = Field(default=250.0, ge=0, description="Disk of every instance, GB.")
    storage_price_range: Range = Field(
        default=(0.00014, 0.00042),
        description="Storage price per GB-hour, per machine (about $0.10 to $0.30 a GB-month);"
        " billed while an instance is stopped (a running instance's price includes it).",
    )
    start_s: Range = Field(
        default=(30.0, 120.0),
        description="start of a stopped instance: seconds in status loading once its GPUs are"
        " free (the disk keeps the image, parameters and benchmark: nothing is fetched again).",
    )
    start_wait_per_h: Hazard = Field(
        default=0.05,
        description="Chance per hour stopped that someone else rented the host's GPUs, so a"
        " start waits (scheduling) until they are free again.",
    )
    start_wait_s: Range = Field(
        default=(900.0, 21600.0), description="How long such a start waits (scheduling), s."
    )
    stopped_loss_per_h: Hazard = Field(
        default=0.002,
        description="A stopped instance's machine is lost (the instance goes to exited).",
    )

    # --- the vast account and its wire (controller.sim.vast_api); 0 = a clean account
    foreign_instances: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="Instances on the account that fleetgate did not launch: they hold machines,"
        " never change and never claim tasks (labels jupyter, '' and old-prover; some stopped).",
    )
    empty_label_fraction: Fraction = Field(
        default=0.0,
        description="Share of launched instances whose label vast's API shows as '' (the"
        " container keeps its label); drawn per instance, not from the world's RNG.",
    )
    late_create_s: Range = Field(
        default=(0.0, 0.0),
        description="After a create through the wire, seconds the new instance stays missing"
        " from vast's list and show (the create succeeds before the listing shows it).",
    )
    vast_429_fraction: Fraction = Field(
        default=0.0, description="Wire: share of calls refused with 429 (plain text, no wait)."
    )
    vast_5xx_fraction: Fraction = Field(
        default=0.0, description="Wire: share of reads and mutations answered 503, nothing done."
    )
    vast_truncated_fraction: Fraction = Field(
        default=0.0, description="Wire: share of reads answered 200 with a JSON body cut short."
    )
    create_lost_fraction: Fraction = Field(
        default=0.0, description="Wire: share of creates that rent the instance but answer 502."
    )
    create_failed_fraction: Fraction = Field(
        default=0.0, description="Wire: share of creates that answer 500 and rent nothing."
    )

    # --- the proving queue
    slots_per_instance: int = Field(default=2, ge=1, description="Tasks one node runs at once.")
    reference_rate: float = Field(
        default=30.0,
        gt=0,
        description="Rate (proofs/h) at which a task takes its base service time.",
    )
    curio_machine_timeout_s: float = Field(
        default=600.0,
        ge=0,
        description="Tasks of an exited/offline/frozen node return after this, s.",
    )
    operator_nodes: int = Field(
        default=1,
        ge=0,
        le=254,
        strict=True,
        description="The operator's own Curio nodes (harmony ids 1..n, see sim.addresses): they"
        " always heartbeat and own no simulated tasks.",
    )
    demand: Literal["synthetic", "trace"] = Field(
        default="synthetic", description="Where task arrivals come from."
    )
    task_weights: dict[str, float] = Field(
        default_factory=_default_weights,
        description="Task name -> relative weight; names of arriving tasks are drawn from it.",
    )
    busy_s: float = Field(
        default=10800.0, gt=0, description="Synthetic: length of a busy phase, s."
    )
    quiet_s: float = Field(
        default=7200.0, ge=0, description="Synthetic: length of a quiet phase, s."
    )
    busy_rate_per_h: Hazard = Field(
        default=40.0, description="Synthetic: arrivals/h in a busy phase."
    )
    quiet_rate_per_h: Hazard = Field(
        default=0.0, description="Synthetic: arrivals/h in a quiet phase."
    )
    service_min_s: float = Field(
        default=900.0, gt=0, description="Synthetic: shortest base service time, s."
    )
    service_max_s: float = Field(
        default=1800.0, gt=0, description="Synthetic: longest base service time, s."
    )
    trace_path: str | None = Field(
        default=None,
        description="Trace mode: the task trace, a CSV in the Alibaba openb pod list's columns or"
        " a Standard Workload Format log (.swf, .swf.gz).",
    )
    trace_time_scale: float = Field(
        default=0.01,
        gt=0,
        description="Trace mode: factor applied to the trace's inter-arrival times.",
    )
    trace_service_scale: float = Field(
        default=0.1,
        gt=0,
        description="Trace mode: factor applied to task lifetimes (service times).",
    )

    @model_validator(mode="after")
    def _check_consistency(self) -> Self:
        """Cross-field checks, as sentences."""
        if self.service_max_s < self.service_min_s:
            raise ValueError("service_max_s must be >= service_min_s")
        if self.demand == "trace" and not self.trace_path:
            raise ValueError("demand 'trace' needs trace_path")
        if self.foreign_instances > self.machines:
            raise ValueError("foreign_instances must be <= machines (each holds one machine)")
        if self.create_lost_fraction + self.create_failed_fraction > 1.0:
            raise ValueError("create_lost_fraction + create_failed_fraction must be <= 1")
        if not self.task_weights or sum(self.task_weights.values()) <= 0:
            raise ValueError("task_weights needs at least one positive weight")
        for name, weight in self.task_weights.items():
            if not 0 < len(name) <= 16:
                raise ValueError(f"task name {name!r} must be 1 to 16 characters")
            if weight < 0:
                raise ValueError(f"task weight for {name!r} must be >= 0")
        return self

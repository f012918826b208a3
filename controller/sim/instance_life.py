"""What happens to one instance: lifecycle stages, faults, restarts and reboots.

Each function changes one `SimInstance` at a given virtual time and returns the effect on the
tasks its Curio node owns, which the world applies to the queue:

    ""         nothing
    "release"  owned tasks go back to pending now (daemon died, reboot, restart)
    "stall"    owned tasks stop progressing; a later "release" event returns them (lost node)

No I/O, no clock: time and randomness are passed in.
"""

from __future__ import annotations

import logging
import random
from typing import Literal

from controller.fleet.base import PermanentProviderError
from controller.sim.config import SimConfig
from controller.sim.instance import LOST_STATUSES, SimInstance
from controller.sim.machines import Machine

log = logging.getLogger(__name__)

Effect = Literal["", "release", "stall"]
STUCK_STAGES = ("loading", "params", "bench")
DAEMON_STAGES = ("bench", "running")


def new_instance(
    instance_id: str,
    label: str,
    machine: Machine,
    now: float,
    config: SimConfig,
    rng: random.Random,
) -> SimInstance:
    """A freshly launched instance with its stage durations, bench noise and fate drawn."""
    durations = {
        "provisioning": rng.uniform(*config.boot_s),
        "loading": rng.uniform(*config.pull_s),
        "registered": rng.uniform(*config.register_s),
        "params": rng.uniform(*config.params_s),
        "bench": rng.uniform(*config.bench_s),
    }
    bench_factor = rng.uniform(*config.bench_noise)
    stuck = rng.choice(STUCK_STAGES) if rng.random() < config.stuck_fraction else ""
    # drawn only when asked for: the other draws (and the benchmarks) stay as they were
    closed = config.status_closed_fraction > 0 and rng.random() < config.status_closed_fraction
    return SimInstance(
        id=instance_id,
        label=label,
        machine_id=machine.machine_id,
        launched_at=now,
        durations=durations,
        bench_factor=bench_factor,
        stuck=stuck,
        status_closed=closed,
        stage_until=now + durations["provisioning"],
    )


def apply_event(
    inst: SimInstance,
    kind: str,
    t: float,
    machine: Machine,
    config: SimConfig,
    rng: random.Random,
) -> Effect:
    """Apply the scheduled event `kind` that is due at `t`."""
    if kind == "stage":
        return _end_stage(inst, t, machine, config, rng)
    if kind == "death":
        log.debug("sim: instance %s daemon died at %.0f", inst.id, t)
        effect = _kill_daemon(inst)
        if config.supervised_restart_s is not None:  # its supervisor starts it again
            inst.restart_at = t + config.supervised_restart_s
        return effect
    if kind == "restart":
        inst.restart_at = None
        _start_daemon(inst, t, machine, config, rng)
        return ""
    if kind == "reboot_end":
        return _end_reboot(inst, t, machine, config, rng)
    if kind == "start":
        begin_start(inst, t)
        return ""
    if kind == "release":
        inst.release_at = None
        return "release"
    return lose(inst, kind, t, config)


def _end_stage(
    inst: SimInstance, t: float, machine: Machine, config: SimConfig, rng: random.Random
) -> Effect:
    inst.stage_until = None
    if inst.stage == "provisioning":
        inst.status = inst.stage = "loading"
        _schedule_stage(inst, t)
    elif inst.stage == "loading":
        inst.status, inst.stage, inst.sidecar = "running", "registered", "up"
        _schedule_stage(inst, t)
        _arm_faults(inst, t, config, rng)
    elif inst.stage == "registered":
        inst.stage = "params"
        _schedule_stage(inst, t)
    elif inst.stage == "params":
        inst.stage = "bench"
        _start_daemon(inst, t, machine, config, rng)
    elif inst.stage == "bench":
        inst.stage = "running"
        inst.bench_rate = round(machine.rate * inst.bench_factor, 2)
        silent = _exp_time(t, config.daemon_death_per_h, rng)
        inst.death_at = _earliest(inst.death_at, silent)
    return ""


def _schedule_stage(inst: SimInstance, t: float) -> None:
    """Start the clock of the current stage, unless the instance sticks in it forever."""
    if inst.stuck == inst.stage:
        inst.stage_until = None
    else:
        inst.stage_until = t + inst.durations[inst.stage]


def _start_daemon(
    inst: SimInstance, t: float, machine: Machine, config: SimConfig, rng: random.Random
) -> None:
    """The daemon (re)starts at `t`: uptime resets, a benchmark starts over, deaths re-armed."""
    inst.daemon, inst.daemon_started_at = "up", t
    if inst.stage == "bench":
        _schedule_stage(inst, t)
    crash = None
    if machine.crash_loop and inst.stage in DAEMON_STAGES:
        crash = t + rng.uniform(*config.crash_loop_s)
    silent = _exp_time(t, config.daemon_death_per_h, rng) if inst.stage == "running" else None
    inst.death_at = _earliest(crash, silent)


def _kill_daemon(inst: SimInstance) -> Effect:
    """The daemon stops; a benchmark in progress is lost."""
    inst.daemon, inst.daemon_started_at, inst.death_at = "down", None, None
    if inst.stage == "bench":
        inst.stage_until = None
    return "release"


def _arm_faults(inst: SimInstance, t: float, config: SimConfig, rng: random.Random) -> None:
    """Draw when the status hazards strike, now that the status is running."""
    inst.exit_at = _exp_time(t, config.exit_per_h, rng)
    inst.offline_at = _exp_time(t, config.offline_per_h, rng)
    inst.frozen_at = _exp_time(t, config.frozen_per_h, rng)


def lose(inst: SimInstance, kind: str, t: float, config: SimConfig) -> Effect:
    """The container exits, the host goes offline or freezes: for good."""
    status, msg, health = {
        "exit": ("exited", "container exited unexpectedly", "down"),
        "offline": ("offline", "host disconnected", "down"),
        "frozen": ("frozen", "container frozen by host", "unknown"),
    }[kind]
    log.debug("sim: instance %s %s at %.0f", inst.id, status, t)
    inst.clear_schedule()
    inst.status, inst.status_msg = status, msg
    inst.daemon = inst.sidecar = health
    inst.daemon_started_at = None
    inst.release_at = t + config.curio_machine_timeout_s
    return "stall"


def _end_reboot(
    inst: SimInstance, t: float, machine: Machine, config: SimConfig, rng: random.Random
) -> Effect:
    inst.reboot_until = None
    inst.status, inst.status_msg, inst.sidecar = "running", "", "up"
    if inst.stage in DAEMON_STAGES:
        _start_daemon(inst, t, machine, config, rng)
    elif inst.stage_left is not None:
        inst.stage_until = t + inst.stage_left
    inst.stage_left = None
    _arm_faults(inst, t, config, rng)
    return ""


def begin_start(inst: SimInstance, t: float) -> None:
    """A start's GPUs are free: the container loads (`durations["start"]` seconds, from the
    disk it kept) and then runs as after a reboot; the machine's price bills from now."""
    inst.start_at = None
    inst.resume_billing(t)
    inst.status, inst.status_msg = "loading", "starting"
    inst.reboot_until = t + inst.durations.get("start", 0.0)  # a reboot's end brings it back


def restart_daemon(inst: SimInstance, now: float, config: SimConfig) -> Effect:
    """Kill the daemon now and have it up again `restart_delay_s` later.

    A no-op unless the status is running and the daemon belongs in the stage (bench, running).
    """
    if inst.status != "running" or inst.stage not in DAEMON_STAGES:
        log.info("sim: restart_daemon on %s ignored (%s/%s)", inst.id, inst.status, inst.stage)
        return ""
    effect = _kill_daemon(inst)
    inst.restart_at = now + config.restart_delay_s
    return effect


def reboot(inst: SimInstance, now: float, config: SimConfig) -> Effect:
    """Stop and start the container: `reboot_s` in status rebooting, stage kept."""
    if inst.status in LOST_STATUSES:
        raise PermanentProviderError(f"instance {inst.id!r} is {inst.status}: cannot reboot")
    if inst.status != "running":
        log.info("sim: reboot on instance %s (%s) ignored", inst.id, inst.status)
        return ""
    inst.stage_left = None if inst.stage_until is None else inst.stage_until - now
    inst.clear_schedule()
    inst.status, inst.status_msg = "rebooting", "rebooting"
    inst.daemon = inst.sidecar = "down"
    inst.daemon_started_at = None
    inst.reboot_until = now + config.reboot_s
    return "release"


def _exp_time(t: float, rate_per_h: float, rng: random.Random) -> float | None:
    """When an event of hazard `rate_per_h` strikes after `t`, or None if it never does."""
    if rate_per_h <= 0:
        return None
    return t + rng.expovariate(rate_per_h / 3600.0)


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)

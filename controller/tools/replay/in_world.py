"""The proportional baseline run on the simulated world fleetgate faces, faults and all.

`baselines.proportional` scales a fluid model in which instances boot in a fixed time, run
every task at the trace's pace and never fail. What an operator would otherwise run is such a
scaler on the same rented machines: every boot of its own length, slow and crash-looping hosts,
silent daemon deaths, lost hosts and stuck boots. This runs it there: the same `SimConfig`,
seed and task list as fleetgate's run, moved by the same `Simulation.advance`, acting through
the world's own launch, destroy and restart calls.

The scaler is KEDA's (see `baselines`): every `interval_s` it wants
ceil((waiting + running) / tasks_per_instance) instances, at most `max_instances`; it launches at
once to grow and shrinks to the highest target of the last `cooldown_s` by giving back
instances holding no task (booting ones first, newest first). A launch rents the cheapest free
machine, as a search ordered by price does; it knows nothing of rates or bad hosts.

Around it, what Kubernetes and a cloud's node health checks give such a deployment (`Health`),
generous where a choice had to be made:
- an instance whose status the provider reports lost (exited, offline, frozen, unknown) is
  destroyed at the next poll, and the scaler replaces it;
- a dead daemon is restarted, as a liveness probe does, with CrashLoopBackOff's delays (10 s
  doubling to 5 min, back to 10 s after 10 min up); a crash-looping host is never given up;
- an instance not serving `provision_timeout_s` after it was rented is destroyed (a provision
  timeout, set above the simulator's longest healthy boot so that it never kills one);
- a slow host is not noticed: nothing in such a deployment measures proofs per hour.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field

from controller.fleet.base import PermanentProviderError
from controller.sim import Simulation
from controller.sim.instance import LOST_STATUSES, SimInstance
from controller.sim.instance_life import DAEMON_STAGES
from controller.tools.replay.results import BaselineParams, Outcome, Sample
from controller.tools.replay.run import fleet_states, sample, waits_and_censored

NAME = "proportional_sim"
GONE = (*LOST_STATUSES, "unknown")


@dataclass(frozen=True)
class Health:
    """The health checks around the scaler (see the module docstring)."""

    provision_timeout_s: float = 3600.0
    backoff_first_s: float = 10.0
    backoff_max_s: float = 300.0
    backoff_reset_s: float = 600.0


@dataclass
class _Restarts:
    """One instance's liveness restarts: how many in a row, and when the last one was."""

    count: int = 0
    last_at: float = -math.inf


@dataclass
class _Scaler:
    sim: Simulation
    p: BaselineParams
    health: Health
    window: deque[tuple[float, int]] = field(default_factory=deque)
    restarts: dict[str, _Restarts] = field(default_factory=dict)
    actions: Counter[str] = field(default_factory=Counter)
    launched: int = 0

    def poll(self) -> None:
        now = self.sim.now()
        for inst in self.sim.world.live_instances():
            self._check(inst, now)
        self._scale(now)

    def _check(self, inst: SimInstance, now: float) -> None:
        world = self.sim.world
        if inst.status in GONE:
            world.destroy(inst.id, now)
            self.actions["destroy_lost"] += 1
            self.restarts.pop(inst.id, None)
        elif inst.stage != "running" and now - inst.launched_at >= self.health.provision_timeout_s:
            world.destroy(inst.id, now)
            self.actions["destroy_provision_timeout"] += 1
            self.restarts.pop(inst.id, None)
        elif inst.status == "running" and inst.stage in DAEMON_STAGES:
            self._liveness(inst, now)

    def _liveness(self, inst: SimInstance, now: float) -> None:
        state = self.restarts.setdefault(inst.id, _Restarts())
        uptime = inst.uptime(now)
        if uptime is not None:
            if uptime >= self.health.backoff_reset_s:
                state.count = 0
            return
        if inst.restart_at is not None:  # already coming back
            return
        h = self.health
        delay = 0.0 if state.count == 0 else min(
            h.backoff_first_s * 2 ** (state.count - 1), h.backoff_max_s
        )  # fmt: skip
        if now - state.last_at >= delay:
            self.sim.world.restart_daemon(inst.id, now)
            state.count, state.last_at = state.count + 1, now
            self.actions["restart_daemon"] += 1

    def _scale(self, now: float) -> None:
        world = self.sim.world
        total = next(d for d in world.demand(now) if d.task == "all")
        target = math.ceil((total.pending + total.running) / self.p.tasks_per_instance)
        if self.p.max_instances is not None:
            target = min(target, self.p.max_instances)
        self.window.append((now, target))
        while self.window[0][0] < now - self.p.cooldown_s:
            self.window.popleft()
        live = world.live_instances()
        if target > len(live):
            for _ in range(target - len(live)):
                try:
                    world.launch(f"proportional-{self.launched}", now)
                except PermanentProviderError:
                    self.actions["launch_failed"] += 1
                    break
                self.launched += 1
                self.actions["launch"] += 1
            return
        surplus = len(live) - max(w for _, w in self.window)
        owned = world.queue.owned_counts()
        idle = [i for i in live if not owned[i.id]]
        idle.sort(key=lambda i: (i.stage == "running", -int(i.id)))
        for inst in idle[: max(surplus, 0)]:
            world.destroy(inst.id, now)
            self.restarts.pop(inst.id, None)
            self.actions["destroy_idle"] += 1


def proportional_in_world(
    sim: Simulation, p: BaselineParams, polls: int, health: Health = Health()
) -> Outcome:
    """Poll `polls` times, `p.interval_s` of virtual time apart, on `sim` (from its start)."""
    scaler = _Scaler(sim, p, health)
    start, step_h = sim.now(), p.interval_s / 3600.0
    sample_every = max(1, round(p.sample_s / p.interval_s))
    series: list[Sample] = [sample(sim, start)]
    hours: dict[str, float] = defaultdict(float)
    peak = 0
    for n in range(1, polls + 1):
        sim.advance(p.interval_s)
        scaler.poll()
        states = fleet_states(sim)
        peak = max(peak, sum(states.values()))
        for state, count in states.items():
            hours[state] += count * step_h
        if n % sample_every == 0 or n == polls:
            series.append(sample(sim, start))
    stats = sim.stats
    waits, censored = waits_and_censored(sim)
    gpu_hours = stats["gpu_hours"]
    notes = {
        "actions": dict(sorted(scaler.actions.items())),
        "instance_hours_by_state": {k: round(v, 2) for k, v in sorted(hours.items())},
        "tasks_released": stats["tasks_released"],
        "avg_dph": round(stats["spend_usd"] / gpu_hours, 4) if gpu_hours else None,
        "provision_timeout_s": health.provision_timeout_s,
    }
    return Outcome(
        name=NAME, instance_s=gpu_hours * 3600.0,
        dph=stats["spend_usd"] / gpu_hours if gpu_hours else 0.0, gpus_per_instance=1,
        waits=tuple(waits), censored=censored, instances_started=stats["instances_launched"],
        peak_instances=peak, series=tuple(series), spend_usd=stats["spend_usd"], notes=notes,
    )  # fmt: skip

"""The fleets and controllers of `fleetgate bench tick`: the same mix of N instances every tick.

The mix, per 100 instances: 1 exited, 2 with the daemon down while the Curio sidecar runs, 3
booting (stages provisioning, loading, registered, params, bench, in turn), 94 serving with 1-2
tasks each; and a backlog of PoRep tasks, the oldest pending 600 s.

- `SyntheticFleet` (`--path synthetic`): the mix as a fixed listing of `Instance`s (built
  before the tick) and a fixed demand; every action is accepted and changes nothing.
- `SimBench`: a simulated world holding the mix, one machine per instance plus spare offers,
  built directly (SimInstance fields, queue tasks), behind the production fleet path
  (`fleet_path.real_fleet` on `SimWire`'s seams, as `assemble` builds provider sim). Its agents
  register and report their boot through `InstanceService` (`SimAgents`), and one listing links
  their records to vast ids and Curio nodes, as a first tick would. `prepare()`, untimed, sets
  the virtual clock to the bench's, lets the agents heartbeat (they run the commands queued for
  them), then puts the prepared world back: what the tick and the agents did to it is undone,
  the sidecars are seen at the new time. `Simulation.advance` is never called.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from controller.core.model import Demand, Health, Instance
from controller.core.policy import DecideSettings
from controller.core.track import first_track
from controller.fleet.base import LaunchRequest
from controller.fleet.instance_api import InstanceService
from controller.rules.source import RulesSource
from controller.service.app import decide_settings
from controller.service.config import Config
from controller.service.fleet_path import on_gone, real_fleet, sim_settings
from controller.service.tick import Controller
from controller.sim import SimConfig, Simulation
from controller.sim.agents import AgentSettings
from controller.sim.instance import SimInstance
from controller.sim.queue import Task, TaskQueue
from controller.sim.stats import Stats
from controller.sim.wire import SimWire
from controller.sim.world import FIRST_INSTANCE_ID, World
from controller.store.instance_tokens import TOKEN_ENV
from controller.store.journal import Journal
from escalation.notify import Notifier
from escalation.outbox import Outbox
from escalation.render import Renderer
from escalation.router import Escalator

ROOT = Path(__file__).resolve().parents[3]
_T0 = 1_700_000_000.0
TASK = "PoRep"
OLDEST_PENDING_S = 600.0
_BOOT: tuple[tuple[str, str, Health, Health], ...] = (  # (stage, status, daemon, sidecar)
    ("provisioning", "provisioning", "down", "down"),
    ("loading", "loading", "down", "down"),
    ("registered", "running", "down", "up"),
    ("params", "running", "down", "up"),
    ("bench", "running", "up", "up"),
)
_DURATIONS = {"provisioning": 120.0, "loading": 180.0, "registered": 60.0, "params": 600.0,
              "bench": 600.0}  # fmt: skip


def kind_of(i: int) -> str:
    """What instance `i` of the mix is: exited, down (daemon), booting or serving."""
    slot = i % 100
    return "exited" if slot == 0 else "down" if slot < 3 else "booting" if slot < 6 else "serving"


def _start(i: int) -> float:
    return _T0 - 7200 - (i % 50) * 60


def synthetic_instances(n: int, now: float) -> list[Instance]:
    """A fleet of `n`: per 100, 1 exited, 2 with the daemon down, 3 booting, 94 serving."""
    out = []
    for i in range(n):
        kind, start = kind_of(i), _start(i)
        common: dict[str, Any] = {
            "id": str(10_000_000 + i), "label": f"fg-bench-{i}",
            "machine_id": str(500_000 + i // 2), "host_id": str(90_000 + i // 8),
            "gpu_name": "RTX 4090", "num_gpus": 1, "dph": round(0.30 + (i % 7) * 0.05, 2),
            "start_date": start,
        }  # fmt: skip
        if kind == "exited":  # never comes back; destroyed once past the grace time
            inst = Instance(**common, status="exited", stage="running", daemon="down",
                            sidecar="down", status_msg="container exited (137)")  # fmt: skip
        elif kind == "down":  # cuzk died silently while the sidecar runs
            inst = Instance(**common, status="running", stage="running", daemon="down",
                            sidecar="up", bench_rate=40.0 + i % 20)  # fmt: skip
        elif kind == "booting":
            stage, status, daemon, sidecar = _BOOT[(i // 100 + i % 100) % len(_BOOT)]
            inst = Instance(**common, status=status, stage=stage, daemon=daemon, sidecar=sidecar,
                            daemon_uptime_s=now - start if daemon == "up" else None)  # fmt: skip
        else:
            inst = Instance(**common, status="running", stage="running", daemon="up",
                            sidecar="up", tasks_running=1 + i % 2, bench_rate=25.0 + i % 40,
                            daemon_uptime_s=now - start)  # fmt: skip
        out.append(inst)
    return out


class AcceptingFleet:
    """The actions of a provider that accepts each and changes nothing, and finds no label."""

    def find_by_label(self, label: str) -> Instance | None:
        return None

    def destroy(self, instance_id: str) -> None: ...

    def reboot(self, instance_id: str) -> None: ...

    def restart_daemon(self, instance_id: str) -> None: ...

    def drain(self, instance_id: str) -> None: ...

    def undrain(self, instance_id: str) -> None: ...


class SyntheticFleet(AcceptingFleet):
    """Provider and demand sensor: a fixed listing; every action is accepted and changes nothing."""

    def __init__(self, n: int, clock: Callable[[], float]) -> None:
        self.n = n
        self.clock = clock
        self.launched = 0
        self._listing: list[Instance] = []

    def prepare(self) -> None:
        """Build this tick's listing (untimed: a real listing is a network call)."""
        self._listing = synthetic_instances(self.n, self.clock())

    def list_instances(self) -> list[Instance]:
        return list(self._listing)

    def demand(self) -> list[Demand]:
        # a backlog: at 2 tasks per instance, (pending + running) / 2 is ~5% above the fleet
        pending, running = max(1, self.n * 6 // 10), self.n * 3 // 2
        return [Demand(TASK, pending, running, OLDEST_PENDING_S),
                Demand("all", pending, running, OLDEST_PENDING_S)]  # fmt: skip

    def calls(self) -> Counter[str]:  # no simulated seams
        return Counter()

    def launch(self, request: LaunchRequest) -> str:
        self.launched += 1
        return str(90_000_000 + self.launched)


def mix(instances: Iterable[Instance]) -> dict[str, int]:
    """A listing as the controller saw it: instances per status/stage/daemon/sidecar."""
    seen = Counter(f"{i.status}/{i.stage}/{i.daemon}/{i.sidecar}" for i in instances)
    return dict(sorted(seen.items()))


def sim_instance(i: int, machine_id: str, now: float, *, exited_serves: bool = False
                 ) -> SimInstance:  # fmt: skip
    """Instance `i` of the mix in the simulated world at `now` (an exited one still serving
    when `exited_serves`: how it was before it exited)."""
    kind, start = kind_of(i), _start(i)
    inst = SimInstance(id=str(FIRST_INSTANCE_ID + i), label=f"fg-bench-{i}",
                       machine_id=machine_id, launched_at=start, durations=dict(_DURATIONS),
                       bench_factor=1.0, status="running", stage="running")  # fmt: skip
    if kind == "exited" and not exited_serves:
        inst.status, inst.daemon, inst.sidecar = "exited", "down", "down"
        inst.status_msg, inst.sidecar_seen_at = "container exited (137)", now - 3600  # no node
        inst.bench_rate = 25.0 + i % 40
        return inst
    if kind == "booting":
        inst.stage, inst.status, inst.daemon, inst.sidecar = _BOOT[(i // 100 + i % 100) % 5]
    else:
        inst.daemon, inst.sidecar = ("down" if kind == "down" else "up"), "up"
        inst.bench_rate = 40.0 + i % 20 if kind == "down" else 25.0 + i % 40
    inst.sidecar_seen_at = now if inst.sidecar == "up" else None
    inst.daemon_started_at = start if inst.daemon == "up" else None
    return inst


def sim_queue(n: int, now: float) -> TaskQueue:
    """Serving instance `i` owns 1 + i % 2 tasks; pending tasks bring (pending + running) / 2
    slots to about 5% above the fleet, as the synthetic demand; the oldest pending is 600 s."""
    tasks: list[Task] = []
    for i in range(n):
        for _ in range(1 + i % 2 if kind_of(i) == "serving" else 0):
            tasks.append(Task(len(tasks) + 1, TASK, now - 1800.0, 1200.0,
                              owner=str(FIRST_INSTANCE_ID + i), first_claimed_at=now - 900.0,
                              done_at=now + 3600.0))  # fmt: skip
    pending = max(1, (21 * n + 9) // 10 - len(tasks))
    for k in range(pending):
        posted = now - OLDEST_PENDING_S * (pending - k) / pending
        tasks.append(Task(len(tasks) + 1, TASK, posted, 1200.0))
    return TaskQueue(tasks, next_id=len(tasks) + 1)


def bench_config(config: Config) -> Config:
    """`config` as provider sim, its Curio sensor counting PoRep only (the synthetic demand)."""
    world = {**config.sim.world, "task_weights": {TASK: 1.0}}
    sim = config.sim.model_copy(update={"world": world})
    return config.model_copy(update={"provider": "sim", "sim": sim})


class SimBench:
    """`n` instances of the mix in a simulated world, with the production fleet path on its wire."""

    def __init__(self, config: Config, n: int, journal: Journal,
                 clock: Callable[[], float]) -> None:  # fmt: skip
        self.n, self.clock, self.journal = n, clock, journal
        self.config = bench_config(config)
        world = SimConfig(machines=n + n // 10 + 10, task_weights={TASK: 1.0},
                          odd_status_per_h=0.0)  # fmt: skip
        self.sim = Simulation(world, self.config.sim.seed, start=clock())
        self.wire = SimWire(self.sim, AgentSettings.model_validate(self.config.sim.agents))
        self.fleet, self.curio, self.store, self.actions = real_fleet(
            sim_settings(self.config.sim.world), journal, self.sim.now, self.wire.seams
        )
        self.wire.attach(InstanceService(self.store, self.sim.now))
        fixed = self.sim.world.to_json()
        self._machines, self._account = fixed["machines"], fixed["account"]
        # what each launch gives its instance: its own token, in the container's environment
        issue = self.store.tokens.issue
        self._account["env"] = {
            str(FIRST_INSTANCE_ID + i): {TOKEN_ENV: issue(f"fg-bench-{i}", clock())}
            for i in range(n)
        }
        journal.actions.import_launches(  # the fleet is this journal's: its launches rented it,
            [(str(FIRST_INSTANCE_ID + i), f"fg-bench-{i}") for i in range(n)],  # days ago
            clock() - 2 * 86_400.0, "bench",
        )  # fmt: skip
        self._machine_ids = list(self.sim.world.machines)
        self._install(exited_serves=True)  # before the exits: every agent that ran registers
        self._agents_step()
        listed = self.fleet.list_instances()  # learns the links of records to vast ids and nodes
        self.fleet.save_learned()
        died_after_answering(journal, listed, clock())
        self._install()

    def calls(self) -> Counter[str]:
        """Calls answered so far at each simulated seam, as `seam.endpoint`."""
        w = self.wire
        seams = {"vast": w.vast.calls, "curio": w.curio.calls, "probes": w.probes.calls}
        return Counter({f"{s}.{k}": v for s, calls in seams.items() for k, v in calls.items()})

    @property
    def spend(self) -> float:
        """$/hour of the `n` instances' machines."""
        machines = self.sim.world.machines
        return sum(machines[m].dph for m in self._machine_ids[: self.n])

    def prepare(self) -> None:
        """Move the virtual clock to the bench's (never back), let the agents heartbeat, and put
        the prepared world back at that time (untimed, before each tick)."""
        self.sim._clock.set(max(self.clock(), self.sim.now()))  # not advance: no world step
        self._agents_step()
        self._install()

    def _agents_step(self) -> None:
        agents = self.wire.agents
        assert agents is not None  # attached in __init__
        agents.step(self.sim.now())

    def _install(self, *, exited_serves: bool = False) -> None:
        """The world in its prepared state at the virtual now (re-initialized in place: the
        wire's transport, Curio rows and probes hold this very `World`)."""
        now, ids = self.sim.now(), self._machine_ids
        instances = [sim_instance(i, ids[i], now, exited_serves=exited_serves)
                     for i in range(self.n)]  # fmt: skip
        state = {
            "start": self.sim.world.start, "machines": self._machines,
            "instances": [inst.to_json() for inst in instances],
            "next_instance_id": FIRST_INSTANCE_ID + self.n,
            "queue": sim_queue(self.n, now).to_json(), "next_arrival_at": None,
            "trace_index": 0, "stats": Stats().to_json(), "next_odd_at": None,
            "account": self._account,
        }  # fmt: skip
        # a fresh RNG each time: a launch during the tick draws the same numbers every tick
        World.__init__(self.sim.world, self.sim.config, random.Random(self.sim.seed), state)


def bench_settings(config: Config, n: int, spend: float) -> DecideSettings:
    """The config's decide settings, limits sized for a fleet of `n` (else every tick vetoes)."""
    settings = decide_settings(config)
    limits = settings.guards.model_copy(
        update={"max_instances": n + n // 10 + 10, "max_spend_per_hour": spend * 1.2 + 100,
                "paused": False})  # fmt: skip
    return settings.model_copy(update={"guards": limits})


def _parts(config: Config, n: int, journal: Journal, spend: float) -> dict[str, Any]:
    """What both controllers share: the shipped rules, sized limits, no escalation channels."""
    escalator = Escalator(journal, Notifier([], Renderer()), window_s=3600, deadline_s=1800)
    escalator.after_write = Outbox(escalator).work  # in the tick, as on the simulator
    return {"journal": journal, "rules": RulesSource([ROOT / "rules"]),
            "settings": bench_settings(config, n, spend), "escalator": escalator}  # fmt: skip


def died_after_answering(journal: Journal, listed: Iterable[Instance], now: float) -> None:
    """The mix's instances whose daemon is down ran it before it died: their tracks say its
    status server answered (one that never did is asked about, not restarted)."""
    tracks = {i.id: first_track(replace(i, daemon="up"), now)._replace(answered=True)
              for i in listed if i.daemon == "down" and i.status == "running"}  # fmt: skip
    journal.fleet.save_tracks(tracks, [])


def synthetic_controller(config: Config, n: int, journal: Journal,
                         clock: list[float]) -> tuple[Controller, SyntheticFleet]:  # fmt: skip
    died_after_answering(journal, synthetic_instances(n, clock[0]), clock[0])
    fleet = SyntheticFleet(n, lambda: clock[0])
    spend = sum(i.dph for i in synthetic_instances(n, _T0))
    c = Controller(provider=fleet, demand=fleet, clock=lambda: clock[0],
                   **_parts(config, n, journal, spend))  # fmt: skip
    return c, fleet


def sim_controller(config: Config, n: int, journal: Journal,
                   clock: list[float]) -> tuple[Controller, SimBench]:  # fmt: skip
    """The controller as `assemble` builds provider sim, without its world step before the tick
    (`SimBench.prepare` does what may be done) and its save of the simulator's state after it;
    failed probes are debounced as there."""
    bench = SimBench(config, n, journal, lambda: clock[0])
    fleet = bench.fleet
    c = Controller(provider=fleet, demand=bench.curio, clock=bench.sim.now,
                   actions=bench.actions, on_gone=on_gone(fleet, bench.actions),
                   debounce=sim_settings(config.sim.world).debounce,
                   **_parts(config, n, journal, bench.spend))  # fmt: skip
    return c, bench

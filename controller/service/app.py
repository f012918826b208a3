"""Assemble a controller from the config: journal, provider, demand, rules, escalation.

The embedded default (no config) is the built-in simulator on virtual time and SQLite in the
state directory. The simulator's world is saved in the journal after every tick, so consecutive
`fleetgate tick` runs continue the same world.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.core.policy import DecideSettings
from controller.rules.source import RulesSource
from controller.service import wiring
from controller.service.config import Config, rules_paths
from controller.service.tick import Controller
from controller.sim import SimConfig, Simulation
from controller.store import lease
from controller.store.journal import Journal
from escalation.notify import Notifier
from escalation.render import Renderer
from escalation.router import Escalator

log = logging.getLogger(__name__)

SIM_KEY = "sim.state"
AGENTS_KEY = "sim.agents"


@dataclass
class App:
    config: Config
    state: Path
    journal: Journal
    controller: Controller
    sim: Simulation | None
    lifecycle: Any = None  # the instance records
    wire: Any = None  # the simulator's wire (provider sim): its seams count their calls

    def close(self) -> None:
        self.journal.close()

    def serve_api(self) -> Any | None:
        """Start the HTTP API when the config names one; returns the server (stop() it)."""
        if self.config.api is None:
            return None
        from controller.service.api import Server, create_app

        token = wiring.api_token(self.config)
        assert token is not None
        routers = []
        if self.lifecycle is not None and self.config.instances is not None:
            from controller.fleet.instance_api import instance_router

            fleet_token = wiring.secret(self.config.instances.fleet_token, "instances.fleet_token")
            assert fleet_token is not None
            routers.append(instance_router(self.lifecycle, fleet_token, self.controller.clock))
        app = create_app(self.journal, token, self.controller.clock,
                         on_answer=self.controller.escalator.closed,
                         status=lambda: status(self), routers=routers)  # fmt: skip
        host, _, port = self.config.api.listen.rpartition(":")
        server = Server(app, host, int(port))
        server.start()
        log.info("HTTP API on http://%s:%d (answers: POST /v1/escalations/ID/answer)", host,
                 server.port)  # fmt: skip
        return server


def decide_settings(config: Config) -> DecideSettings:
    values = {**DecideSettings().values, **config.settings}
    return DecideSettings(gate=config.gate, guards=config.guards, values=values)


def load_sim(journal: Journal, config: Config, seed: int | None) -> Simulation:
    """The saved world, or a new one (from --seed, else the config's seed)."""
    saved = journal.get(SIM_KEY)
    if saved is not None:
        sim = Simulation.from_json(saved)
        if seed is not None and seed != sim.seed:
            log.warning(
                "this state directory continues a world of seed %d; --seed %d ignored "
                "(use a new --state for a new world)",
                sim.seed,
                seed,
            )
        return sim
    world = SimConfig.model_validate(config.sim.world)
    return Simulation(world, config.sim.seed if seed is None else seed)


def cli_prefix(config_path: str | None, state: Path) -> str:
    parts = ["fleetgate"]
    if config_path:
        parts += ["--config", config_path]
    if str(state) != ".fleetgate":
        parts += ["--state", str(state)]
    return " ".join(shlex.quote(p) for p in parts)


def build(
    config: Config,
    state: Path,
    *,
    config_path: str | None = None,
    seed: int | None = None,
    rules: list[str] | None = None,
    clock: Callable[[], float] = time.time,
    seams: Any = None,
) -> App:
    """The controller the config describes. `clock` is the controller's (provider vast; the
    simulator brings its own), `seams` the wire under the fleet path (default: the real one;
    a test may hand in its own, e.g. with a fake clock and sleep for the vast client)."""
    # urllib3 logs request paths at DEBUG, and a webhook's path is a secret: whoever embeds
    # the controller with DEBUG logging must not leak it
    logging.getLogger("urllib3").setLevel(max(logging.getLogger("urllib3").level, logging.WARNING))
    journal = wiring.open_journal(config, state)
    source = RulesSource(rules_paths(config, rules))
    renderer = Renderer(config.escalation.templates_dir)
    escalator = Escalator(
        journal,
        Notifier(wiring.channels(config, state), renderer),
        window_s=config.escalation.dedup_window_s,
        deadline_s=config.escalation.deadline_s,
        cli_prefix=cli_prefix(config_path, state),
        gate=config.gate,
        reader=wiring.llm_client(config, journal, renderer),
        answer_url=wiring.answer_url(config),
    )

    settings = decide_settings(config)
    if config.provider == "vast":
        fleet, curio, store = wiring.real_fleet(config, journal, clock, seams)
        controller = Controller(
            journal=journal, provider=fleet, demand=curio, rules=source, settings=settings,
            escalator=escalator, clock=clock, sources=[fleet.overdue], on_gone=fleet.gone,
            after_tick=lambda: journal.put(wiring.HEALTH_KEY, fleet.failures),
        )  # fmt: skip
        return App(config, state, journal, controller, None, store)
    return _build_sim(config, state, journal, source, settings, escalator, seed)


def _build_sim(config: Config, state: Path, journal: Journal, source: RulesSource,
               settings: DecideSettings, escalator: Escalator,
               seed: int | None) -> App:  # fmt: skip
    """The same fleet path as provider vast, on the simulator's wire (`controller.sim.wire`)."""
    from controller.fleet.instance_api import InstanceService
    from controller.sim.agents import AgentSettings
    from controller.sim.wire import SimWire

    sim = load_sim(journal, config, seed)
    agent_settings = AgentSettings.model_validate(config.sim.agents)
    wire = SimWire(sim, agent_settings, (journal.get(AGENTS_KEY) or {}).get("agents"))
    fleet, curio, store = wiring.real_fleet(config, journal, sim.now, wire.seams)
    wire.attach(InstanceService(store, sim.now))
    step = config.sim.seconds_per_tick

    def save() -> None:
        journal.put(wiring.HEALTH_KEY, fleet.failures)
        journal.put(SIM_KEY, sim.to_json())
        journal.put(AGENTS_KEY, wire.state())

    controller = Controller(
        journal=journal, provider=fleet, demand=curio, rules=source, settings=settings,
        escalator=escalator, clock=sim.now, before_tick=lambda: wire.before_tick(step),
        after_tick=save, sources=[fleet.overdue], on_gone=fleet.gone,
    )  # fmt: skip
    return App(config, state, journal, controller, sim, store, wire)


def status(app: App) -> dict[str, Any]:
    """What `fleetgate status` shows: the fleet as the last tick saw it, the queue, the last
    tick, what waits on people; instances on the account that fleetgate does not manage."""
    j = app.journal
    last = j.ticks(1)
    tracks = list(j.history(app.controller.clock()).instances.values())
    by_stage: dict[str, int] = {}
    for t in tracks:
        key = t.stage if t.status == "running" else t.status
        by_stage[key] = by_stage.get(key, 0) + 1
    summary = (last[0].get("summary") or {}) if last else {}
    return {
        "provider": app.config.provider,
        "paused": bool(j.get("paused", False)) or app.config.guards.paused,
        "rules": app.controller.rules.book.digest,
        "last_tick": last[0] if last else None,
        "instances": len(tracks),
        "by_stage": by_stage,
        "foreign": summary.get("foreign", []),
        "spend_per_h": summary.get("spend_per_h"),
        "demand": {
            "all": {"pending": summary.get("pending"), "running": summary.get("running_tasks")}
        },  # fmt: skip
        "pending_escalations": len(j.escalations(status="pending")),
        "leader": lease.read(j).as_dict(),
        "sim": app.sim.stats if app.sim else None,
    }

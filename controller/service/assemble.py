"""The composition root: from a `Config` to the controller it describes.

`assemble(config, state=..., clock=..., sleep=...)`:

1. read the rules and the templates, build every channel (the registry in `channels.py`):
   what needs no journal, so a config that cannot be built writes nothing;
2. open the journal: SQLite in the state directory or the configured PostgreSQL schema (dry:
   an empty one in memory, so nothing is written where `run` writes);
3. build the LLM reader and the escalator;
4. build the fleet and the controller with the provider's builder (PROVIDERS: vast, sim).

Building opens no connection and sends nothing: the vast client, the Curio sensor, the channels
and the LLM client connect when first used. `fleetgate check` assembles dry and so constructs
everything `run` would; what fails to build is a `ConfigError` naming the config file and key.
`clock` and `sleep` are what every adapter that talks to the world outside is given; nothing
here reads the time or sleeps. The simulator brings its own virtual clock for the controller.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import requests

from controller.core.policy import DecideSettings
from controller.fleet.curio import connect as curio_connect
from controller.fleet.health import check_many
from controller.fleet.instance_api import InstanceService
from controller.rules.source import RulesSource
from controller.service import llm_reader
from controller.service.app import App, decide_settings
from controller.service.channels import ChannelSeams, build_channels
from controller.service.config import Config, rules_paths
from controller.service.config_errors import ConfigError, building
from controller.service.fleet_path import on_gone, real_fleet, sim_settings, vast_settings
from controller.service.secrets import in_shell
from controller.service.tick import Controller
from controller.sim import SimConfig, Simulation
from controller.sim.agents import AgentSettings
from controller.sim.wire import Seams, SimWire
from controller.store.backend import PERSON_WAIT_S, WAIT_S, JournalError
from controller.store.journal import Journal
from controller.store.lease import Lease
from escalation.channels.base import Channel
from escalation.llm import LLMClient
from escalation.notify import Notifier
from escalation.render import Renderer, RenderError
from escalation.router import TOKEN_SHELL, Escalator

log = logging.getLogger(__name__)

SIM_KEY = "sim.state"  # the simulated world, saved after every tick
AGENTS_KEY = "sim.agents"  # its agents
PROVIDER_KEY = "provider"  # the provider whose fleet the journal records, noted at first use
T = TypeVar("T")


@dataclass(frozen=True)
class Parts:
    """What a provider's builder gets: the parts every controller has, and the seams."""

    config: Config
    state: Path
    journal: Journal
    rules: RulesSource
    settings: DecideSettings
    escalator: Escalator
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    seed: int | None
    dry: bool
    closers: list[Callable[[], None]]  # what the App closes: the sessions built here


def assemble(
    config: Config,
    *,
    state: Path,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    config_path: str | None = None,
    seed: int | None = None,
    rules: list[str] | None = None,
    dry: bool = False,
    read_only: bool = False,
    person: bool = False,
    program: str = "fleetgate",
) -> App:
    """The controller `config` describes (see the module docstring). `config_path` names the
    file in errors and commands; `seed` starts a new simulated world; `rules` replaces the
    configured rules paths; `dry` builds everything without opening the journal; `read_only`
    opens an existing journal for reading only (`explain`: gather + plan writes nothing);
    `person`: for a person's command (an answer, `explain`), whose statements wait longer for
    the running controller's writes; `program`: how a shell runs fleetgate, in the commands
    messages print."""
    # urllib3 logs request paths at DEBUG, and a webhook's path is a secret: whoever embeds
    # the controller with DEBUG logging must not leak it
    logging.getLogger("urllib3").setLevel(max(logging.getLogger("urllib3").level, logging.WARNING))
    # what needs no journal comes first; the config's settings go over the rules files' own
    source = RulesSource(_rules(config, config_path, rules), settings=config.settings)
    with building(config_path, "escalation.templates_dir", RenderError):
        renderer = Renderer(config.escalation.templates_dir)
    channels = _channels(config, config_path, state, clock, sleep)
    fresh = not dry and not read_only and config.provider != "sim"
    fresh = fresh and _no_journal_yet(config, state)
    journal = (Journal(":memory:") if dry
               else open_journal(config, state, read_only=read_only, person=person))  # fmt: skip
    if fresh:  # a real fleet's journal made anew: a forgotten --state looks just like this
        log.warning("new journal at %s: this controller has rented nothing yet, so every "
                    "instance on the account is not its own; if fleetgate already runs this "
                    "fleet, stop it and point --state (or state_dir, or journal:) at the "
                    "journal it uses", _journal_where(config, state))  # fmt: skip
    closers: list[Callable[[], None]] = []
    try:
        if not dry:
            # a person's command (explain, an answer) writes no note: the controller's do
            where = _journal_where(config, state)
            same_provider(config, journal, where, mark=not (read_only or person))
        escalator = _escalator(config, config_path, state, journal, renderer, channels, clock,
                               sleep, dry, program)  # fmt: skip
        if isinstance(escalator.reader, LLMClient):
            closers.append(escalator.reader.close)
        parts = Parts(config, state, journal, source, decide_settings(config), escalator, clock,
                      sleep, seed, dry, closers)  # fmt: skip
        with building(config_path, config.provider):
            return PROVIDERS[config.provider](parts)
    except BaseException:
        for close in closers:
            close()
        journal.close()
        raise


# what to do about a rules path the config names that is not there
RULES_HINT = (" (`fleetgate init DIR` writes the shipped rules into DIR/rules, to edit; "
              "without `rules:` the rules installed with the package apply)")  # fmt: skip


def _rules(config: Config, config_path: str | None, cli_paths: list[str] | None) -> list[Path]:
    paths = rules_paths(config, cli_paths)
    if config.rules and not cli_paths:
        for n, path in enumerate(paths):
            if not path.exists():
                raise ConfigError(f"{config_path or '(the defaults)'}: rules.{n}: {str(path)!r} "
                                  f"is neither a rules file nor a folder{RULES_HINT}")  # fmt: skip
    return paths


def _channels(config: Config, config_path: str | None, state: Path, clock: Callable[[], float],
              sleep: Callable[[float], None]) -> list[Channel]:  # fmt: skip
    esc = config.escalation
    token = config.api.token if config.api is not None else None
    seams = ChannelSeams(state=state, file=esc.file, answer_token=token, clock=clock, sleep=sleep)
    return build_channels(esc.channels, seams, config_path)


def _escalator(config: Config, config_path: str | None, state: Path, journal: Journal,
               renderer: Renderer, channels: list[Channel], clock: Callable[[], float],
               sleep: Callable[[float], None], dry: bool,
               program: str = "fleetgate") -> Escalator:  # fmt: skip
    esc = config.escalation
    with building(config_path, "escalation.llm"):
        acting = config.gate.mode == "act" or "act" in config.gate.actions.values()
        # the command that checks it, as people paste it: this controller's --config, --state
        check = f"{cli_prefix(config_path, state, program)} llm-check"
        reader = llm_reader.reader(esc.llm, journal, renderer, clock=clock, sleep=sleep,
                                   enforce_check=not dry, acting=acting, check=check)  # fmt: skip
    unchecked = llm_reader.unchecked(esc.llm, journal, check) if esc.llm and not dry else None
    unread = f"the LLM is {llm_reader.off(esc.llm, check)}" if esc.llm and reader is None else None
    return Escalator(journal, Notifier(channels, renderer), window_s=esc.dedup_window_s,
                     deadline_s=esc.deadline_s, cli_prefix=cli_prefix(config_path, state, program),
                     gate=config.gate, reader=reader, answer_url=answer_url(config),
                     clock=clock, unchecked=unchecked, unread=unread,
                     token_shell=in_shell(config.api.token, TOKEN_SHELL)
                     if config.api else TOKEN_SHELL)  # fmt: skip


def _vast(p: Parts) -> App:
    """provider vast: the fleet path on production's wire, with the injected clock and sleep."""
    c = p.config
    settings = vast_settings(_section(c.vast, "vast"), _section(c.curio, "curio"),
                             _section(c.instances, "instances"))  # fmt: skip
    seams = Seams(requests.Session(), curio_connect, check_many, p.clock, p.sleep)
    p.closers.append(seams.session.close)
    fleet, curio, store, actions = real_fleet(settings, p.journal, p.clock, seams)
    controller = Controller(
        journal=p.journal, provider=fleet, demand=curio, rules=p.rules, settings=p.settings,
        escalator=p.escalator, clock=p.clock, actions=actions, on_gone=on_gone(fleet, actions),
        debounce=settings.debounce,
    )  # fmt: skip
    return App(c, p.state, p.journal, controller, lifecycle=store, dry=p.dry, closers=p.closers)


def _sim(p: Parts) -> App:
    """provider sim: the same fleet path on the simulator's wire (`controller.sim.wire`)."""
    c, journal = p.config, p.journal
    sim = load_sim(journal, c, p.seed)
    agent_settings = AgentSettings.model_validate(c.sim.agents)
    wire = SimWire(sim, agent_settings, (journal.meta.get(AGENTS_KEY) or {}).get("agents"))
    settings = sim_settings(c.sim.world)
    fleet, curio, store, actions = real_fleet(settings, journal, sim.now, wire.seams)
    service = InstanceService(store, sim.now)
    wire.attach(service)
    step = c.sim.seconds_per_tick

    def save() -> None:
        journal.meta.put(SIM_KEY, sim.to_json())
        journal.meta.put(AGENTS_KEY, wire.state())

    def before_tick() -> None:
        # Another controller on this journal ticked the world on since it was read here (this
        # one stood by, or was cut off): go on from the world it saved, not from ours.
        last = journal.meta.last_started()
        saved = journal.meta.get(SIM_KEY) if last is not None and last > sim.now() else None
        if saved is not None and float(saved.get("now", 0.0)) > sim.now():
            behind = sim.now()
            sim.continue_from(saved)
            wire.agent_state = (journal.meta.get(AGENTS_KEY) or {}).get("agents")
            wire.attach(service)
            log.info("sim: went on from the world saved in the journal (%.0f s ahead of this "
                     "controller's)", sim.now() - behind)  # fmt: skip
        wire.before_tick(step)

    controller = Controller(
        journal=journal, provider=fleet, demand=curio, rules=p.rules, settings=p.settings,
        escalator=p.escalator, clock=sim.now, before_tick=before_tick,
        after_tick=save, actions=actions, on_gone=on_gone(fleet, actions),
        debounce=settings.debounce,
    )  # fmt: skip
    app = App(c, p.state, journal, controller, sim, store, wire, dry=p.dry, closers=p.closers)
    app.closers.append(wire.seams.session.close)
    p.escalator.clock = sim.now
    p.escalator.after_write = app.outbox.work  # in the tick: a replay is the same every run
    return app


ProviderBuilder = Callable[[Parts], App]
PROVIDERS: Mapping[str, ProviderBuilder] = {"vast": _vast, "sim": _sim}


def _section(value: T | None, key: str) -> T:
    if value is None:  # the config's own check requires it: this is a guard, not a message
        raise ConfigError(f"the config lacks the section {key!r} its provider needs")
    return value


def load_sim(journal: Journal, config: Config, seed: int | None) -> Simulation:
    """The saved world, or a new one (from --seed, else the config's seed)."""
    saved = journal.meta.get(SIM_KEY)
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


def open_journal(config: Config, state: Path, *, read_only: bool = False,
                 person: bool = False) -> Journal:  # fmt: skip
    """SQLite in the state directory, or the configured PostgreSQL schema (`read_only`: an
    existing SQLite journal, opened so that any write fails; `person`: for a command a
    person runs, which waits longer for the controller's writes than the controller does)."""
    if config.journal is None:
        wait_s = PERSON_WAIT_S if person else WAIT_S
        return Journal(state / "journal.db", read_only=read_only, wait_s=wait_s)
    from controller.store.backend import PostgresStore

    section = config.journal
    return Journal(PostgresStore(section.dsn.get_secret_value(), section.schema_name,
                                 section.connect_timeout_s))  # fmt: skip


def same_provider(config: Config, journal: Journal, where: str, *, mark: bool) -> None:
    """A `JournalError` if the journal records another provider's fleet than the config's
    (a forgotten --config runs the simulator: its listing lacks every real instance, so they
    were recorded as gone and left, still rented, as foreign); else, with `mark`, note the
    config's provider in a journal that has none noted (one from before the note is taken
    to be the config's: a guess from what it holds could refuse the fleet it records)."""
    stored = journal.meta.get(PROVIDER_KEY)
    if stored is not None and stored != config.provider:
        raise JournalError(f"journal ({where}) records the fleet of provider {stored!r}, and "
                           f"the config's provider is {config.provider!r}: give the config "
                           f"that runs it (--config), or another --state (or journal:) for "
                           f"a {config.provider} fleet")  # fmt: skip
    if mark and stored is None:
        journal.meta.put(PROVIDER_KEY, config.provider)


def _no_journal_yet(config: Config, state: Path) -> bool:
    """Whether opening the journal will create it (asked before, creating nothing)."""
    if config.journal is None:
        return not (state / "journal.db").exists()
    from controller.store.backend import PostgresStore

    pg = config.journal
    try:
        return not PostgresStore.holds_journal(pg.dsn.get_secret_value(), pg.schema_name,
                                               pg.connect_timeout_s)  # fmt: skip
    except JournalError:  # opening it says why, at once
        return False


def _journal_where(config: Config, state: Path) -> str:
    if config.journal is None:
        return str((state / "journal.db").absolute())
    from controller.store.backend import PostgresStore

    return PostgresStore.where_of(config.journal.dsn.get_secret_value(), config.journal.schema_name)


def lease(config: Config, journal: Journal) -> Lease:
    """This controller's claim on the leader lease of `journal`."""
    return Lease(journal, config.lease.holder, ttl_s=config.lease.ttl_s,
                 margin_s=config.lease.margin_s)  # fmt: skip


def answer_url(config: Config) -> str | None:
    """Where people reach the HTTP API (links in messages), when it is served."""
    if config.api is None:
        return None
    return config.api.public_url or f"http://{config.api.listen}"


def cli_prefix(config_path: str | None, state: Path, program: str = "fleetgate") -> str:
    """The command people run to answer, with this controller's --config and --state as
    absolute paths: it is pasted from a message into a shell in any directory (the default
    state, `.fleetgate`, is left out: the simulator's lines stay short); `program` is
    fleetgate as a shell finds it (see `initdir.program`)."""
    parts = [program]
    if config_path:
        parts += ["--config", str(Path(config_path).absolute())]
    if str(state) != ".fleetgate":
        parts += ["--state", str(state.absolute())]
    return " ".join(shlex.quote(p) for p in parts)

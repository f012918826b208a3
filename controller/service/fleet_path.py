"""The production fleet path: the vast client and provider, the Curio sensor, the cuzk health
probes and the agent records, built on a wire (`controller.sim.wire.Seams`).

Provider vast builds it on production's wire with the config's settings; provider sim on the
simulator's wire with the settings its simulated vast and Curio answer to (`sim_settings`).
Nothing here reads the clock or sleeps: both come in with the wire.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from controller.core.model import Instance
from controller.core.track import Debounce
from controller.fleet.actions import FleetActions
from controller.fleet.curio import CurioDemand, CurioSettings
from controller.fleet.health import InstancesSettings, own_targets, status_target
from controller.fleet.observe import Health, RealFleet
from controller.fleet.vast import DEFAULT_MIN_INTERVAL_S, VastClient, VastProvider, VastSettings
from controller.sim import wire as sim_wire
from controller.sim.wire import Seams
from controller.store.journal import Journal
from controller.store.records import LifecycleStore

SHARED_TOKEN_ENV = "FLEETGATE_FLEET_TOKEN"  # the opted-in shared token, in every create's env

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FleetSettings:
    """The settings of the fleet path's three adapters."""

    vast: VastSettings
    curio: CurioSettings
    instances: InstancesSettings

    @property
    def debounce(self) -> Debounce:
        """When failed status probes make a daemon down (the controller counts them)."""
        inst = self.instances
        return Debounce(inst.health_failures_to_down, inst.health_down_after_s)


def vast_settings(
    vast: VastSettings, curio: CurioSettings, instances: InstancesSettings
) -> FleetSettings:
    """Provider vast: the config's sections. Each launch gives its instance its own token
    (`FleetActions.launch`); with `instances.shared_token_opt_in` every create also gets the
    shared fleet token, and that weaker set-up is warned about."""
    if instances.fleet_token is None:
        return FleetSettings(vast, curio, instances)
    if not instances.shared_token_opt_in:
        log.warning(
            "instances.fleet_token is ignored: every instance authenticates with its "
            "own token (set instances.shared_token_opt_in: true to accept a shared one)"
        )
        return FleetSettings(vast, curio, instances)
    log.warning(
        "instances.shared_token_opt_in: the instance API also accepts the shared fleet "
        "token, with which any instance can act as any other"
    )
    env = {**vast.secret_env, SHARED_TOKEN_ENV: instances.fleet_token}
    return FleetSettings(vast.model_copy(update={"secret_env": env}), curio, instances)


def sim_settings(world: Mapping[str, Any] | None = None) -> FleetSettings:
    """Provider sim: what the simulated vast and Curio answer to. `world` is the config's
    `sim.world`: Curio counts the task names its `task_weights` give, when it gives them."""
    vast = VastSettings(base_url=sim_wire.VAST_URL, api_key=SecretStr(sim_wire.API_KEY),
                        image=sim_wire.IMAGE, backoff_s=0.0,
                        min_interval_s=dict.fromkeys(DEFAULT_MIN_INTERVAL_S, 0.0))  # fmt: skip
    names = (world or {}).get("task_weights") or {}
    tasks = {"tasks": dict.fromkeys(names, 1.0)} if names else {}
    curio = CurioSettings.model_validate(
        {"dsn": SecretStr(sim_wire.CURIO_DSN), "allow_drain": True, **tasks}
    )
    return FleetSettings(vast, curio, InstancesSettings())


class Launched:
    """Instance id -> launch label of every launch that rented, read from the journal once and
    then only what is new (the instances fleetgate owns, whatever label vast shows).

    An instance that went (`gone`: destroyed, or confirmed gone by vast; vast never reuses an
    id) is forgotten `FORGET_AFTER_S` later, and one that went that long before the journal is
    first read is not read: the map holds the live instances and a day's departures, not
    every launch since the journal began."""

    FORGET_AFTER_S = 86_400.0

    def __init__(self, journal: Journal, clock: Callable[[], float]) -> None:
        self._journal = journal
        self._clock = clock
        self._after = 0
        self._ids: dict[str, str] = {}
        self._gone: deque[tuple[float, str]] = deque()  # (when, id), oldest first
        self._skip: set[str] | None = None  # read once: went long before the first read
        self._open: dict[int, str] = {}  # action id -> label: launches not known to have rented

    def __call__(self) -> dict[str, str]:
        now = self._clock()
        if self._skip is None:
            self._skip = self._journal.fleet.gone_before(now - self.FORGET_AFTER_S)
        for action_id, instance_id, label in self._journal.actions.launched_after(self._after):
            if instance_id not in self._skip:
                self._ids[instance_id] = label
            self._after = action_id
        self._skip = set()  # what is read from now on was launched since: none went long ago
        now_open = self._journal.actions.open_launches()
        settled = sorted(set(self._open) - set(now_open))  # read open; rented since? (late)
        for _, instance_id, label in self._journal.actions.rented_by(settled):
            self._ids[instance_id] = label
        self._open = now_open
        while self._gone and self._gone[0][0] <= now - self.FORGET_AFTER_S:
            self._ids.pop(self._gone.popleft()[1], None)
        return self._ids

    def open_labels(self) -> set[str]:
        """The labels of launches not yet known to have rented (a create answered nothing
        clear, or is under way), as of the last call: an instance listed with one is
        fleetgate's; once one is confirmed, its instance is read as rented."""
        return set(self._open.values())

    def gone(self, instance_id: str) -> None:
        """The instance went: forget it `FORGET_AFTER_S` from now."""
        if instance_id in self._ids:
            self._gone.append((self._clock(), instance_id))


def on_gone(fleet: RealFleet, actions: FleetActions) -> Callable[[str], None]:
    """What the controller does when an instance went: its agent's records are dropped, and
    its launch is forgotten a day later."""

    def gone(instance_id: str) -> None:
        actions.gone(instance_id)
        forget = getattr(fleet.launched, "gone", None)
        if forget is not None:
            forget(instance_id)

    return gone


def real_fleet(
    settings: FleetSettings, journal: Journal, clock: Callable[[], float], seams: Seams
) -> tuple[RealFleet, CurioDemand, LifecycleStore, FleetActions]:
    """(fleet sensor, demand sensor, lifecycle store, fleet actions) on `seams`; `clock` is the
    controller's (the wire's own clock paces the vast client)."""
    inst = settings.instances
    client = VastClient(settings.vast, seams.session, clock=seams.clock, sleep=seams.sleep)
    vast = VastProvider(client, settings.vast)  # missing instances are confirmed one by one
    curio = CurioDemand(settings.curio, connect=seams.curio_connect)
    store = LifecycleStore(journal)

    said: set[tuple[str, ...]] = set()  # groups of instances sharing a status target, warned

    def check_health(instances: Sequence[Instance]) -> Mapping[str, Health]:
        targets = {}
        for i in instances:
            target = status_target(vast.last_raw.get(i.id, {}), inst.health_port)
            if target is not None:
                targets[i.id] = target
        targets, shared = own_targets(targets)
        for group in (tuple(g) for g in shared if tuple(g) not in said):
            said.add(group)
            log.warning("instances %s: vast maps their status ports to one address, whose "
                        "answer is not each one's; their daemons are not probed (health "
                        "unknown)", ", ".join(group))  # fmt: skip
        found: Mapping[str, Health] = seams.check_many(targets, inst.health_timeout_s)
        return found

    launched = Launched(journal, clock)
    fleet = RealFleet(vast=vast, lifecycle=store, curio=curio, check_health=check_health,
                      clock=clock, sidecar_stale_s=inst.sidecar_stale_s,
                      launched=launched, open_labels=launched.open_labels)  # fmt: skip
    actions = FleetActions(vast=vast, lifecycle=store, curio=curio, clock=clock,
                           command_deadline_s=inst.command_deadline_s,
                           node_of=fleet.node_of)  # fmt: skip
    return fleet, curio, store, actions

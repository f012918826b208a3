"""A controller assembled from the config (`controller.service.assemble`), and what the commands
read from it: the HTTP API it serves, its status.

The embedded default (no config) is the built-in simulator on virtual time and SQLite in the
state directory. The simulator's world is saved in the journal after every tick, so consecutive
`fleetgate tick` runs continue the same world.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controller.core.policy import DecideSettings
from controller.service.config import Config
from controller.service.sdnotify import Notifier
from controller.service.status import status_doc
from controller.service.tick import Controller
from controller.sim import Simulation
from controller.store.journal import Journal
from controller.store.records import LifecycleStore
from escalation.outbox import Background, Outbox, step

if TYPE_CHECKING:
    from controller.service.api import Servers
    from controller.service.dashboard import View
    from controller.sim.wire import SimWire

log = logging.getLogger(__name__)


@dataclass
class App:
    config: Config
    state: Path
    journal: Journal
    controller: Controller
    sim: Simulation | None = None
    lifecycle: LifecycleStore | None = None  # the instance records
    wire: SimWire | None = None  # the simulator's wire (provider sim): its seams count calls
    dry: bool = False  # assembled for `check`: the journal is an empty one in memory
    closers: list[Callable[[], None]] = field(default_factory=list)  # the HTTP sessions it owns

    def close(self) -> None:
        try:
            for close in self.closers:
                close()
        finally:
            self.journal.close()

    @cached_property
    def outbox(self) -> Outbox:
        """The worker of the escalation outbox (escalation/outbox.py), with the config's tries."""
        esc = self.config.escalation
        return Outbox(self.controller.escalator, attempts=esc.outbox_attempts,
                      backoff_s=esc.outbox_backoff_s)  # fmt: skip

    def outbox_thread(self) -> Background | None:
        """`fleetgate run`'s worker thread, woken by each write; none when the outbox is worked
        in the tick already (the simulator: `Escalator.after_write`, set by the assembly)."""
        if self.controller.escalator.after_write is not None:
            return None
        worker = Background(self.outbox, self.controller.clock)
        self.controller.escalator.after_write = worker.wake
        return worker

    def outbox_step(self) -> int:
        """`fleetgate tick`: after the tick, the outbox for at most `escalation.outbox_step_s`."""
        return step(self.outbox, self.controller.clock, self.config.escalation.outbox_step_s)

    def notifier(self, environ: dict[str, str] | None = None) -> Notifier:
        """systemd's notify socket for `fleetgate run` (a no-op outside `Type=notify`); a
        watchdog that a tick interval could outlast is logged, as the unit then restarts a
        healthy controller."""
        notify = Notifier.from_env(environ)
        wd = notify.watchdog_s
        if notify.enabled and wd is not None and wd <= self.config.interval_s:
            log.warning("the systemd watchdog (%.0f s) is not longer than interval_s (%.0f s): "
                        "WatchdogSec= must exceed interval_s plus the longest tick", wd,
                        self.config.interval_s)  # fmt: skip
        return notify

    def serve_api(self) -> Servers | None:
        """Start the HTTP API when the config names one; returns the servers (stop() them).
        The instance API is on `api.instance_listen` when given, else beside the operator's."""
        api = self.config.api
        if api is None:
            return None
        if self.dry:
            raise RuntimeError("a dry assembly (fleetgate check) serves nothing")
        from controller.service.api import Server, Servers, create_app, create_instance_app

        routers = []
        if self.lifecycle is not None and self.config.instances is not None:
            from controller.fleet.instance_api import instance_router

            inst = self.config.instances
            shared = inst.fleet_token if inst.shared_token_opt_in else None
            routers.append(instance_router(self.lifecycle, shared, self.controller.clock))
        apart = api.instance_listen is not None
        app = create_app(self.journal, api.token, self.controller.clock,
                         on_answer=self.controller.escalator.closed,
                         status=lambda: status(self), routers=() if apart else routers,
                         view=self.view())  # fmt: skip
        servers = Servers(Server(app, *_address(api.listen)))
        if api.instance_listen is not None:
            servers.instances = Server(
                create_instance_app(routers),
                *_address(api.instance_listen),
                key="api.instance_listen",
            )
        servers.start()
        host = _address(api.listen)[0]
        log.info("HTTP API on http://%s:%d (answers: POST /v1/escalations/ID/answer)", host,
                 servers.port)  # fmt: skip
        if servers.instances is not None:
            log.info("instance API on http://%s:%d", _address(api.instance_listen or "")[0],
                     servers.instance_port)  # fmt: skip
        return servers

    def view(self) -> View:
        """What the pages and /readyz read of this controller besides the journal."""
        from controller.service.dashboard import View
        from controller.store.lease import default_holder

        # ticks are judged by the controller's clock: on the simulator a virtual one, which a
        # tick advances by seconds_per_tick whatever the (real) interval between ticks
        interval = self.config.interval_s if self.sim is None else self.config.sim.seconds_per_tick
        return View(interval_s=interval, ttl_s=self.config.lease.ttl_s,
                    holder=self.config.lease.holder or default_holder(),
                    guards=self.config.guards, rulebook=lambda: self.controller.rules.book,
                    public_url=self.config.api.public_url if self.config.api else None,
                    how=self.controller.escalator.how)  # fmt: skip


def _address(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host, int(port)


def decide_settings(config: Config) -> DecideSettings:
    values = {**DecideSettings().values, **config.settings}
    return DecideSettings(gate=config.gate, guards=config.guards, values=values,
                          autonomy=config.autonomy)  # fmt: skip


def status(app: App) -> dict[str, Any]:
    """What `fleetgate status` shows (`controller.service.status`), as this controller sees it."""
    return status_doc(
        app.journal, now=app.controller.clock(), provider=app.config.provider,
        paused=app.config.guards.paused, rules=app.controller.rules.book.digest,
        ttl_s=app.config.lease.ttl_s, sim=app.sim.stats if app.sim else None,
    )  # fmt: skip

"""What the controller does to its real fleet: vast's calls, the agents' commands, Curio's
drain. The actuator (`controller.fleet.actuator`) calls these; the sensor
(`controller.fleet.observe.RealFleet`) never does.

- launch, destroy, reboot, find_by_label: vast (a reboot also closes the agent's commands that
  nobody picked up: the shipped rule reboots on `command_overdue_s`); every launch issues the
  instance its own token (`controller.store.instance_tokens`), in its environment at create as
  FLEETGATE_INSTANCE_TOKEN, bound to the launch label and to the vast id the create returns;
- restart_daemon: a command queued for the instance's agent (pulled on its next heartbeat);
  without a registered agent, a vast reboot at once;
- drain, undrain: Curio's `unschedulable` on the instance's node (the one the sensor linked),
  set and cleared;
- stop, start: vast's `PUT /api/v0/instances/{id}/` with `{"state": "stopped"|"running"}`
  (parking: the disk is kept, storage billed; the journal's action rows say fleetgate did it);
- gone: an instance vanished from vast: its agent's records are dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from controller.core.model import Instance
from controller.fleet.base import (
    CreateOutcomeUnknown,
    LaunchRequest,
    PermanentProviderError,
    ProviderError,
    SensorError,
)
from controller.store.instance_tokens import TOKEN_ENV

log = logging.getLogger(__name__)


class FleetActions:
    """The acting half of a vast fleet with Curio nodes and fleetgate agents."""

    def __init__(self, *, vast: Any, lifecycle: Any, curio: Any, clock: Callable[[], float],
                 command_deadline_s: float = 300.0,
                 node_of: Callable[[str], str | None] = lambda _id: None) -> None:  # fmt: skip
        self.vast = vast
        self.lifecycle = lifecycle
        self.curio = curio
        self.node_of = node_of  # instance id -> the Curio node the sensor linked to it
        self.clock = clock
        self.command_deadline_s = command_deadline_s

    def launch(self, request: LaunchRequest) -> str:
        """Rent one instance with its own token in its environment. A create that surely
        failed revokes the token; one whose outcome is unknown keeps it (it may be renting)."""
        tokens = self.lifecycle.tokens
        token = tokens.issue(request.label, self.clock())
        try:
            instance_id = str(self.vast.launch(replace(request, env=((TOKEN_ENV, token),))))
        except CreateOutcomeUnknown:
            raise
        except ProviderError:
            tokens.revoke(request.label)
            raise
        tokens.bind(request.label, instance_id)
        return instance_id

    def find_by_label(self, label: str) -> Instance | None:
        found: Instance | None = self.vast.find_by_label(label)
        return found

    def destroy(self, instance_id: str) -> None:
        self.vast.destroy(instance_id)

    def reboot(self, instance_id: str) -> None:
        """Reboot through vast; the agent's commands nobody picked up are closed with it."""
        self.vast.reboot(instance_id)
        record = self.lifecycle.resolve(instance_id)
        if record is None:
            return
        now = self.clock()
        for cmd in self.lifecycle.overdue_commands(now):
            if cmd.label == record.label:
                result = {"ok": False, "detail": "not picked up in time: the instance rebooted"}
                self.lifecycle.complete(cmd.id, result, now)

    def restart_daemon(self, instance_id: str) -> None:
        """Queue it for the agent; without a registered agent, reboot through vast at once."""
        record = self.lifecycle.resolve(instance_id)
        if record is None:
            log.warning("instance %s has no registered agent: rebooting it instead", instance_id)
            self.vast.reboot(instance_id)
            return
        self.lifecycle.queue_command(record.label, "restart_daemon", self.clock(),
                                     self.command_deadline_s)  # fmt: skip

    def stop(self, instance_id: str) -> None:
        """Park the instance: vast stops it and keeps its disk."""
        self.vast.stop(instance_id)

    def start(self, instance_id: str) -> None:
        """Start a parked instance: it serves again from its disk, without a new boot."""
        self.vast.start(instance_id)

    def drain(self, instance_id: str) -> None:
        """Set `unschedulable` on the instance's own Curio node: it takes no new tasks."""
        self._cordon(instance_id, True)

    def undrain(self, instance_id: str) -> None:
        """Clear `unschedulable` on the instance's own Curio node: it takes tasks again."""
        self._cordon(instance_id, False)

    def _cordon(self, instance_id: str, drained: bool) -> None:
        """On the node the sensor linked to the instance (`node_of`), never on the host:port
        its agent names, which may be another's node."""
        node = self.node_of(instance_id)
        if not node:
            raise PermanentProviderError(f"instance {instance_id!r} has no known Curio node")
        verb = "drain" if drained else "undrain"
        try:
            (self.curio.drain if drained else self.curio.undrain)(node)
        except SensorError as exc:  # not allowed, no such node, or Curio unreachable
            raise PermanentProviderError(f"cannot {verb} instance {instance_id!r}: {exc}") from exc

    def gone(self, instance_id: str) -> None:
        """The controller saw this instance vanish from vast: drop what its agent reported."""
        record = self.lifecycle.resolve(instance_id)
        if record is not None:
            self.lifecycle.forget(record.label)

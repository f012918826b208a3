"""One simulated rented instance: its visible state and its scheduled future.

Every future change is a timestamp field (`stage_until`, `death_at`, ...) drawn when the cause
arises; the world applies whichever is due first. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

# Scheduled event kinds, in the order they are applied when due at the same moment.
EVENT_FIELDS = (
    ("release", "release_at"),  # tasks of a lost node go back to the queue (Curio timeout)
    ("reboot_end", "reboot_until"),
    ("start", "start_at"),  # a start's wait for the host's GPUs ends: loading begins
    ("restart", "restart_at"),  # the daemon comes back after restart_daemon
    ("stage", "stage_until"),  # the current lifecycle stage ends
    ("death", "death_at"),  # the daemon dies (silently, or on a crash-loop host)
    ("exit", "exit_at"),
    ("offline", "offline_at"),
    ("frozen", "frozen_at"),
)

LOST_STATUSES = ("exited", "offline", "frozen")


@dataclass
class SimInstance:
    """A live (not destroyed) instance in the simulated world."""

    id: str
    label: str
    machine_id: str
    launched_at: float
    durations: dict[str, float]  # lifecycle stage -> seconds it lasts (drawn at launch)
    bench_factor: float  # measured bench_rate = machine rate x this
    stuck: str = ""  # the stage it sticks in forever ("loading", "params", "bench"), "" if none
    status_closed: bool = False  # cuzk's status server does not answer from outside
    status: str = "provisioning"
    stage: str = "provisioning"
    daemon: str = "down"
    sidecar: str = "down"
    sidecar_seen_at: float | None = None  # last time its Curio node was up (its last_contact)
    drained: bool = False
    bench_rate: float | None = None
    status_msg: str = ""
    daemon_started_at: float | None = None
    stage_left: float | None = None  # stage time left when a reboot paused it
    release_at: float | None = None
    reboot_until: float | None = None
    restart_at: float | None = None
    stage_until: float | None = None
    death_at: float | None = None
    exit_at: float | None = None
    offline_at: float | None = None
    frozen_at: float | None = None
    start_at: float | None = None
    # stopped (vast's stop): the GPU is not billed, the disk is (storage); since when, and the
    # seconds of earlier stops
    stopped_at: float | None = None
    stopped_s: float = 0.0

    def next_event(self) -> tuple[float, str] | None:
        """The earliest scheduled (time, kind), ties broken by EVENT_FIELDS order."""
        best: tuple[float, str] | None = None
        fields = self.__dict__  # (a hot loop: the world asks every instance every step)
        for kind, name in EVENT_FIELDS:
            when = fields[name]
            if when is not None and (best is None or when < best[0]):
                best = (when, kind)
        return best

    def clear_schedule(self) -> None:
        """Forget every scheduled event (the instance stops changing by itself)."""
        for _, name in EVENT_FIELDS:
            setattr(self, name, None)

    def clear_faults(self) -> None:
        """Forget the status hazards (they apply only while the status is running)."""
        self.exit_at = self.offline_at = self.frozen_at = None

    def uptime(self, now: float) -> float | None:
        """Seconds since the daemon last started, None unless it is up."""
        if self.daemon != "up" or self.daemon_started_at is None:
            return None
        return max(0.0, now - self.daemon_started_at)

    def billed_s(self, now: float) -> float:
        """Seconds billed at the machine's price so far: from launch until `now` (destroy ends
        billing), less the time stopped (`storage_s`)."""
        return max(0.0, now - self.launched_at - self.storage_s(now))

    def storage_s(self, now: float) -> float:
        """Seconds stopped so far, billed at the storage price only."""
        current = 0.0 if self.stopped_at is None else max(0.0, now - self.stopped_at)
        return self.stopped_s + current

    def resume_billing(self, now: float) -> None:
        """The stop ends (its GPUs are the instance's again): the machine's price bills again."""
        if self.stopped_at is not None:
            self.stopped_s += max(0.0, now - self.stopped_at)
            self.stopped_at = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SimInstance:
        return cls(**data)

"""The provider interface and its error family.

ProviderError
 ├── TemporaryProviderError   retry later (429, 5xx, timeouts)
 │    └── CreateOutcomeUnknown   a create may or may not have happened: never retry it,
 │                               look for its label in later listings
 └── PermanentProviderError   do not retry (bad request, offer gone, auth)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from controller.core.model import Demand, Instance


class ProviderError(Exception):
    """A fleet operation failed."""


class TemporaryProviderError(ProviderError):
    """Worth retrying on a later tick."""


class NotDone(TemporaryProviderError):
    """Worth retrying, and certainly not done: refused before acting (429) or never sent."""


class CreateOutcomeUnknown(TemporaryProviderError):
    """The create request may have reached the provider; whether it rented is unknown."""

    def __init__(self, label: str, detail: str) -> None:
        super().__init__(
            f"launch {label!r}: the outcome is unknown ({detail}); it will be looked for by its "
            "label, never created again"
        )
        self.label = label


class PermanentProviderError(ProviderError):
    """Retrying will not help."""


class SensorError(Exception):
    """Sensing failed: the reading is unknown, never 'empty'."""


class StaleReading(SensorError):
    """The sensor answered, but what it read is too old to act on (stale, not failed)."""


@dataclass(frozen=True)
class LaunchRequest:
    label: str  # unique per launch: the idempotency key
    exclude_machines: frozenset[str] = frozenset()
    prefer_rates: tuple[tuple[str, float], ...] = ()  # (machine_id, measured proofs/hour)
    max_dph: float | None = None
    # what this launch alone puts in the instance's environment (its own token): never shown
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False, compare=False)


class Actuated(Protocol):
    """What the controller does to a fleet. Every call may raise ProviderError."""

    def launch(self, request: LaunchRequest) -> str:
        """Rent one instance labelled `request.label`; returns its id. Never retried blindly."""
        ...

    def find_by_label(self, label: str) -> Instance | None: ...

    def destroy(self, instance_id: str) -> None: ...

    def reboot(self, instance_id: str) -> None: ...

    def restart_daemon(self, instance_id: str) -> None: ...

    def drain(self, instance_id: str) -> None:
        """Mark the instance's Curio node unschedulable (it takes no new tasks)."""
        ...

    def undrain(self, instance_id: str) -> None:
        """Clear the instance's Curio node's unschedulable mark (it takes tasks again)."""
        ...


class Parks(Protocol):
    """A fleet whose instances can be parked (vast's stop and start); the actuator calls these
    only on a provider that has them (a `stop` or `start` on one without fails, journaled)."""

    def stop(self, instance_id: str) -> None:
        """Stop the instance: its disk is kept and bills storage only."""
        ...

    def start(self, instance_id: str) -> None:
        """Start a stopped instance (it may wait for its host's GPUs: "scheduling")."""
        ...


class Provider(Actuated, Protocol):
    """A fleet that is both read and acted on (the simpler fleets and the test fakes); the real
    fleet splits the two (`RealFleet` reads, `FleetActions` acts)."""

    def list_instances(self) -> list[Instance]: ...


class Sensed(Protocol):
    """What the controller reads of a fleet."""

    def list_instances(self) -> list[Instance]: ...


class DemandSensor(Protocol):
    def demand(self) -> list[Demand]:
        """Pending/running per task name plus a `task="all"` total. Raises SensorError."""
        ...

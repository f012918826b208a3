"""What the vast account holds beside the world's own instances, as vast's API shows them.

Instances on the account that fleetgate did not launch ("foreign"), labels set through the API,
creates that vast does not list yet, and the wire's call counter; plus vast's stop and start of
a world instance's container. Saved in the world's JSON state.

Every draw here is a hash of the world's `salt` (see `unit`), never the world's RNG, so turning
these features on changes no other draw. Must not decide anything about the fleet; no I/O, no
clock: times are passed in.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from controller.fleet.base import PermanentProviderError
from controller.sim import instance_life as lifecycle
from controller.sim.config import SimConfig
from controller.sim.instance import SimInstance
from controller.sim.instance_life import Effect

log = logging.getLogger(__name__)

FOREIGN_FIRST_ID = 9001  # foreign instances predate fleetgate's (which start at 10001)
FOREIGN_LABELS = ("jupyter", "", "old-prover")  # every third one is stopped


@dataclass
class ForeignInstance:
    """An instance of the account that fleetgate did not launch; it never changes by itself."""

    id: str
    label: str
    machine_id: str
    status: str  # "running" or "stopped"
    start_date: float


@dataclass
class Account:
    """The account's vast-only state (see the module docstring)."""

    salt: int = 0
    foreign: dict[str, ForeignInstance] = field(default_factory=dict)
    api_labels: dict[str, str] = field(default_factory=dict)  # labels set through the API
    hidden_until: dict[str, float] = field(default_factory=dict)  # creates not listed yet
    # the fleetgate settings each create put in its container's environment (FLEETGATE_*):
    # what the instance's agent reads, as a real container's does
    env: dict[str, dict[str, str]] = field(default_factory=dict)
    wire_calls: int = 0
    foreign_destroyed: int = 0

    @classmethod
    def create(
        cls, config: SimConfig, machine_ids: Iterable[str], salt: int, start: float
    ) -> Account:
        """A new account: `config.foreign_instances` foreign instances on hashed machines."""
        chosen = sorted(machine_ids, key=lambda m: unit(salt, m, "foreign"))
        foreign = {}
        for k, machine_id in enumerate(chosen[: config.foreign_instances]):
            iid = str(FOREIGN_FIRST_ID + k)
            status = "stopped" if k % 3 == 2 else "running"
            label = FOREIGN_LABELS[k % 3]
            when = start - 86400.0 * (1 + k) - 3600.0 * unit(salt, iid, "start")
            foreign[iid] = ForeignInstance(iid, label, machine_id, status, when)
        return cls(salt=salt, foreign=foreign)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Account:
        """The account of a saved state; an empty one for states saved before it existed."""
        if not data:
            return cls()
        foreign = {k: ForeignInstance(**v) for k, v in data["foreign"].items()}
        env = {k: dict(v) for k, v in (data.get("env") or {}).items()}
        return cls(**{**data, "foreign": foreign, "api_labels": dict(data["api_labels"]),
                      "hidden_until": dict(data["hidden_until"]), "env": env})  # fmt: skip

    def busy_machines(self) -> frozenset[str]:
        """Machines held by foreign instances (not offered)."""
        return frozenset(f.machine_id for f in self.foreign.values())

    def hidden(self, instance_id: str, now: float) -> bool:
        """True while vast does not list a fresh create yet."""
        until = self.hidden_until.get(instance_id)
        if until is None:
            return False
        if now >= until:
            del self.hidden_until[instance_id]
            return False
        return True

    def api_label(self, instance_id: str, label: str, empty_fraction: float) -> str:
        """The label vast's API shows for a world instance whose container label is `label`."""
        shown = self.api_labels.get(instance_id)
        if shown is not None:
            return shown
        if empty_fraction > 0 and unit(self.salt, instance_id, "label") < empty_fraction:
            return ""
        return label

    def forget(self, instance_id: str) -> None:
        """A world instance was destroyed: drop what the account kept about it."""
        self.api_labels.pop(instance_id, None)
        self.hidden_until.pop(instance_id, None)
        self.env.pop(instance_id, None)

    def keep_env(self, instance_id: str, env: object) -> None:
        """What of a create's `env` the container's agent reads (the FLEETGATE_* strings)."""
        if isinstance(env, dict):
            kept = {
                k: v
                for k, v in env.items()
                if isinstance(k, str) and k.startswith("FLEETGATE_") and isinstance(v, str)
            }
            if kept:
                self.env[instance_id] = kept

    def destroy_foreign(self, instance_id: str) -> None:
        """Somebody destroyed an instance fleetgate does not own (counted for the tests)."""
        del self.foreign[instance_id]
        self.foreign_destroyed += 1
        log.warning("sim: foreign instance %s destroyed through the API", instance_id)


def unit(salt: int, *parts: str) -> float:
    """A number in [0, 1) fixed by `salt` and `parts`: a hash, no RNG state."""
    key = ":".join((str(salt), *parts)).encode()
    return zlib.crc32(key) / 4294967296.0


def salt_of(rng: random.Random) -> int:
    """A number fixed by the RNG's current state (so by the seed), without drawing from it."""
    digest = hashlib.blake2b(repr(rng.getstate()).encode(), digest_size=6).digest()
    return int.from_bytes(digest, "big")


def stop(inst: SimInstance, now: float, config: SimConfig, salt: int) -> Effect:
    """vast's stop: the container stops (stage, parameters and benchmark kept on its disk), its
    tasks go back to pending, the machine's price stops and storage bills. A stopped machine
    may be lost (`stopped_loss_per_h`): the instance exits, for good."""
    if inst.status == "stopped":
        return ""
    if inst.status != "running":
        raise PermanentProviderError(f"instance {inst.id!r} is {inst.status}: cannot stop")
    inst.stage_left = None if inst.stage_until is None else inst.stage_until - now
    inst.clear_schedule()
    inst.status, inst.status_msg = "stopped", ""
    inst.daemon = inst.sidecar = "down"
    inst.daemon_started_at = None
    inst.stopped_at = now
    inst.exit_at = _hazard_time(now, config.stopped_loss_per_h, salt, inst.id, "lost", now)
    return "release"


def start(inst: SimInstance, now: float, config: SimConfig, salt: int) -> Effect:
    """vast's start of a stopped container. When someone else rented the host's GPUs while it
    was stopped (`start_wait_per_h` per hour stopped) it waits for them ("scheduling", status
    still stopped) for a time drawn from `start_wait_s`; then it loads for `start_s` and runs
    as after a reboot. A node stopped past Curio's timeout comes back as a new, uncordoned one.
    Draws are hashes of the account's salt (see `unit`), never the world's RNG."""
    if inst.status != "stopped" or inst.start_at is not None:
        return ""
    stopped_s = 0.0 if inst.stopped_at is None else now - inst.stopped_at
    key = (inst.id, f"{inst.stopped_at}")
    lo, hi = config.start_s
    inst.durations["start"] = lo + (hi - lo) * unit(salt, *key, "load")
    if stopped_s > config.curio_machine_timeout_s:
        inst.drained = False
    taken = 1.0 - math.exp(-config.start_wait_per_h * stopped_s / 3600.0)
    if unit(salt, *key, "taken") < taken:
        lo, hi = config.start_wait_s
        inst.start_at = now + lo + (hi - lo) * unit(salt, *key, "wait")
        inst.status_msg = "scheduling: waiting for the host's GPUs"
        return ""
    lifecycle.begin_start(inst, now)
    return ""


def _hazard_time(now: float, rate_per_h: float, salt: int, *parts: object) -> float | None:
    """When an event of hazard `rate_per_h` strikes after `now` (a hashed draw), or None."""
    if rate_per_h <= 0:
        return None
    u = unit(salt, *(str(p) for p in parts))
    return now - math.log(1.0 - u) * 3600.0 / rate_per_h

"""`Simulation`: a virtual clock, a seeded RNG and a world, saved and restored as JSON.

Deterministic: the same config, seed and sequence of calls give the same world, and a
simulation restored from `to_json()` continues exactly as the original would have.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from controller.sim.clock import VirtualClock
from controller.sim.config import SimConfig
from controller.sim.world import World

DEFAULT_START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
FORMAT_VERSION = 1


class Simulation:
    """A simulated fleet and proving queue driven by a virtual clock."""

    def __init__(self, config: SimConfig, seed: int, start: float = DEFAULT_START) -> None:
        self._config = config
        self._seed = seed
        self._clock = VirtualClock(start)
        self._rng = random.Random(seed)
        self._world = World.create(config, self._rng, start)

    @property
    def config(self) -> SimConfig:
        return self._config

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def world(self) -> World:
        """The world itself (for the provider adapter; tests should use `provider`)."""
        return self._world

    @property
    def stats(self) -> dict[str, Any]:
        """spend_usd, gpu_hours, task counts, waits_s {count, p50, p95, max}, instance counts."""
        return self._world.stats(self.now())

    def now(self) -> float:
        """Virtual epoch seconds."""
        return self._clock.now()

    def advance(self, seconds: float, on_step: Callable[[float], None] | None = None) -> None:
        """Move time and the world forward in sub-steps of at most `config.step_s`;
        `on_step(t)` runs after each (the instances' agents act then, at virtual time t)."""
        if seconds < 0:
            raise ValueError(f"cannot advance by {seconds!r} s")
        target = self.now() + seconds
        t = self.now()
        while t < target:
            t = min(t + self._config.step_s, target)
            self._world.step(t)
            self._clock.set(t)
            if on_step is not None:
                on_step(t)

    def to_json(self) -> dict[str, Any]:
        """The whole state as JSON-serializable data (lists, dicts, numbers, strings, None)."""
        version, internal, gauss_next = self._rng.getstate()
        return {
            "version": FORMAT_VERSION,
            "config": self._config.model_dump(mode="json"),
            "seed": self._seed,
            "now": self.now(),
            "rng": [version, list(internal), gauss_next],
            "world": self._world.to_json(),
        }

    def continue_from(self, data: Mapping[str, Any]) -> None:
        """Take on the state `data` describes (as `from_json` reads it), in place: what was
        built over this simulation and its world (the vast API, Curio's rows, the probes, the
        agents) goes on over the new state."""
        new = Simulation.from_json(data)
        self._world.__dict__.update(new._world.__dict__)  # the same object, the new state
        self._config, self._seed, self._clock, self._rng = (new._config, new._seed,
                                                            new._clock, new._rng)  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Simulation:
        """A simulation in the state `to_json()` described; ValueError if it is not one."""
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"unsupported simulation state version {data.get('version')!r}")
        sim = cls.__new__(cls)
        sim._config = SimConfig.model_validate(data["config"])
        sim._seed = int(data["seed"])
        sim._clock = VirtualClock(float(data["now"]))
        version, internal, gauss_next = data["rng"]
        sim._rng = random.Random()
        sim._rng.setstate((version, tuple(internal), gauss_next))
        sim._world = World(sim._config, sim._rng, data["world"])
        return sim

"""The simulated offer market: host machines, drawn once from the seed, and offer choice.

Pure: functions take the RNG and data and return data.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from controller.sim.config import SimConfig

GOOD_RATE = 20.0  # proofs/h: a known measured rate at least this good is preferred


@dataclass(frozen=True)
class Machine:
    """A host that can be rented; `rate` and `crash_loop` are the hidden truth."""

    machine_id: str
    host_id: str
    gpu_name: str
    num_gpus: int
    dph: float
    rate: float
    crash_loop: bool
    storage_per_gb_h: float = 0.0  # $/GB-hour while an instance on it is stopped

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Machine:
        return cls(**data)


def generate_machines(config: SimConfig, rng: random.Random) -> list[Machine]:
    """Draw `config.machines` machines; ids are "m000", "m001", ... and hosts "h000", ..."""
    return [_draw_machine(i, config, rng) for i in range(config.machines)]


def _cheapness(dph: float, price_range: tuple[float, float]) -> float:
    """0 for the dearest possible price, 1 for the cheapest."""
    lo, hi = price_range
    return 0.5 if hi <= lo else min(max((hi - dph) / (hi - lo), 0.0), 1.0)


def _skewed(fraction: float, cheapness: float) -> float:
    """Chance that a machine is bad, leaning toward cheap machines as on a real market.

    `1 - (1 - f) ** (2c)`: `f` at the middle price, about `2f` at the cheapest, 0 at the
    dearest; 0 and 1 stay exact (a fraction of 1.0 still makes every machine bad).
    """
    return float(1.0 - (1.0 - fraction) ** (2.0 * cheapness))


def _draw_machine(index: int, config: SimConfig, rng: random.Random) -> Machine:
    gpu_name = rng.choice(config.gpu_names)
    dph = round(rng.uniform(*config.dph_range), 3)
    cheapness = _cheapness(dph, config.dph_range)
    slow = rng.random() < _skewed(config.slow_host_fraction, cheapness)
    rate = rng.uniform(*(config.slow_rate_range if slow else config.fast_rate_range))
    crash_loop = rng.random() < _skewed(config.crash_loop_host_fraction, cheapness)
    return Machine(
        machine_id=f"m{index:03d}",
        host_id=f"h{index:03d}",
        gpu_name=gpu_name,
        num_gpus=1,
        dph=dph,
        rate=round(rate, 2),
        crash_loop=crash_loop,
        storage_per_gb_h=_storage_price(index, config),
    )


def _storage_price(index: int, config: SimConfig) -> float:
    """The machine's storage price: a hash of its index, not a draw (the RNG's sequence, and
    so every other machine's and instance's draw, stays as it was)."""
    lo, hi = config.storage_price_range
    return round(lo + (hi - lo) * zlib.crc32(f"storage:{index}".encode()) / 4294967296.0, 6)


def choose_machine(
    machines: Iterable[Machine],
    *,
    busy: frozenset[str],
    exclude: frozenset[str],
    prefer_rates: Mapping[str, float],
    max_dph: float | None,
) -> Machine | None:
    """The best rentable machine, or None.

    Rentable: not `busy` (a live instance is on it), not excluded, not above `max_dph`.
    Ranking: machines with a known rate >= GOOD_RATE first (best rate per dollar first), then
    machines without a known rate, then known slow ones; within a tier the cheapest first.
    """
    candidates = [
        m
        for m in machines
        if m.machine_id not in busy
        and m.machine_id not in exclude
        and (max_dph is None or m.dph <= max_dph)
    ]
    if not candidates:
        return None
    return min(candidates, key=lambda m: _rank(m, prefer_rates))


def _rank(machine: Machine, prefer_rates: Mapping[str, float]) -> tuple[int, float, float, str]:
    known = prefer_rates.get(machine.machine_id)
    if known is None:
        return (1, 0.0, machine.dph, machine.machine_id)
    if known >= GOOD_RATE:
        return (0, -known / max(machine.dph, 1e-9), machine.dph, machine.machine_id)
    return (2, 0.0, machine.dph, machine.machine_id)

"""The oracle with stop and start: a gap between two needs of one level costs the least of
idling through it, a new boot, and storage for the gap plus a start's loading time. It is
never dearer than the oracle that only rents and destroys, and equals it when stopping does
not pay. Costs are worked out by hand in the comments.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace

import pytest

from controller.sim.trace import TraceTask
from controller.tools.replay import baselines
from controller.tools.replay.results import BaselineParams


def params(**changes: float | int | None) -> BaselineParams:
    # 3.6 $/h: $0.001 per instance-second; storage at a tenth of the instance's price
    base = {"boot_s": 300.0, "dph": 3.6, "slots": 1, "tasks_per_instance": 1,
            "horizon_s": 10_000.0, "deadline_s": 60.0, "sample_s": 100.0,
            "start_s": 30.0, "storage_dph": 0.36}  # fmt: skip
    return BaselineParams(**{**base, **changes})  # type: ignore[arg-type]


def test_a_long_gap_is_spent_stopped_not_rebooted() -> None:
    # one task at 0 for 100 s, another at 2100 for 100 s: a gap of 2000 s
    trace = [TraceTask(0.0, 100.0), TraceTask(2100.0, 100.0)]
    cold = baselines.oracle(trace, params())
    # rent and destroy: a boot, 100 s, the gap (2000 > 300) is a second boot, 100 s
    assert cold.instance_s == pytest.approx(300 + 100 + 300 + 100)
    assert cold.instances_started == 2
    warm = baselines.oracle(trace, params(), warm=True)
    # stopped through the gap: 1970 s of storage at a tenth (197), then a 30 s start
    assert warm.instance_s == pytest.approx(300 + 100 + 197 + 30 + 100)
    assert warm.instances_started == 1 and warm.notes["starts_from_stopped"] == 1
    assert warm.name == "oracle_warm" and warm.cost_usd < cold.cost_usd


def test_a_short_gap_idles_and_a_gap_too_long_to_store_reboots() -> None:
    short = [TraceTask(0.0, 100.0), TraceTask(120.0, 100.0)]  # 20 s idle beats a 30 s start
    assert baselines.oracle(short, params(), warm=True).instance_s == pytest.approx(300 + 220)
    # storage at half the price: a gap of 2000 s stored (985 + 30) costs more than a boot
    long = [TraceTask(0.0, 100.0), TraceTask(2100.0, 100.0)]
    out = baselines.oracle(long, params(storage_dph=1.8), warm=True)
    assert out.instance_s == pytest.approx(300 + 100 + 300 + 100)
    assert out.notes["starts_from_stopped"] == 0 and out.instances_started == 2


def test_without_a_start_time_the_warm_oracle_is_the_oracle() -> None:
    trace = [TraceTask(0.0, 100.0), TraceTask(2100.0, 100.0)]
    plain = baselines.oracle(trace, params(start_s=None))
    warm = baselines.oracle(trace, params(start_s=None), warm=True)
    assert warm.instance_s == plain.instance_s and warm.instances_started == 2


def random_cases(seed: int, n: int = 30) -> Iterator[tuple[random.Random, list[TraceTask],
                                                             BaselineParams]]:  # fmt: skip
    """`n` random traces of 1 to 40 tasks, each with random slots and cap, and the generator
    (for a case's further draws)."""
    rng = random.Random(seed)
    for _ in range(n):
        trace = sorted((TraceTask(rng.uniform(0, 8000), rng.uniform(10, 900))
                        for _ in range(rng.randint(1, 40))), key=lambda t: t.arrival_s)  # fmt: skip
        yield rng, trace, params(slots=rng.choice([1, 2]), max_instances=rng.choice([None, 3]))


def test_the_warm_oracle_is_never_dearer_and_waits_the_same() -> None:
    for _, trace, p in random_cases(11):
        cold, warm = baselines.oracle(trace, p), baselines.oracle(trace, p, warm=True)
        assert warm.instance_s <= cold.instance_s + 1e-9
        assert warm.waits == cold.waits and warm.peak_instances == cold.peak_instances


def test_at_ticks_the_fleet_bills_whole_ticks_and_a_stop_and_start_are_two_ticks_apart() -> None:
    # as in the simulator, every rent, destroy, stop and start happens at a tick (60 s here)
    trace = [TraceTask(0.0, 100.0), TraceTask(2100.0, 100.0)]
    ticked = params(tick_s=60.0)
    cold = baselines.oracle(trace, ticked)
    # needed in ticks [0, 120) and [2100, 2220): each need bills 2 whole ticks (120, not 100);
    # the second is rented at 1800, one boot before 2100 (idling 1980 s would cost more)
    assert cold.instance_s == pytest.approx(300 + 120 + 300 + 120)
    assert cold.instances_started == 2 and cold.notes["tick_s"] == 60.0
    warm = baselines.oracle(trace, ticked, warm=True)
    # stopped at 120, started at 2040 (the last tick at least 30 s before 2100): storage for
    # 1920 s at a tenth (192) and the tick it loads in billed whole (60)
    assert warm.instance_s == pytest.approx(300 + 120 + 192 + 60 + 120)
    assert warm.notes["starts_from_stopped"] == 1
    # a need 30 s into its tick is served by a start at the tick's beginning
    late = [TraceTask(0.0, 100.0), TraceTask(2130.0, 60.0)]
    assert baselines.oracle(late, ticked, warm=True).instance_s == pytest.approx(
        300 + 120 + 198 + 120
    )


def test_a_gap_too_short_for_a_stop_and_a_start_idles() -> None:
    # off at 120, needed again at 200: a stop at 120 and a start at 180 are two ticks, but a
    # start at 180 loads until 210, after 200; so the gap idles (60 s), never stopped
    trace = [TraceTask(0.0, 100.0), TraceTask(200.0, 100.0)]
    out = baselines.oracle(trace, params(tick_s=60.0), warm=True)
    assert out.instance_s == pytest.approx(300 + 120 + 60 + 120)  # [0,120) [120,180) [180,300)
    assert out.notes["starts_from_stopped"] == 0


def test_the_ticked_oracles_are_never_cheaper_than_at_any_moment_and_only_by_rounding() -> None:
    for rng, trace, p in random_cases(5):
        tick = rng.choice([1.0, 60.0])
        for warm in (False, True):
            free = baselines.oracle(trace, p, warm=warm)
            ticked = baselines.oracle(trace, replace(p, tick_s=tick), warm=warm)
            assert ticked.waits == free.waits and ticked.peak_instances == free.peak_instances
            assert free.instance_s - 1e-9 <= ticked.instance_s
            # each of at most 2 changes per task rounds out by less than 3 ticks
            assert ticked.instance_s <= free.instance_s + 3 * tick * 2 * len(trace) + 1e-9
        cold = baselines.oracle(trace, replace(p, tick_s=tick))
        warm_ = baselines.oracle(trace, replace(p, tick_s=tick), warm=True)
        assert warm_.instance_s <= cold.instance_s + 1e-9

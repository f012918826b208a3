"""The oracle with stop and start: a gap between two needs of one level costs the least of
idling through it, a new boot, and storage for the gap plus a start's loading time. It is
never dearer than the oracle that only rents and destroys, and equals it when stopping does
not pay. Costs are worked out by hand in the comments.
"""

from __future__ import annotations

import random

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
    # stopped through the gap: 2000 s of storage at a tenth (200) plus a 30 s start
    assert warm.instance_s == pytest.approx(300 + 100 + 30 + 200 + 100)
    assert warm.instances_started == 1 and warm.notes["starts_from_stopped"] == 1
    assert warm.name == "oracle_warm" and warm.cost_usd < cold.cost_usd


def test_a_short_gap_idles_and_a_gap_too_long_to_store_reboots() -> None:
    short = [TraceTask(0.0, 100.0), TraceTask(120.0, 100.0)]  # 20 s idle beats a 30 s start
    assert baselines.oracle(short, params(), warm=True).instance_s == pytest.approx(300 + 220)
    # storage at half the price: a gap of 2000 s stored (1000 + 30) costs more than a boot
    long = [TraceTask(0.0, 100.0), TraceTask(2100.0, 100.0)]
    out = baselines.oracle(long, params(storage_dph=1.8), warm=True)
    assert out.instance_s == pytest.approx(300 + 100 + 300 + 100)
    assert out.notes["starts_from_stopped"] == 0 and out.instances_started == 2


def test_without_a_start_time_the_warm_oracle_is_the_oracle() -> None:
    trace = [TraceTask(0.0, 100.0), TraceTask(2100.0, 100.0)]
    plain = baselines.oracle(trace, params(start_s=None))
    warm = baselines.oracle(trace, params(start_s=None), warm=True)
    assert warm.instance_s == plain.instance_s and warm.instances_started == 2


def test_the_warm_oracle_is_never_dearer_and_waits_the_same() -> None:
    rng = random.Random(11)
    for _ in range(30):
        trace = sorted((TraceTask(rng.uniform(0, 8000), rng.uniform(10, 900))
                        for _ in range(rng.randint(1, 40))), key=lambda t: t.arrival_s)  # fmt: skip
        p = params(slots=rng.choice([1, 2]), max_instances=rng.choice([None, 3]))
        cold, warm = baselines.oracle(trace, p), baselines.oracle(trace, p, warm=True)
        assert warm.instance_s <= cold.instance_s + 1e-9
        assert warm.waits == cold.waits and warm.peak_instances == cold.peak_instances

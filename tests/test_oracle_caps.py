"""The oracle under a fleet cap: it never runs more instances than `max_instances`, tasks wait
for a slot of the capped fleet in arrival order, and no capped baseline starts tasks sooner.

Expected waits and costs are worked out by hand in the comments.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from controller.sim.trace import TraceTask, load_trace
from controller.tools.replay import baselines
from controller.tools.replay.results import BaselineParams

SLICE = Path(__file__).resolve().parent / "data" / "simulate_slice.csv"


def params(**changes: float | int | None) -> BaselineParams:
    # 3.6 $/h: $0.001 per instance-second
    base = {"boot_s": 30.0, "dph": 3.6, "slots": 1, "tasks_per_instance": 1,
            "horizon_s": 1000.0, "deadline_s": 60.0, "interval_s": 10.0, "cooldown_s": 20.0,
            "sample_s": 100.0}  # fmt: skip
    return BaselineParams(**{**base, **changes})  # type: ignore[arg-type]


def burst(n: int, at: float = 0.0, service: float = 100.0) -> list[TraceTask]:
    return [TraceTask(at, service) for _ in range(n)]


def test_a_burst_above_the_cap_peaks_at_the_cap_not_above() -> None:
    trace = burst(40)
    assert baselines.oracle(trace, params(slots=2)).peak_instances == 20  # uncapped
    capped = baselines.oracle(trace, params(slots=2, max_instances=6))
    assert capped.peak_instances == 6
    # 12 slots: 4 rounds of 100 s (12, 12, 12, 4 tasks), each task's wait its round's start
    assert sorted(capped.waits) == [0.0] * 12 + [100.0] * 12 + [200.0] * 12 + [300.0] * 4
    assert capped.censored == 0
    # busy: 6 instances for 300 s, then 2 for 100 s, each booted once: 6 x 30 + 1800 + 200
    assert capped.instance_s == pytest.approx(2180.0)
    assert capped.instances_started == 6


def test_capped_waits_are_first_come_first_served_on_the_capped_slots() -> None:
    # one instance, one slot: starts 0, 100, 200 (the third arrived at 50)
    trace = [TraceTask(0, 100), TraceTask(0, 100), TraceTask(50, 100)]
    out = baselines.oracle(trace, params(max_instances=1))
    assert out.waits == (0.0, 100.0, 150.0) and out.peak_instances == 1
    assert out.instance_s == pytest.approx(30.0 + 300.0)  # one boot, busy 300 s


def test_a_task_not_started_by_the_horizon_is_censored_there() -> None:
    trace = [TraceTask(0, 800), TraceTask(100, 800)]  # the second would start at 800, ends 1600
    out = baselines.oracle(trace, params(max_instances=1, horizon_s=700.0))
    assert out.censored == 1 and out.waits == (0.0, 600.0)
    assert baselines.oracle(trace, params(max_instances=0)).instance_s == 0.0


def test_a_cap_that_never_binds_changes_nothing() -> None:
    trace = [TraceTask(0, 100), TraceTask(50, 100), TraceTask(120, 50), TraceTask(400, 100)]
    free = baselines.oracle(trace, params())
    capped = baselines.oracle(trace, params(max_instances=2))
    assert (capped.instance_s, capped.waits, capped.peak_instances) == (
        free.instance_s, free.waits, free.peak_instances)  # fmt: skip


@pytest.mark.parametrize("cap", [1, 2, 3, 5, 8])
def test_the_capped_oracle_stays_in_the_cap_and_no_baseline_starts_tasks_sooner(cap: int) -> None:
    rng = random.Random(cap)
    trace = sorted((TraceTask(rng.uniform(0, 5000), rng.uniform(10, 900)) for _ in range(120)),
                   key=lambda t: t.arrival_s)  # fmt: skip
    p = params(slots=2, tasks_per_instance=2, horizon_s=8000.0, max_instances=cap)
    out = baselines.oracle(trace, p)
    assert 1 <= out.peak_instances <= cap
    assert all(s.booting + s.serving <= cap for s in out.series)
    static, proportional = baselines.static_peak(trace, p), baselines.proportional(trace, p)
    for other in (static, proportional):
        assert other.peak_instances <= cap  # the same cap, honoured by the baselines too
        # no capped policy starts tasks sooner (in arrival order, on the same slots)
        assert sum(out.waits) <= sum(other.waits) + 1e-6
        assert max(out.waits) <= max(other.waits) + 1e-6
    # and with those waits, the fleet the cap allows for the whole horizon costs more
    assert out.instance_s <= static.instance_s + 1e-6


def test_on_a_real_slice_the_oracle_stays_within_a_cap_the_uncapped_one_exceeds() -> None:
    trace = load_trace(SLICE)
    p = params(horizon_s=86400.0, boot_s=1735.0, slots=2, tasks_per_instance=2,
               interval_s=60.0, cooldown_s=300.0, deadline_s=3600.0, sample_s=3600.0)  # fmt: skip
    free = baselines.oracle(trace, p).peak_instances
    assert free >= 2
    cap = free - 1
    capped = baselines.oracle(trace, BaselineParams(**{**p.__dict__, "max_instances": cap}))
    assert capped.peak_instances == cap and max(capped.waits) > 0.0

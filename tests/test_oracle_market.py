"""The market oracle: the oracle with stop and start on the simulated market's own machines,
best price per unit of work first, each task first come first served on the lowest level with
a free slot, in its service time over the machine's speed. Costs worked out by hand.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from controller.sim.machines import Machine
from controller.sim.trace import TraceTask
from controller.tools.replay import baselines, market
from controller.tools.replay.results import BaselineParams


def params(**changes: float | int | None) -> BaselineParams:
    base = {"boot_s": 300.0, "dph": 3.6, "slots": 1, "tasks_per_instance": 1,
            "horizon_s": 10_000.0, "deadline_s": 60.0, "sample_s": 100.0,
            "start_s": 30.0, "storage_dph": 0.36}  # fmt: skip
    return BaselineParams(**{**base, **changes})  # type: ignore[arg-type]


def machine(mid: str, dph: float, rate: float, crash_loop: bool = False) -> Machine:
    return Machine(mid, "h" + mid, "RTX 4090", 1, dph, rate, crash_loop, storage_per_gb_h=0.001)


def test_the_best_price_per_unit_of_work_comes_first_and_bad_or_held_machines_never() -> None:
    pool = [machine("cheap-slow", 1.0, 10.0), machine("fast", 3.0, 60.0),
            machine("crash", 0.1, 60.0, crash_loop=True), machine("held", 0.1, 60.0),
            machine("mid", 2.0, 30.0)]  # fmt: skip
    fleet = market.levels(pool, reference_rate=30.0, disk_gb=100.0, held=frozenset({"held"}))
    # $/h per reference-rate hour: fast 3.0 / 2 = 1.5, cheap-slow 1.0 / (1/3) = 3.0, mid 2.0
    assert [lv.machine_id for lv in fleet] == ["fast", "mid", "cheap-slow"]
    assert fleet[0].speed == 2.0 and fleet[0].storage_dph == pytest.approx(0.1)
    assert [lv.machine_id for lv in market.levels(pool, reference_rate=30.0, disk_gb=1.0,
                                                  cap=2)] == ["held", "fast"]  # fmt: skip


def test_a_fast_machine_runs_a_task_in_its_service_time_over_its_speed() -> None:
    # one task of 1000 s on a machine twice the reference rate at $3.6/h ($0.001/s):
    # a boot (300 s) and 500 s busy, billed whole ticks of 100 s: 3 + 5 ticks
    fleet = [market.Level("m", 2.0, 3.6, 0.36)]
    out = market.market_oracle([TraceTask(1000.0, 1000.0)], params(tick_s=100.0), fleet)
    assert out.cost_usd == pytest.approx((300 + 500) * 0.001)
    assert out.waits == (0.0,) and out.instances_started == 1 and out.name == "oracle_market"
    # at the reference rate and the same price, it is the oracle with stop and start
    same = [market.Level("m", 1.0, 3.6, 0.36)]
    tasks = [TraceTask(1000.0, 1000.0)]
    assert market.market_oracle(tasks, params(tick_s=100.0), same).cost_usd == pytest.approx(
        baselines.oracle(tasks, params(tick_s=100.0), warm=True).cost_usd)  # fmt: skip


def test_tasks_go_to_the_lowest_free_level_and_wait_first_come_when_all_are_taken() -> None:
    fleet = [market.Level("a", 1.0, 3.6, 0.36), market.Level("b", 1.0, 7.2, 0.36)]
    tasks = [TraceTask(0.0, 100.0), TraceTask(10.0, 100.0), TraceTask(20.0, 100.0),
             TraceTask(150.0, 10.0)]  # fmt: skip
    ran, waits = market.assign(tasks, fleet, slots=1, horizon_s=1000.0)
    # a takes 0-100, b 10-110; the third waits for a (free at 100): 80 s; at 150 a is busy
    # again (until 200) and b free: the fourth goes to b
    assert waits == [0.0, 0.0, 80.0, 0.0]
    assert ran[0] == [TraceTask(0.0, 100.0), TraceTask(100.0, 100.0)]
    assert ran[1] == [TraceTask(10.0, 100.0), TraceTask(150.0, 10.0)]
    # none started by the horizon: censored, waiting up to it
    ran, waits = market.assign([TraceTask(0.0, 500.0), TraceTask(1.0, 5.0)], fleet[:1],
                               slots=1, horizon_s=300.0)  # fmt: skip
    assert waits == [0.0, 299.0] and ran == [[TraceTask(0.0, 500.0)]]
    out = market.market_oracle([TraceTask(0.0, 500.0), TraceTask(1.0, 5.0)],
                               params(horizon_s=300.0), fleet[:1])  # fmt: skip
    assert out.censored == 1 and out.peak_instances == 1


def test_a_task_moves_down_when_a_better_machine_frees_its_rest_at_that_speed() -> None:
    fleet = [market.Level("fast", 2.0, 3.6, 0.36), market.Level("slow", 1.0, 3.6, 0.36)]
    # the first takes fast 0-50 (100 s of work at twice the rate); the second, arriving at 10,
    # slow from 10; at 50 it has 60 s of work left and moves to fast: done at 80
    ran, waits = market.assign([TraceTask(0.0, 100.0), TraceTask(10.0, 100.0)], fleet,
                               slots=1, horizon_s=1000.0)  # fmt: skip
    assert waits == [0.0, 0.0]
    assert ran[0] == [TraceTask(0.0, 50.0), TraceTask(50.0, 30.0)]
    assert ran[1] == [TraceTask(10.0, 40.0)]


@pytest.mark.parametrize("slots", [1, 2])
def test_on_identical_machines_it_is_the_oracle_with_stop_and_start(slots: int) -> None:
    rng = random.Random(5)
    tasks = sorted((TraceTask(rng.uniform(0, 80_000), rng.uniform(20, 3000)) for _ in range(600)),
                   key=lambda t: t.arrival_s)  # fmt: skip
    p = params(horizon_s=86_400.0, slots=slots, tick_s=60.0, sample_s=600.0)
    same = [market.Level(f"m{k}", 1.0, 3.6, 0.36) for k in range(60)]
    stack = baselines.oracle(tasks, p, warm=True)
    held = market.market_oracle(tasks, p, same)
    assert held.cost_usd == pytest.approx(stack.cost_usd)
    assert held.instances_started == stack.instances_started
    assert held.peak_instances == stack.peak_instances and max(held.waits) == 0.0
    # capped: the same first-come-first-served waits as the capped oracle
    capped = replace(p, max_instances=3)
    assert market.market_oracle(tasks, capped, same[:3]).waits == pytest.approx(
        baselines.oracle(tasks, capped, warm=True).waits)  # fmt: skip
    quick = [market.Level(f"m{k}", 1.5, 3.6, 0.36) for k in range(60)]
    assert market.market_oracle(tasks, p, quick).cost_usd < held.cost_usd
    # its spend series ends at its cost
    assert held.series[-1].spend_usd == pytest.approx(held.cost_usd, rel=0.02)


# --- without task moves (`moves=False`): fleetgate's own actions, the oracle "no moves"


def test_without_moves_a_task_stays_and_starts_beside_the_task_that_ends_nearest_its_end() -> None:
    same = market.identical(params(slots=2), 3)
    hour = 3600.0
    # d and f fill level 0; a takes level 1, alone; when e comes, f is gone: level 0 has room
    tasks = [TraceTask(0.0, hour), TraceTask(36.0, 324.0), TraceTask(72.0, 10 * hour),
             TraceTask(720.0, 10 * hour)]  # fmt: skip
    ran, waits = market.assign(tasks, same, slots=2, horizon_s=20 * hour, moves=False)
    assert waits == [0.0] * 4
    # e ends at 10.2 h, a at 10.02 h, d at 1 h: e goes beside a, and level 0 stops after d
    assert ran[0] == [TraceTask(36.0, 324.0), TraceTask(0.0, hour)]
    assert ran[1] == [TraceTask(72.0, 10 * hour), TraceTask(720.0, 10 * hour)]
    assert ran[2] == []
    # the lowest free slot would have put e beside d: two levels on for ten hours, where
    # this one holds level 0 for one hour. The stack moves tasks: between f's end and e's
    # arrival (360 s, $0.36 at $3.6/h) it runs d and a on one level, which no move-free
    # schedule can; apart from that window the two cost the same
    p = params(slots=2, horizon_s=20 * hour, tick_s=60.0, sample_s=600.0)
    placed = market.market_oracle(tasks, p, same, moves=False, name="oracle_placed")
    stack = baselines.oracle(tasks, p, warm=True).cost_usd
    assert placed.name == "oracle_placed"
    assert stack < placed.cost_usd <= stack + 0.36
    lowest = [TraceTask(0.0, 10.2 * hour), TraceTask(72.0, 10 * hour)]  # each level's span
    assert placed.cost_usd < 0.6 * market.market_oracle(lowest, replace(p, slots=1), same
                                                        ).cost_usd  # fmt: skip


def test_without_moves_every_task_runs_once_whole_and_costs_at_least_the_stack() -> None:
    rng = random.Random(11)
    for case in range(20):
        tasks = sorted((TraceTask(rng.uniform(0, 40_000), rng.choice((60.0, 600.0, 7200.0))
                                  * rng.uniform(0.5, 2.0)) for _ in range(rng.randint(5, 200))),
                       key=lambda t: t.arrival_s)  # fmt: skip
        cap = rng.choice((None, 2, 5))
        p = params(horizon_s=60_000.0, slots=2, tick_s=60.0, sample_s=600.0, max_instances=cap)
        same = market.identical(p, cap or len(tasks))
        ran, waits = market.assign(tasks, same, p.slots, p.horizon_s, moves=False)
        spans = sorted((t.arrival_s, t.service_s) for run in ran for t in run)
        started = sorted((t.arrival_s + w, t.service_s) for t, w in zip(tasks, waits, strict=True)
                         if t.arrival_s + w < p.horizon_s)  # fmt: skip
        flat = [x for span in spans for x in span]  # one span a task, never cut by a move
        assert flat == pytest.approx([x for span in started for x in span]), case
        placed = market.market_oracle(tasks, p, same, moves=False)
        stack = baselines.oracle(tasks, p, warm=True)
        assert placed.waits == pytest.approx(stack.waits), case  # first come, first served
        assert placed.cost_usd >= stack.cost_usd - 1e-9, case  # the stack is the lower bound

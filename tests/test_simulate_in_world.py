"""The proportional baseline on the simulated world: scaling, lost hosts, stuck boots, liveness.

Worlds are built so that the arithmetic is exact: every stage has a fixed length (an instance
serves 600 s after it is rented), every host proves at the reference rate, every machine costs
$0.50 an hour, and only the fault a test is about is switched on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import NO_FAULTS

from controller.sim import SimConfig, Simulation
from controller.sim.instance import LOST_STATUSES
from controller.sim.trace import TraceTask
from controller.tools.replay.in_world import Health, proportional_in_world
from controller.tools.replay.results import BaselineParams
from controller.tools.replay.run import write_tasks

EXACT: dict[str, Any] = {
    "machines": 10,
    "dph_range": (0.5, 0.5),
    "fast_rate_range": (30.0, 30.0),
    "bench_noise": (1.0, 1.0),
    "reference_rate": 30.0,
    "boot_s": (60, 60),
    "pull_s": (60, 60),
    "register_s": (30, 30),
    "params_s": (300, 300),
    "bench_s": (150, 150),  # serving 600 s after renting
    **NO_FAULTS,
}


def world(tmp_path: Path, tasks: list[TraceTask], **faults: Any) -> Simulation:
    trace = tmp_path / "trace.csv"
    write_tasks(trace, tasks)
    config = SimConfig(**{**EXACT, **faults, "demand": "trace", "trace_path": str(trace),
                          "trace_time_scale": 1.0, "trace_service_scale": 1.0})  # fmt: skip
    return Simulation(config, seed=1)


def params(horizon_s: float) -> BaselineParams:
    return BaselineParams(boot_s=600.0, dph=0.5, slots=2, horizon_s=horizon_s, deadline_s=3600.0,
                          tasks_per_instance=2, interval_s=60.0, cooldown_s=300.0,
                          max_instances=30, sample_s=600.0)  # fmt: skip


def polls(horizon_s: float) -> int:
    return int(horizon_s // 60)


def test_it_launches_for_the_queue_and_gives_back_after_the_cooldown(tmp_path: Path) -> None:
    sim = world(tmp_path, [TraceTask(0.0, 1200.0)])
    out = proportional_in_world(sim, params(3600.0), polls(3600.0))
    # poll at 60 s: 1 waiting -> launch; serving from 660 s, where the task starts (wait 660);
    # done at 1860; the target 1 of the poll at 1800 stays in the window until 2100, so the
    # instance goes at the poll at 2160: billed 2100 s at $0.50/h
    assert out.waits == (660.0,) and out.censored == 0
    assert out.instances_started == 1 and out.peak_instances == 1
    assert out.instance_s == pytest.approx(2100.0)
    assert out.cost_usd == pytest.approx(2100.0 / 3600.0 * 0.5)
    assert out.notes["actions"] == {"launch": 1, "destroy_idle": 1}
    hours = out.notes["instance_hours_by_state"]
    assert hours["booting"] == pytest.approx(600 / 3600, abs=1e-2)  # polls 120..660 s
    assert hours["part_busy"] == pytest.approx(1200 / 3600, abs=1e-2)  # one task of 2 slots
    assert "busy" not in hours and "parked" not in hours
    assert sim.world.live_instances() == []


def test_two_tasks_share_one_instance_and_a_third_gets_another(tmp_path: Path) -> None:
    three = [TraceTask(0.0, 900.0), TraceTask(10.0, 900.0), TraceTask(20.0, 900.0)]
    out = proportional_in_world(world(tmp_path, three), params(3600.0), polls(3600.0))
    assert out.instances_started == 2  # ceil(3 / 2)
    assert sorted(out.waits) == [640.0, 650.0, 660.0]  # all start when both serve at 660
    hours = out.notes["instance_hours_by_state"]  # one holds two tasks, the other one
    assert hours["busy"] == pytest.approx(hours["part_busy"], abs=2 / 60)
    assert hours["busy"] == pytest.approx(900 / 3600, abs=2 / 60)


def test_a_lost_instance_is_destroyed_and_replaced(tmp_path: Path) -> None:
    # every container exits within seconds of reaching status running (120 s after renting)
    sim = world(tmp_path, [TraceTask(0.0, 600.0)], exit_per_h=3600.0)
    out = proportional_in_world(sim, params(1800.0), polls(1800.0))
    actions = out.notes["actions"]
    assert actions["destroy_lost"] >= 5
    assert actions["launch"] == actions["destroy_lost"] + 1  # each replaced, the last one live
    assert out.censored == 1  # never served
    assert [i.status for i in sim.world.live_instances() if i.status in LOST_STATUSES] == []


def test_a_stuck_boot_is_given_up_after_the_provision_timeout(tmp_path: Path) -> None:
    sim = world(tmp_path, [TraceTask(0.0, 600.0)], stuck_fraction=1.0)
    out = proportional_in_world(sim, params(3600.0), polls(3600.0),
                                Health(provision_timeout_s=1200.0))  # fmt: skip
    # launched at 60 s, given up and relaunched at 1260 and 2460
    assert out.notes["actions"] == {"launch": 3, "destroy_provision_timeout": 2}
    assert out.instance_s == pytest.approx(2 * 1200.0 + (3600.0 - 2460.0))  # the third one live


def test_a_crash_looping_daemon_is_restarted_with_growing_backoff(tmp_path: Path) -> None:
    # the daemon dies 30 s after every start: the benchmark never ends
    faults = {"crash_loop_host_fraction": 1.0, "crash_loop_s": (30.0, 30.0)}
    never = Health(provision_timeout_s=1e9)
    horizon = 4 * 3600.0
    backed_off = proportional_in_world(world(tmp_path, [TraceTask(0.0, 600.0)], **faults),
                                       params(horizon), polls(horizon), never)  # fmt: skip
    eager = proportional_in_world(
        world(tmp_path, [TraceTask(0.0, 600.0)], **faults),
        params(horizon),
        polls(horizon),
        Health(provision_timeout_s=1e9, backoff_first_s=0.0, backoff_max_s=0.0),
    )
    # without a backoff it restarts at every poll from the first death on (232 of 240 polls);
    # with one, the delay doubles from 10 s to its 5 min cap: one restart every 5 polls, 50
    assert eager.notes["actions"]["restart_daemon"] >= 200
    assert 40 <= backed_off.notes["actions"]["restart_daemon"] <= 60
    assert backed_off.instances_started == eager.instances_started == 1  # never given up

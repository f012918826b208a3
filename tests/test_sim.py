"""The simulator, through its public seams: Simulation, its world (WorldView), load_trace."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic
import pytest
from sim_support import WorldView
from support import NO_FAULTS

from controller.core.model import STAGES, Demand, Instance
from controller.fleet.base import LaunchRequest, PermanentProviderError
from controller.sim import SimConfig, Simulation
from controller.sim.clock import VirtualClock
from controller.sim.trace import load_trace

SLICE = Path(__file__).parent / "data" / "trace_slice.csv"

FAST_BOOT: dict[str, Any] = {
    "boot_s": (1, 1),
    "pull_s": (1, 1),
    "register_s": (1, 1),
    "params_s": (1, 1),
    "bench_s": (1, 1),
}


def make_sim(seed: int = 1, **overrides: Any) -> Simulation:
    """A simulation without faults unless the test asks for them."""
    return Simulation(SimConfig(**{**NO_FAULTS, **overrides}), seed=seed)


def launch(sim: Simulation, label: str, **kwargs: Any) -> str:
    return WorldView(sim).launch(LaunchRequest(label=label, **kwargs))


def get(sim: Simulation, instance_id: str) -> Instance:
    found = [i for i in WorldView(sim).list_instances() if i.id == instance_id]
    assert len(found) == 1, f"instance {instance_id} not listed"
    return found[0]


def run_until(sim: Simulation, done: Callable[[], bool], limit_s: float, step: float = 10) -> None:
    """Advance in `step`s until `done()`; fail if it takes longer than `limit_s`."""
    waited = 0.0
    while not done():
        assert waited < limit_s, f"condition not reached within {limit_s} s"
        sim.advance(step)
        waited += step


def total(sim: Simulation) -> Demand:
    rows = WorldView(sim).demand()
    assert rows[-1].task == "all"
    return rows[-1]


# --- clock and config


def test_virtual_clock_moves_only_forward() -> None:
    clock = VirtualClock(100.0)
    assert clock.advance(5) == 105.0
    assert clock.now() == 105.0
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_config_is_strict_and_frozen() -> None:
    with pytest.raises(pydantic.ValidationError, match="extra"):
        SimConfig(machine=3)  # type: ignore[call-arg]
    with pytest.raises(pydantic.ValidationError, match="trace_path"):
        SimConfig(demand="trace")
    config = SimConfig()
    with pytest.raises(pydantic.ValidationError):
        config.machines = 3


# --- determinism and persistence


def scenario(seed: int) -> Simulation:
    sim = Simulation(SimConfig(), seed=seed)
    ids = [launch(sim, f"run-{n}") for n in range(4)]
    sim.advance(4 * 3600)
    WorldView(sim).restart_daemon(ids[0])
    WorldView(sim).destroy(ids[1])
    sim.advance(2 * 3600 + 5)
    return sim


def test_same_seed_same_world_and_different_seed_differs() -> None:
    first, again, other = scenario(7).to_json(), scenario(7).to_json(), scenario(8).to_json()
    assert first == again
    assert first != other
    assert json.loads(json.dumps(first)) == first  # plain JSON data


def test_json_round_trip_continues_identically() -> None:
    original = scenario(11)
    copy = Simulation.from_json(json.loads(json.dumps(original.to_json())))
    assert copy.to_json() == original.to_json()
    for sim in (original, copy):
        launch(sim, "after-restore")
        sim.advance(3 * 3600 + 7)
        WorldView(sim).restart_daemon("10001")
        sim.advance(1800)
    assert copy.to_json() == original.to_json()
    assert copy.stats == original.stats
    assert WorldView(copy).list_instances() == WorldView(original).list_instances()
    assert WorldView(copy).demand() == WorldView(original).demand()
    assert original.stats["tasks_completed"] > 0


def test_from_json_rejects_unknown_version() -> None:
    state = make_sim().to_json()
    state["version"] = 99
    with pytest.raises(ValueError, match="version 99"):
        Simulation.from_json(state)


# --- lifecycle


def test_launched_instance_moves_through_stages_to_running() -> None:
    sim = make_sim()
    iid = launch(sim, "life")
    seen: list[Instance] = []

    def reached_running() -> bool:
        seen.append(get(sim, iid))
        return seen[-1].stage == "running"

    run_until(sim, reached_running, limit_s=4 * 3600)
    stages = [s for n, s in enumerate(i.stage for i in seen) if n == 0 or seen[n - 1].stage != s]
    assert tuple(stages) == STAGES
    statuses = list(dict.fromkeys(i.status for i in seen))
    assert statuses == ["provisioning", "loading", "running"]
    for inst in seen:
        assert (inst.daemon == "up") == (inst.stage in ("bench", "running"))
        assert (inst.sidecar == "up") == (inst.stage not in ("provisioning", "loading"))
        assert (inst.bench_rate is not None) == (inst.stage == "running")
    final = seen[-1]
    assert final.bench_rate is not None and 25 * 0.9 <= final.bench_rate <= 60 * 1.1
    assert final.daemon_uptime_s is not None and final.daemon_uptime_s >= 0
    assert final.start_date == Simulation(SimConfig(), seed=1).now()
    sim.advance(600)
    later = get(sim, iid).daemon_uptime_s
    assert later is not None and later >= final.daemon_uptime_s + 600


def test_stuck_instance_stays_stuck() -> None:
    sim = make_sim(stuck_fraction=1.0)
    ids = [launch(sim, f"stuck-{n}") for n in range(6)]
    sim.advance(4 * 3600)
    before = {i.id: (i.status, i.stage) for i in WorldView(sim).list_instances()}
    sim.advance(20 * 3600)
    after = {i.id: (i.status, i.stage) for i in WorldView(sim).list_instances()}
    assert before == after
    assert sorted(after) == ids
    for status, stage in after.values():
        assert stage in ("loading", "params", "bench")
        assert status == ("loading" if stage == "loading" else "running")


def test_silent_daemon_death_then_restart_after_delay() -> None:
    sim = make_sim(daemon_death_per_h=60.0, **FAST_BOOT)
    iid = launch(sim, "dies")
    run_until(sim, lambda: get(sim, iid).stage == "running", limit_s=600)
    run_until(sim, lambda: get(sim, iid).daemon == "down", limit_s=3600)
    dead = get(sim, iid)
    assert (dead.status, dead.stage, dead.sidecar) == ("running", "running", "up")
    assert dead.daemon_uptime_s is None
    WorldView(sim).restart_daemon(iid)
    sim.advance(19)
    assert get(sim, iid).daemon == "down"
    sim.advance(1)
    back = get(sim, iid)
    assert back.daemon == "up" and back.daemon_uptime_s == 0.0
    sim.advance(3600)
    assert get(sim, iid).daemon == "down"  # at 60 deaths an hour it does not last


def test_crash_loop_host_keeps_killing_the_daemon() -> None:
    sim = make_sim(crash_loop_host_fraction=1.0, **FAST_BOOT)
    iid = launch(sim, "loops")
    run_until(sim, lambda: get(sim, iid).daemon == "up", limit_s=60, step=1)
    for _ in range(4):
        run_until(sim, lambda: get(sim, iid).daemon == "down", limit_s=420, step=1)
        assert get(sim, iid).status == "running"
        WorldView(sim).restart_daemon(iid)
        sim.advance(20)
        assert get(sim, iid).daemon == "up"
        assert get(sim, iid).daemon_uptime_s == 0.0


def test_a_supervised_daemon_is_started_again_by_itself() -> None:
    """`supervised_restart_s`: cuzk under supervisord comes back 2 s after each death with no
    restart from anyone, its uptime from zero (a crash-loop host goes on killing it)."""
    sim = make_sim(crash_loop_host_fraction=1.0, supervised_restart_s=2.0, **FAST_BOOT)
    iid = launch(sim, "supervised")
    run_until(sim, lambda: get(sim, iid).daemon == "up", limit_s=60, step=1)
    for _ in range(3):
        run_until(sim, lambda: get(sim, iid).daemon == "down", limit_s=420, step=1)
        sim.advance(1)
        assert get(sim, iid).daemon == "down"
        sim.advance(1)
        back = get(sim, iid)
        assert (back.status, back.daemon) == ("running", "up")
        assert back.daemon_uptime_s is not None and back.daemon_uptime_s < 1.0  # started anew


def test_frozen_status_appears_and_stays() -> None:
    sim = make_sim(frozen_per_h=20.0)
    ids = [launch(sim, f"f{n}") for n in range(3)]
    sim.advance(3 * 3600)
    frozen = [i for i in WorldView(sim).list_instances() if i.status == "frozen"]
    assert frozen, "no instance froze"
    inst = frozen[0]
    assert (inst.daemon, inst.sidecar) == ("unknown", "unknown")
    assert inst.status_msg == "container frozen by host"
    sim.advance(24 * 3600)
    assert get(sim, inst.id).status == "frozen"
    with pytest.raises(PermanentProviderError, match="frozen"):
        WorldView(sim).reboot(inst.id)
    assert inst.id in ids


def test_reboot_keeps_stage_and_restarts_daemon() -> None:
    sim = make_sim(busy_rate_per_h=3600.0, **FAST_BOOT)
    iid = launch(sim, "reboot")
    run_until(sim, lambda: get(sim, iid).tasks_running == 2, limit_s=600)
    sim.advance(100)
    WorldView(sim).reboot(iid)
    rebooting = get(sim, iid)
    assert (rebooting.status, rebooting.daemon, rebooting.sidecar) == ("rebooting", "down", "down")
    assert rebooting.tasks_running == 0
    assert total(sim).max_retries == 1
    sim.advance(60)
    back = get(sim, iid)
    assert (back.status, back.stage, back.daemon, back.sidecar) == (
        "running",
        "running",
        "up",
        "up",
    )
    assert back.daemon_uptime_s is not None and back.daemon_uptime_s <= 10


def test_restart_daemon_is_a_noop_before_running() -> None:
    sim = make_sim()
    iid = launch(sim, "early")
    WorldView(sim).restart_daemon(iid)
    WorldView(sim).reboot(iid)
    assert get(sim, iid).status == "provisioning"


def test_unknown_instance_is_a_permanent_error() -> None:
    provider = WorldView(make_sim())
    for act in (provider.destroy, provider.reboot, provider.restart_daemon, provider.drain):
        with pytest.raises(PermanentProviderError, match="no instance '42'"):
            act("42")


# --- billing, destroy, drain


def test_destroy_removes_instance_and_stops_billing() -> None:
    sim = make_sim()
    keep, gone = launch(sim, "keep"), launch(sim, "gone")
    sim.advance(3600)
    spend = sim.stats["spend_usd"]
    dph = {i.id: i.dph for i in WorldView(sim).list_instances()}
    assert spend == pytest.approx(dph[keep] + dph[gone])
    WorldView(sim).destroy(gone)
    assert [i.id for i in WorldView(sim).list_instances()] == [keep]
    assert WorldView(sim).find_by_label("gone") is None
    assert WorldView(sim).find_by_label("keep") is not None
    sim.advance(3600)
    assert sim.stats["spend_usd"] == pytest.approx(spend + dph[keep])
    WorldView(sim).destroy(keep)
    final = sim.stats
    sim.advance(3600)
    assert sim.stats["spend_usd"] == final["spend_usd"]
    assert final["gpu_hours"] == pytest.approx(3.0)
    assert (final["instances_launched"], final["instances_destroyed"]) == (2, 2)
    with pytest.raises(PermanentProviderError):
        WorldView(sim).destroy(gone)


def test_destroy_releases_tasks_at_once() -> None:
    sim = make_sim(busy_rate_per_h=3600.0, **FAST_BOOT)
    iid = launch(sim, "owner")
    run_until(sim, lambda: get(sim, iid).tasks_running == 2, limit_s=600)
    WorldView(sim).destroy(iid)
    row = total(sim)
    assert (row.running, row.max_retries) == (0, 1)


def test_drain_stops_claiming() -> None:
    sim = make_sim(busy_rate_per_h=600.0, service_min_s=60.0, service_max_s=60.0, **FAST_BOOT)
    iid = launch(sim, "drain")
    sim.advance(900)
    assert sim.stats["tasks_completed"] > 0
    WorldView(sim).drain(iid)
    sim.advance(300)  # tasks in hand finish (60 s x 30 / rate >= 25 -> < 80 s)
    assert get(sim, iid).tasks_running == 0 and get(sim, iid).drained
    completed = sim.stats["tasks_completed"]
    sim.advance(1800)
    assert sim.stats["tasks_completed"] == completed
    assert get(sim, iid).tasks_running == 0
    assert total(sim).pending > 0


# --- the queue


def test_tasks_are_claimed_completed_and_waits_recorded() -> None:
    sim = make_sim(**FAST_BOOT)
    for n in range(2):
        launch(sim, f"worker-{n}")
    run_until(sim, lambda: total(sim).running == 4, limit_s=3 * 3600)
    sim.advance(3 * 3600)  # busy phase (3 h) then quiet
    stats = sim.stats
    waits = stats["waits_s"]
    assert stats["tasks_completed"] > 0
    assert waits["count"] == stats["tasks_completed"]
    assert 0 <= waits["p50"] <= waits["p95"] <= waits["max"]
    assert stats["tasks_arrived"] >= stats["tasks_completed"] + total(sim).running
    assert total(sim).running <= 4
    arrived = stats["tasks_arrived"]
    sim.advance(3600)  # still quiet: rate 0
    assert sim.stats["tasks_arrived"] == arrived


def test_lost_node_tasks_return_after_curio_timeout() -> None:
    sim = make_sim(busy_rate_per_h=3600.0, service_min_s=9000.0, service_max_s=9000.0,
                   exit_per_h=30.0, **FAST_BOOT)  # fmt: skip
    iid = launch(sim, "exits")
    run_until(sim, lambda: get(sim, iid).status == "exited", limit_s=2 * 3600)
    assert get(sim, iid).tasks_running == 2
    sim.advance(580)
    assert total(sim).running == 2
    sim.advance(20)
    row = total(sim)
    assert (row.running, row.max_retries) == (0, 1)
    assert get(sim, iid).tasks_running == 0


def test_demand_counts_per_name_and_total() -> None:
    sim = make_sim(busy_rate_per_h=600.0, task_weights={"PoRep": 3.0, "WdPost": 1.0}, **FAST_BOOT)
    sim.advance(1800)
    backlog, since = total(sim), sim.now()
    assert backlog.running == 0 and backlog.pending > 2
    iid = launch(sim, "d")
    run_until(sim, lambda: get(sim, iid).tasks_running == 2, limit_s=600)
    rows = WorldView(sim).demand()
    # oldest first: the two oldest were claimed, so the oldest pending one is younger
    assert rows[-1].oldest_pending_s < backlog.oldest_pending_s + (sim.now() - since)
    names = [r.task for r in rows]
    assert names[-1] == "all" and set(names[:-1]) <= {"PoRep", "WdPost"}
    per_name, all_row = rows[:-1], rows[-1]
    assert all_row.running == sum(r.running for r in per_name) == 2
    assert all_row.pending == sum(r.pending for r in per_name) > 0
    assert all_row.pending + all_row.running == sim.stats["tasks_arrived"]
    assert all_row.oldest_pending_s == max(r.oldest_pending_s for r in per_name)
    assert 1700 <= all_row.oldest_pending_s <= 1800 + 600
    assert all_row.max_retries == 0


def test_demand_of_an_empty_queue_is_only_the_total() -> None:
    sim = make_sim(busy_rate_per_h=0.0)
    sim.advance(3600)
    assert WorldView(sim).demand() == [Demand(task="all", pending=0, running=0)]


# --- the offer market


def test_launch_excludes_machines_and_fails_when_none_left() -> None:
    sim = make_sim(machines=3)
    exclude = frozenset({"m000"})
    first = launch(sim, "a", exclude_machines=exclude)
    second = launch(sim, "b", exclude_machines=exclude)
    machines = {i.machine_id for i in WorldView(sim).list_instances()}
    assert machines == {"m001", "m002"}
    with pytest.raises(PermanentProviderError, match="no offer matches"):
        launch(sim, "c", exclude_machines=exclude)
    assert (first, second) == ("10001", "10002")
    WorldView(sim).destroy(first)  # its machine is rentable again
    launch(sim, "d", exclude_machines=exclude)


def test_launch_prefers_known_fast_hosts_then_cheapest() -> None:
    sim = make_sim(machines=6)
    launch(sim, "fast", prefer_rates=(("m004", 50.0), ("m002", 10.0)))
    assert get(sim, "10001").machine_id == "m004"
    for n in range(4):
        launch(sim, f"rest-{n}", prefer_rates=(("m002", 10.0),))
    rest = WorldView(sim).list_instances()[1:]
    assert [i.dph for i in rest] == sorted(i.dph for i in rest)
    assert "m002" not in {i.machine_id for i in rest}  # known slow goes last
    launch(sim, "last", prefer_rates=(("m002", 10.0),))
    assert get(sim, "10006").machine_id == "m002"


def test_launch_respects_max_dph() -> None:
    sim = make_sim()
    with pytest.raises(PermanentProviderError, match="max_dph 0.1"):
        launch(sim, "cheap", max_dph=0.1)
    launch(sim, "ok", max_dph=0.5)
    assert WorldView(sim).list_instances()[0].dph <= 0.5


# --- the trace


def test_trace_loader_reads_the_slice() -> None:
    with SLICE.open() as handle:
        rows = list(csv.DictReader(line for line in handle if not line.startswith("#")))
    gpu_rows = [r for r in rows if r["num_gpu"] != "0"]
    tasks = load_trace(SLICE, time_scale=0.01, service_scale=0.1)
    assert len(tasks) == len(gpu_rows) < len(rows)
    assert [t.arrival_s for t in tasks] == sorted(t.arrival_s for t in tasks)
    assert tasks[0].arrival_s == 0.0
    first = float(gpu_rows[0]["creation_time"])
    second = gpu_rows[1]
    assert tasks[1].arrival_s == pytest.approx((float(second["creation_time"]) - first) * 0.01)
    life = float(second["deletion_time"]) - float(second["creation_time"])
    assert tasks[1].service_s == pytest.approx(life * 0.1)  # as recorded, scaled: no floor
    assert min(t.service_s for t in tasks) < 60.0
    floored = load_trace(SLICE, time_scale=0.01, service_scale=0.1, min_service_s=60.0)
    assert min(t.service_s for t in floored) == 60.0
    assert len(load_trace(SLICE, limit=10)) == 10


def test_trace_loader_names_the_bad_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("num_gpu,creation_time,deletion_time\n1,0,100\n1,soon,200\n")
    with pytest.raises(ValueError, match=rf"{bad}:3: creation_time 'soon' is not a number"):
        load_trace(bad)
    short = tmp_path / "short.csv"
    short.write_text("# a comment\nnum_gpu,creation_time,deletion_time\n1,0\n")
    with pytest.raises(ValueError, match=rf"{short}:3: expected 3 fields"):
        load_trace(short)


def test_trace_demand_replays_arrivals() -> None:
    sim = make_sim(demand="trace", trace_path=str(SLICE), trace_time_scale=0.001)
    tasks = load_trace(SLICE, time_scale=0.001, service_scale=0.1)
    sim.advance(3600)
    expected = sum(1 for t in tasks if t.arrival_s <= 3600)
    assert 0 < sim.stats["tasks_arrived"] == expected < len(tasks)
    assert total(sim).pending == expected


def test_trace_demand_replays_a_standard_workload_format_log(tmp_path: Path) -> None:
    log = tmp_path / "cluster.swf"  # `;` comments, 18 fields a job, -1 for unknown
    log.write_text("; UnixStartTime: 1400749079\n"
                   "1    0 5  600 16 -1 -1 16 3600 -1 1 1 1 1 1 -1 -1 -1\n"
                   "2   60 0   -1  1 -1 -1  1  600 -1 5 2 2 2 1 -1 -1 -1\n"
                   "3 1200 0 7200  8 -1 -1  8 7200 -1 1 1 1 1 1 -1 -1 -1\n")  # fmt: skip
    sim = make_sim(demand="trace", trace_path=str(log), trace_time_scale=1.0,
                   trace_service_scale=1.0)  # fmt: skip
    sim.advance(600)
    assert sim.stats["tasks_arrived"] == 1  # job 2 never ran (run time -1): not a task
    sim.advance(1200)
    assert sim.stats["tasks_arrived"] == total(sim).pending == 2


def test_fleet_wide_odd_status_freezes_running_instances_now_and_then() -> None:
    sim = make_sim(odd_status_per_h=2.0, **FAST_BOOT)
    ids = [launch(sim, f"odd-{n}") for n in range(4)]
    sim.advance(600)
    assert all(get(sim, i).status == "running" for i in ids)
    sim.advance(4 * 3600)
    frozen = [i for i in WorldView(sim).list_instances() if i.status == "frozen"]
    assert frozen, "no instance froze in 4 h at 2 freezes/h"
    assert all(i.daemon == "unknown" and i.sidecar == "unknown" for i in frozen)
    assert make_sim(**FAST_BOOT).config.odd_status_per_h == 0.0  # off in the quiet baseline

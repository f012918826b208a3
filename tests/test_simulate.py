"""`fleetgate simulate`: baselines on hand-made traces, the trace loader, the command end to end.

The expected costs and waits below are worked out by hand in the comments; a change in the
baselines' arithmetic breaks them.
"""

from __future__ import annotations

import ast
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from controller.service.cli import main
from controller.sim.config import SimConfig
from controller.sim.trace import TraceTask, load_trace
from controller.tools.replay import baselines, operator
from controller.tools.replay.results import BaselineParams, fault_rework, task_hazard_per_h

ROOT = Path(__file__).resolve().parents[1]
SLICE = ROOT / "tests" / "data" / "simulate_slice.csv"
EXAMPLE = ROOT / "controller" / "examples" / "simulate.yaml"
PNG = b"\x89PNG\r\n\x1a\n"


pytestmark = pytest.mark.usefixtures("restore_logging")  # `main` re-points the root logger


def tasks(*pairs: tuple[float, float]) -> list[TraceTask]:
    return [TraceTask(arrival, service) for arrival, service in pairs]


def params(**changes: float | int | None) -> BaselineParams:
    # 3.6 $/h makes dollars easy: $0.001 per instance-second
    base = {"boot_s": 30.0, "dph": 3.6, "slots": 1, "tasks_per_instance": 1,
            "horizon_s": 1000.0, "deadline_s": 60.0, "interval_s": 10.0, "cooldown_s": 20.0,
            "sample_s": 100.0}  # fmt: skip
    return BaselineParams(**{**base, **changes})  # type: ignore[arg-type]


# --- baselines


def test_peak_concurrency_counts_half_open_intervals() -> None:
    # [0, 10) and [10, 20) never overlap; [5, 15) overlaps both
    assert baselines.peak_concurrency(tasks((0, 10), (10, 10)), 100) == 1
    assert baselines.peak_concurrency(tasks((0, 10), (10, 10), (5, 10)), 100) == 2
    # a task arriving at the horizon is outside it
    assert baselines.peak_concurrency(tasks((0, 10), (100, 10)), 100) == 1


def test_static_fleet_capped_below_the_peak_makes_the_third_task_wait() -> None:
    # Three overlapping 100 s tasks need 3 one-slot instances; the cap allows 2. The third
    # (arrived at 20) starts when the first ends, at 100: a wait of 80 s > the 60 s deadline.
    # Bill: 2 instances x (1000 s horizon + 30 s boot before the start) = 2060 s = $2.06.
    out = baselines.static_peak(tasks((0, 100), (10, 100), (20, 100)), params(max_instances=2))
    assert out.notes["instances"] == 2
    assert sorted(out.waits) == [0.0, 0.0, 80.0]
    assert out.instance_s == pytest.approx(2060.0)
    fig = out.figures(60.0)
    assert fig["cost_usd"] == pytest.approx(2.06)
    assert fig["gpu_hours"] == pytest.approx(2060 / 3600, abs=0.01)
    assert fig["waits_s"] == {"count": 3, "p50": 0.0, "p95": 80.0, "max": 80.0}
    assert fig["deadline_misses"] == 1


def test_static_fleet_for_the_peak_never_queues() -> None:
    out = baselines.static_peak(tasks((0, 100), (10, 100), (20, 100)), params(slots=2))
    assert out.notes["instances"] == 2  # ceil(3 running / 2 slots)
    assert set(out.waits) == {0.0}


def test_tasks_still_waiting_at_the_horizon_are_censored_there() -> None:
    # No instance at all: both tasks wait until the horizon (1000 s): 900 s and 600 s.
    out = baselines.static_peak(tasks((100, 50), (400, 50)), params(max_instances=0))
    assert sorted(out.waits) == [600.0, 900.0] and out.censored == 2
    assert out.figures(700.0)["deadline_misses"] == 1
    assert out.cost_usd == 0.0


def test_proportional_scales_on_the_queue_and_shrinks_after_the_cooldown() -> None:
    # Polls every 10 s. At 10 the task (arrived at 5) is queued: target 1, launch, ready at 40.
    # It starts at 40 (waited 35 s) and ends at 90; the target is 0 from the poll at 90, and
    # the highest target in the last 20 s is 0 from the poll at 110: the instance goes then.
    # Billed 10 -> 110 = 100 s = $0.10.
    out = baselines.proportional(tasks((5, 50)), params())
    assert out.waits == (35.0,)
    assert out.instance_s == pytest.approx(100.0)
    assert out.cost_usd == pytest.approx(0.10)
    assert out.instances_started == 1 and out.peak_instances == 1
    # by state, poll by poll: booting 10-40, busy 40-90, idle 90-110 (seconds as hours)
    assert out.notes["instance_hours_by_state"] == pytest.approx(
        {"booting": 30 / 3600, "busy": 50 / 3600, "idle": 20 / 3600}, abs=1e-4)  # fmt: skip


def test_proportional_packs_waiting_tasks_on_one_instance() -> None:
    # Two slots, two tasks per instance: the task of 15 joins the one of 5 on the instance
    # launched at 10 (ceil(2/2) = 1); both start at 40 (waits 35 and 25). The 500 s task keeps
    # the target at 1 until it ends at 540; the instance goes at the poll of 560: 550 s billed.
    two = {"slots": 2, "tasks_per_instance": 2}
    out = baselines.proportional(tasks((5, 50), (15, 500)), params(**two))
    assert sorted(out.waits) == [25.0, 35.0]
    assert out.instance_s == pytest.approx(550.0)
    assert out.instances_started == 1


def test_oracle_pays_busy_time_a_boot_per_start_and_short_gaps() -> None:
    # Running tasks: [0,50) 1, [50,100) 2, [100,120) 1, [120,150) 2, [150,170) 1, none until
    # 400, [400,500) 1. One slot: level 1 is on over [0,170) and [400,500): 2 boots + 270 s
    # = 330 s; level 2 over [50,100) and [120,150), the 20 s gap is kept (< a 30 s boot):
    # 1 boot + 80 + 20 = 130 s. Total 460 s, 3 starts, nobody waits.
    trace = tasks((0, 100), (50, 100), (120, 50), (400, 100))
    one = baselines.oracle(trace, params())
    assert one.instance_s == pytest.approx(460.0)
    assert one.cost_usd == pytest.approx(0.46)
    assert one.instances_started == 3 and one.peak_instances == 2
    assert one.waits == (0.0, 0.0, 0.0, 0.0)
    # Two slots: one instance over [0,170) and [400,500): 2 boots + 270 s = 330 s.
    two = baselines.oracle(trace, params(slots=2))
    assert two.instance_s == pytest.approx(330.0)
    assert two.instances_started == 2 and two.peak_instances == 1


def test_oracle_bills_up_to_the_horizon_only() -> None:
    # A task running past the horizon: one boot + 1000 - 100 = 930 s.
    out = baselines.oracle(tasks((100, 5000)), params())
    assert out.instance_s == pytest.approx(930.0)
    assert out.series[-1].spend_usd == pytest.approx(0.93)


def test_on_a_real_slice_the_oracle_is_below_the_static_fleet() -> None:
    trace = load_trace(SLICE)
    p = params(horizon_s=86400.0, boot_s=1735.0, slots=2, tasks_per_instance=2,
               interval_s=60.0, cooldown_s=300.0, deadline_s=3600.0, sample_s=3600.0)  # fmt: skip
    static, oracle = baselines.static_peak(trace, p), baselines.oracle(trace, p)
    assert 0 < oracle.cost_usd < static.cost_usd
    assert len(static.waits) == len(oracle.waits) == len(baselines.within(trace, 86400.0))


def test_the_baselines_stay_pure() -> None:
    """results, fifo and baselines import no files, clock, controller wiring or drawing."""
    allowed = {"__future__", "collections", "collections.abc", "dataclasses", "heapq", "math",
               "typing", "controller.sim.trace", "controller.sim.config", "controller.sim.stats",
               "controller.tools.replay.fifo", "controller.tools.replay.results"}  # fmt: skip
    for name in ("results", "fifo", "baselines"):
        tree = ast.parse((ROOT / "controller" / "tools" / "replay" / f"{name}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert imported <= allowed, (name, imported - allowed)


# --- the replay operator


def test_the_replay_operator_keeps_budgets_and_replaces_what_no_rule_covers() -> None:
    frozen = {"kind": "unmatched", "subject": "instance:10007", "situation": {}}
    veto = {"kind": "guard_veto", "subject": "fleet", "situation": {"proposals": [
        {"action": "scale_to", "params": {"count": 40}}]}}  # fmt: skip
    proposed = {"kind": "low_confidence", "subject": "instance:10008", "situation": {
        "proposals": [{"action": "reboot", "params": {"instance": "10008"}}]}}  # fmt: skip
    sensing = {"kind": "sensing_failure", "subject": "sensor:provider", "situation": {}}
    assert operator.answer(frozen) == "replace"
    assert operator.answer(veto) is None
    assert operator.answer(proposed) == "reboot"
    assert operator.answer(sensing) is None


# --- the trace loader


def test_trace_loader_reads_a_duration_column_with_scales(tmp_path: Path) -> None:
    csv = tmp_path / "jobs.csv"
    csv.write_text("# proofs\nsubmitted,took,gpus\n1000,300,1\n1100,20,2\n1050,900,0\n1400,100,1\n")
    got = load_trace(csv, arrival_col="submitted", service_col="took", filter_gpu_col="gpus",
                     time_scale=0.5, service_scale=2.0)  # fmt: skip
    # the 0-GPU row is dropped; arrivals (t - 1000) x 0.5; services took x 2, no floor
    assert got == [TraceTask(0.0, 600.0), TraceTask(50.0, 40.0), TraceTask(200.0, 200.0)]
    every = load_trace(csv, arrival_col="submitted", service_col="took", filter_gpu_col=None)
    assert len(every) == 4 and every[1] == TraceTask(50.0, 900.0)


def test_trace_loader_caps_service_times(tmp_path: Path) -> None:
    csv = tmp_path / "jobs.csv"
    csv.write_text("creation_time,deletion_time,num_gpu\n0,100,1\n10,90010,1\n20,5020,1\n")
    got = load_trace(csv, max_service_s=3600.0, service_scale=0.5)
    # lifetimes 100, 90000, 5000 halved: 50, 45000 -> 3600, 2500
    assert [t.service_s for t in got] == [50.0, 3600.0, 2500.0]
    floored = load_trace(csv, min_service_s=60.0, max_service_s=3600.0, service_scale=0.5)
    assert [t.service_s for t in floored] == [60.0, 3600.0, 2500.0]  # the floor only when asked
    assert [t.service_s for t in load_trace(csv, max_service_s=10.0)] == [10.0, 10.0, 10.0]


def test_trace_loader_reads_custom_start_and_end_columns(tmp_path: Path) -> None:
    csv = tmp_path / "jobs.csv"
    csv.write_text("start,stop\n500,1700\n400,460\n")
    got = load_trace(csv, arrival_col="start", end_col="stop", filter_gpu_col=None)
    assert got == [TraceTask(0.0, 60.0), TraceTask(100.0, 1200.0)]  # 460 - 400: as recorded


def test_trace_loader_names_path_and_line_of_a_bad_row(tmp_path: Path) -> None:
    csv = tmp_path / "jobs.csv"
    csv.write_text("submitted,took\n0,30\n\n10,-5\n")
    where = re.escape(str(csv))
    with pytest.raises(ValueError, match=rf"^{where}:4: took -5.0 is negative$"):
        load_trace(csv, arrival_col="submitted", service_col="took", filter_gpu_col=None)
    with pytest.raises(ValueError, match=rf"^{where}:2: no column 'duration'$"):
        load_trace(csv, arrival_col="submitted", service_col="duration", filter_gpu_col=None)


# --- the command


def test_simulate_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    argv = ["simulate", "--config", str(EXAMPLE), "--trace", str(SLICE), "--days", "0.25",
            "--report", str(out), "--answer-after-s", "600", "--seed", "3"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out

    doc = json.loads((out / "report.json").read_text())
    arrived = [t for t in load_trace(SLICE) if t.arrival_s < 0.25 * 86400]
    assert doc["tasks"] == len(arrived) > 50
    assert doc["ticks"] == 360 and doc["horizon_s"] == 21600 and doc["seed"] == 3
    assert doc["deadline_s"] == 3600 and doc["trace"]["end_col"] == "deletion_time"
    assert set(doc["policies"]) == {"fleetgate", "static", "proportional", "proportional_sim",
                                    "oracle", "oracle_warm", "oracle_placed",
                                    "oracle_market"}  # fmt: skip
    for fig in doc["policies"].values():
        assert fig["cost_usd"] > 0 and fig["gpu_hours"] > 0
        assert fig["waits_s"]["count"] == len(arrived)
        assert fig["waits_s"]["p50"] <= fig["waits_s"]["p95"] <= fig["waits_s"]["max"]
        assert fig["deadline_misses"] >= 0
    assert doc["policies"]["oracle"]["ratio_to_oracle"] == 1.0
    assert doc["policies"]["oracle"]["waits_s"]["max"] == 0.0
    warm = doc["policies"]["oracle_warm"]  # the lower bound with stop and start
    assert warm["cost_usd"] <= doc["policies"]["oracle"]["cost_usd"]
    assert warm["waits_s"] == doc["policies"]["oracle"]["waits_s"]
    # both act at fleetgate's ticks, as everything in the simulator does
    assert doc["baseline_params"]["tick_s"] == doc["seconds_per_tick"] == 60.0
    assert warm["tick_s"] == doc["policies"]["oracle"]["tick_s"] == 60.0
    assert doc["policies"]["fleetgate"]["ratio_to_oracle_warm"] >= (
        doc["policies"]["fleetgate"]["ratio_to_oracle"])  # fmt: skip
    best = doc["policies"]["oracle_market"]  # on the world's own machines, at their true rates
    assert 0 < best["machines_used"] <= best["machines_usable"] <= 30
    assert best["peak_instances"] <= 30 and best["deadline_misses"] == 0
    assert doc["policies"]["fleetgate"]["ratio_to_oracle_market"] == pytest.approx(
        doc["policies"]["fleetgate"]["cost_usd"] / best["cost_usd"], abs=0.002)  # fmt: skip
    placed = doc["policies"]["oracle_placed"]  # fleetgate's actions: no task ever moves
    assert placed["cost_usd"] >= warm["cost_usd"] - 0.01  # the bound moves tasks for free
    assert placed["waits_s"] == warm["waits_s"]
    assert doc["policies"]["fleetgate"]["ratio_to_oracle_placed"] == pytest.approx(
        doc["policies"]["fleetgate"]["cost_usd"] / placed["cost_usd"], abs=0.002)  # fmt: skip
    fg = doc["fleetgate"]
    assert fg["actions"]["launch"] >= 1 and fg["instance_launches"] >= fg["actions"]["launch"]
    assert fg["tasks_arrived"] == len(arrived) and fg["llm_calls"] == 0
    assert fg["escalations"] == sum(fg["escalations_by_kind"].values())
    assert sum(fg["instance_hours_by_state"].values()) == pytest.approx(
        doc["policies"]["fleetgate"]["gpu_hours"], rel=0.05)  # fmt: skip
    assert doc["wall_s"]["total"] >= doc["wall_s"]["fleetgate"] > 0
    assert set(doc["goals"]) >= {
        "cost_ratio_to_oracle",
        "within_cost_goal",
        "cost_ratio_to_oracle_warm",
        "within_cost_goal_warm",
        "cost_ratio_to_oracle_market",
        "within_cost_goal_market",
        "cost_ratio_to_oracle_placed",
        "within_cost_goal_placed",
        "below_proportional_cost",
        "below_proportional_sim_cost",
    }
    in_world = doc["policies"]["proportional_sim"]
    assert in_world["actions"]["launch"] == in_world["instances_started"] >= 1

    # what the world's faults add to the work, which the oracles never meet
    assert doc["faults"]["task_hazard_per_h"] == pytest.approx(0.095)
    assert doc["faults"]["rework"] == pytest.approx(
        fault_rework([t.service_s for t in arrived], 0.095), abs=1e-4)  # fmt: skip
    assert "faults: a running task is lost at 0.095/h" in printed

    png = (out / "simulate.png").read_bytes()
    assert png.startswith(PNG) and len(png) > 10_000
    assert "policy" in printed and "x oracle" in printed and "goals:" in printed
    assert "the oracles change the fleet only at ticks, as fleetgate does (60 s)" in printed
    for name in ("fleetgate", "static (", "proportional ", "proportional, sim", "oracle ",
                 "oracle, stop/start", "oracle, no moves", "oracle, market"):  # fmt: skip
        assert f"\n{name}" in printed
    goals = next(line for line in printed.splitlines() if line.startswith("goals: "))
    for name in ("oracle", "oracle, stop/start", "oracle, no moves", "oracle, market"):
        assert re.search(rf"[:;] {re.escape(name)}: (not )?met \(\d+\.\d+x\)", goals), name

    # the journal is fleetgate's own: the usual commands read it
    assert main(["--state", str(out / "state"), "actions", "--json"]) == 0
    assert any(a["action"] == "launch" for a in json.loads(capsys.readouterr().out))


def test_simulate_takes_a_duration_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:  # fmt: skip
    csv = tmp_path / "proofs.csv"
    rows = "".join(f"{i * 120},{600 + 60 * (i % 5)}\n" for i in range(30))
    csv.write_text("queued_at,proving_s\n" + rows)
    argv = ["simulate", "--trace", str(csv), "--arrival-col", "queued_at", "--service-col",
            "proving_s", "--gpu-col", "", "--time-scale", "2", "--days", "0.1",
            "--max-service-s", "620", "--report", str(tmp_path / "r")]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert doc["trace"]["service_col"] == "proving_s" and doc["trace"]["time_scale"] == 2.0
    assert doc["tasks"] == 30  # arrivals every 240 s: 0 to 6960, all within 0.1 days (8640 s)
    assert doc["trace"]["max_service_s"] == 620.0
    replayed = (tmp_path / "r" / "state" / "trace.csv").read_text().splitlines()[1:]
    assert max(float(e) - float(a) for a, e, _ in (r.split(",") for r in replayed)) <= 620.0
    assert doc["policies"]["oracle"]["instances_started"] >= 1
    assert "fleetgate" in capsys.readouterr().out


def test_simulate_names_the_bad_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "bad.csv"
    csv.write_text("creation_time,deletion_time,num_gpu\n0,100,1\n50,later,1\n")
    assert main(["simulate", "--trace", str(csv), "--report", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert f"{csv}:3: deletion_time 'later' is not a number" in err
    assert not (tmp_path / "r" / "report.json").exists()


# another `simulate` holding a report directory, in its own process, until its stdin closes
HOLD = ("import sys; from pathlib import Path; from controller.tools.replay.claim import "
        "claim_report; lock = claim_report(Path(sys.argv[1])); print('held', flush=True); "
        "sys.stdin.read()")  # fmt: skip


def test_a_simulate_on_a_report_directory_in_use_stops_and_deletes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    argv = ["simulate", "--config", str(EXAMPLE), "--trace", str(SLICE), "--days", "0.05",
            "--report", str(out)]  # fmt: skip
    with subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as other:  # fmt: skip
        assert other.stdin is not None and other.stdout is not None
        assert other.stdout.readline() == "held\n"
        (out / "state").mkdir()
        journal = out / "state" / "journal.db"
        journal.write_bytes(b"the other run's journal")
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"fleetgate simulate: {out} is in use by another simulate run" in err
        assert "--report DIR" in err
        assert journal.read_bytes() == b"the other run's journal"  # not deleted under it
        assert not (out / "report.json").exists()
        other.stdin.close()  # that run ends (leaving the block waits for it)
    assert main(argv) == 0  # free again once that run has ended
    assert (out / "report.json").is_file() and journal.read_bytes() != b"the other run's journal"


def test_the_faults_add_work_no_policy_avoids_a_task_lost_runs_again_from_its_start() -> None:
    # a 1 h task lost at 1/h: e^1 - 1 hours in expectation (it is run until a try lasts 1 h)
    assert fault_rework([3600.0], 1.0) == pytest.approx(math.e - 2.0)
    # long tasks pay far more than short ones: 4 h at 0.095/h, against 1 min
    assert fault_rework([14400.0], 0.095) == pytest.approx(0.2165, abs=1e-4)
    assert fault_rework([60.0], 0.095) == pytest.approx(0.0008, abs=1e-4)
    # weighted by task time
    both = fault_rework([14400.0, 60.0], 0.095)
    assert both == pytest.approx((14400 * 0.2165 + 60 * 0.0008) / 14460, abs=1e-4)
    assert fault_rework([], 0.095) == 0.0 and fault_rework([600.0], 0.0) == 0.0
    # past any float (e^(0.095 x 8760) for a year-long task): inf, not an OverflowError
    assert fault_rework([60.0, 365 * 86400.0], 0.095) == math.inf
    # the simulator's defaults, and the world without faults that BENCHMARKS.md judges in
    assert task_hazard_per_h(SimConfig()) == pytest.approx(0.095)
    calm = yaml.safe_load((ROOT / "controller" / "examples" / "simulate-no-faults.yaml"
                           ).read_text())["sim"]["world"]  # fmt: skip
    assert task_hazard_per_h(SimConfig.model_validate(calm)) == 0.0


def test_a_task_too_long_to_count_its_rework_still_gets_its_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # an SWF log as the archive has them, one run time the 32-bit maximum (68 years): the
    # faults' expected rework overflowed after the whole replay, and no report was written
    log = tmp_path / "cluster.swf"
    log.write_text("; one job's run time is 2^31 - 1\n"
                   "1 100 5 600 16 590 -1 16 3600 -1 1 1 1 1 1 -1 -1 -1\n"
                   "2 160 0 2147483647 1 39 -1 1 600 -1 1 2 2 2 1 -1 -1 -1\n")  # fmt: skip
    out = tmp_path / "r"
    assert main(["simulate", "--trace", str(log), "--days", "0.02", "--report", str(out)]) == 0
    doc = json.loads((out / "report.json").read_text())
    assert doc["tasks"] == 2 and doc["faults"]["rework"] is None
    assert "past counting (it would almost never run to its end)" in capsys.readouterr().out

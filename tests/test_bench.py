"""`fleetgate bench tick`: structure and consistency of the numbers, never wall-clock limits."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from controller.core import guards
from controller.core.reconcile import VETO_REPEAT_S
from controller.fleet.base import LaunchRequest
from controller.fleet.curio import CurioDemand
from controller.fleet.observe import RealFleet
from controller.fleet.vast import VastProvider
from controller.service import plan as loop
from controller.service.cli import main
from controller.service.config import Config
from controller.sim import SimConfig, Simulation, curio_rows, vast_api
from controller.sim import vast_views as views
from controller.sim.wire import VAST_URL
from controller.store.journal import Journal
from controller.tools.bench.soak import ChurningFleet, forget_world_records, soak_world
from controller.tools.bench.tick import (
    _T0,
    PHASES,
    REAL_PHASES,
    WORLD_PHASES,
    _controller,
    bench_tick,
    render_tick,
    synthetic_instances,
)
from controller.tools.bench.world import mix, sim_controller

pytestmark = pytest.mark.usefixtures("restore_logging")  # `main` re-points the root logger


def test_bench_tick_reports_every_phase_per_size(capsys: pytest.CaptureFixture[str]) -> None:
    patched_before = (loop.advance, loop.build_facts, loop.decide, guards.check)
    assert main(["bench", "tick", "--instances", "10,50", "--repeat", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["path"] == "real"  # the production fleet path unless told otherwise
    assert doc["phases"] == list(REAL_PHASES) and doc["repeat"] == 2
    _check_sizes(doc, [10, 50], 2)
    # the controller's functions are put back after the run
    assert (loop.advance, loop.build_facts, loop.decide, guards.check) == patched_before


def test_the_synthetic_path_reproduces_the_earlier_phases() -> None:
    doc = bench_tick(Config(), [10, 50], 2, path="synthetic")
    assert doc["path"] == "synthetic" and doc["phases"] == list(PHASES)
    _check_sizes(doc, [10, 50], 2)
    assert all(r["wire_calls"] == {} and r["sim_ms"] == {} for r in doc["sizes"])
    with pytest.raises(ValueError, match="path"):
        bench_tick(Config(), [10], 1, path="vast")


def _check_sizes(doc: dict[str, Any], sizes: list[int], ticks: int) -> None:
    assert [r["instances"] for r in doc["sizes"]] == sizes
    for r in doc["sizes"]:
        assert r["ticks"] == ticks and r["mix_stable"]
        assert set(r["phases_ms"]) == set(doc["phases"])
        assert all(v >= 0 for v in r["phases_ms"].values())
        for phase in ("history", "track", "facts", "match", "decide", "journal"):
            assert r["phases_ms"][phase] > 0, phase
        total = r["total_ms"]
        assert total > 0 and r["engine_ms"] > 0 and r["engine_trivial_ms"] > 0
        # medians of 2 ticks are means, and `other` is the rest of each tick: they add up
        assert sum(r["phases_ms"].values()) == pytest.approx(total, rel=0.1, abs=0.5)
        assert r["ratio"] == pytest.approx(total / r["engine_ms"], rel=0.05)
        assert r["ratio_trivial"] == pytest.approx(total / r["engine_trivial_ms"], rel=0.05)
        own = sum(v for k, v in r["phases_ms"].items() if k not in WORLD_PHASES)
        assert 0 < r["own_ms"] < total and r["own_ms"] == pytest.approx(own, rel=0.1, abs=0.5)
        assert r["own_trivial"] == pytest.approx(r["own_ms"] / r["engine_trivial_ms"], rel=0.05)
        assert r["peak_rss_mb"] > 0
        # one fleet fact, two sensors, two demands, one fact per instance
        assert r["facts"] == r["instances"] + 5
        assert r["matches"] > 0 and sum(r["decisions"].values()) > 0


def test_bench_tick_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "tick", "--instances", "10", "--repeat", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["N", "sense", "vast_list"] and "ratio" in lines[0]
    assert "sim" in lines[0].split() and lines[2].startswith("(real path;")
    assert lines[1].split()[0] == "10"
    # headings of two or three words: "x trivial", "own x trivial", "RSS MB"
    assert len(lines[1].split()) == len(lines[0].split()) - 4
    synthetic = render_tick(bench_tick(Config(), [10], 1, path="synthetic")).splitlines()
    assert synthetic[0].split()[:3] == ["N", "sense", "history"]
    assert "sim" not in synthetic[0].split() and synthetic[2].startswith("(synthetic path;")
    assert len(synthetic[1].split()) == len(synthetic[0].split()) - 4


def test_bench_tick_rejects_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "tick", "--instances", "10,0"]) == 2
    assert "--instances" in capsys.readouterr().err
    # read "invalid literal for int() with base 10: '1k'"; 10**20 built a fleet for ever
    for sizes in ("10,1k", "1e3", "ten", "100000000000000000000"):
        assert main(["bench", "tick", "--instances", sizes]) == 2
        err = capsys.readouterr().err
        assert (
            f"--instances wants counts from 1 to 1,000,000 separated by commas, not {sizes!r}"
            in err
        )


def test_the_synthetic_fleet_has_the_stated_mix() -> None:
    fleet = synthetic_instances(1000, 1_700_000_000.0)
    assert len({i.id for i in fleet}) == 1000
    serving = [i for i in fleet if i.stage == "running" and i.daemon == "up"]
    down = [
        i for i in fleet if i.status == "running" and i.stage == "running" and i.daemon == "down"
    ]
    booting = [i for i in fleet if i.stage != "running"]
    dead = [i for i in fleet if i.status == "exited"]
    assert (len(serving), len(down), len(booting), len(dead)) == (940, 20, 30, 10)
    assert {i.stage for i in booting} == {
        "provisioning",
        "loading",
        "registered",
        "params",
        "bench",
    }


# the mix of 200 as the controller sees it once the probe failures persist (status/stage/daemon/
# sidecar): the simulated boot stages registered and params are both "params" to the controller
# (the agent registered, parameters not fetched yet); before the benchmark nothing is probed
MIX_200 = {"exited/running/down/down": 2, "loading/loading/unknown/down": 1,
           "provisioning/provisioning/unknown/down": 2, "running/bench/up/up": 2,
           "running/params/unknown/up": 1, "running/running/down/up": 4,
           "running/running/up/up": 188}  # fmt: skip


def test_the_real_path_times_the_sensing_seams_on_the_same_mix_every_tick() -> None:
    doc = bench_tick(Config(), [200], 3)
    (r,) = doc["sizes"]
    assert r["ticks"] == 3 and r["facts"] == 205  # fleet, 2 sensors, PoRep + all, 200 instances
    assert all(v >= 0 for v in r["phases_ms"].values())
    for phase in ("vast_list", "curio", "health", "records"):
        assert r["phases_ms"][phase] > 0, phase
    assert r["mix"] == MIX_200 and r["mix_stable"]
    calls = r["wire_calls"]  # during the 3 measured ticks, at the simulated seams
    assert calls["vast.list"] == 3 * math.ceil(200 / 25)  # every page of every listing
    assert calls["curio.demand"] == calls["curio.machines"] == calls["curio.liveness"] == 3
    probed = sum(v for k, v in MIX_200.items() if k.split("/")[1] in ("bench", "running"))
    assert calls["probes.status"] == 3 * probed
    assert r["sim_ms"]["vast"] > 0 and sum(r["sim_ms"].values()) < r["total_ms"]


def test_the_real_path_is_the_production_fleet_path_on_a_world_put_back_each_tick(
    tmp_path: Path,
) -> None:
    j = Journal(tmp_path / "j.db")
    clock = [1_700_000_000.0]
    c, bench = sim_controller(Config(), 200, j, clock)
    assert isinstance(c.provider, RealFleet) and isinstance(c.demand, CurioDemand)
    vast = c.provider.vast
    assert isinstance(vast, VastProvider)
    assert vast._client._http.session.get_adapter(VAST_URL + "/api/") is bench.wire.vast
    records = bench.store.records()  # every agent whose container ran, linked by the listing
    assert len(records) == 197  # all but the 3 provisioning or loading
    assert all(r.vast_id and r.machine_id and r.host_and_port for r in records.values())
    mixes, done = [], Counter[str]()
    for step in (240.0, 240.0, 30.0, 30.0, 30.0):
        bench.prepare()
        assert len(bench.sim.world.live_instances()) == 200  # launches and destroys undone
        before = bench.calls()
        mixes.append(mix(c.tick().observation.instances))
        calls = bench.calls() - before
        assert calls["vast.list"] == 8 and calls["curio.machines"] == 1
        done += calls
        clock[0] += step
    assert mixes[1:] == [MIX_200] * 4  # the first tick has not seen the daemons down twice
    assert done["vast.create"] > 0 and done["vast.destroy"] > 0  # it acts through the wire too
    assert bench.wire.agents is not None and bench.wire.agents.service.calls["heartbeat"] > 200
    j.close()


def test_the_churning_fleet_replaces_churn_instances_per_tick_and_obeys_actions() -> None:
    clock = [1_700_000_000.0]
    fleet = ChurningFleet(100, lambda: clock[0], churn=3)
    fleet.prepare()
    seen = {i.id for i in fleet.list_instances()}
    for _ in range(10):
        fleet.prepare()
        ids = {i.id for i in fleet.list_instances()}
        assert len(ids) == 100 and len(ids - seen) == 3
        seen |= ids
    down = next(i for i in fleet.list_instances() if i.daemon == "down" and i.status == "running")
    fleet.restart_daemon(down.id)
    gone = fleet.list_instances()[50].id
    fleet.destroy(gone)
    new = fleet.launch(LaunchRequest(label="fg-x"))
    fleet.prepare()
    now = {i.id: i for i in fleet.list_instances()}
    assert now[down.id].daemon == "up" and gone not in now and now[new].label == "fg-x"


def test_bench_soak_runs_the_controller_run_builds_on_a_world_that_churns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "soak", "--ticks", "90", "--instances", "20", "--sample-every", "30",
                 "--json"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["path"] == "real"  # the production fleet path unless told otherwise
    assert [s["tick"] for s in doc["samples"]] == [30, 45, 60, 90]  # warm-up: half, at most
    assert doc["warmup_ticks"] == 45 and doc["days"] == round(90 * 60 / 86_400, 2)
    assert doc["rss_start_mb"] > 10 and doc["rss_end_mb"] > 10
    # the simulated world rents, fails and gives back instances under the controller's actions
    assert doc["instances_seen"] >= 20 and doc["tasks_completed"] > 0
    assert max(s["live_instances"] for s in doc["samples"]) <= 20  # the cap the world is sized to
    assert doc["samples"][-1]["launched"] == doc["instances_seen"]
    assert all(s["journal_mb"] > 0 and s["median_tick_ms"] > 0 for s in doc["samples"])
    assert set(doc["escalations_answered"]) == {"approved", "denied"}


@pytest.mark.parametrize("argv", [
    ["sim", "--ticks", "0"], ["sim", "--ticks", "-3"],  # statistics.StatisticsError: no median
    ["soak", "--ticks", "0"],  # StopIteration: 0 read as "not given"
    ["soak", "--path", "synthetic", "--ticks", "0"],
    ["soak", "--ticks", "5", "--instances", "5", "--sample-every", "0"],  # ZeroDivisionError
])  # fmt: skip
def test_bench_refuses_a_count_of_zero(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", *argv]) == 2
    assert "must be >= 1" in capsys.readouterr().err


def test_bench_soak_refuses_churn_on_the_real_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "soak", "--ticks", "5", "--churn", "3"]) == 2
    assert "--churn is for --path synthetic" in capsys.readouterr().err


def test_the_soak_forgets_the_simulators_records_and_caches_at_each_sample() -> None:
    config = soak_world(Config(), 10)
    sim = Simulation(SimConfig.model_validate(config.sim.world), seed=1, start=_T0)
    sim.world.counters.waits.extend([1.0, 2.0])
    vast_api._TEXTS[1] = ({}, "{}")
    views._row("10001", next(iter(sim.world.machines.values())), "fg-1", "running", "", _T0)
    assert views._row.cache_info().currsize > 0
    forget_world_records(sim)
    assert sim.world.counters.waits == [] and vast_api._TEXTS == {}
    assert views._row.cache_info().currsize == 0 and curio_rows._node.cache_info().currsize == 0


def test_bench_soak_samples_memory_over_many_ticks_of_the_synthetic_fleet(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "soak", "--path", "synthetic", "--ticks", "40", "--instances", "50",
                 "--sample-every", "20", "--json"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["path"] == "synthetic"
    assert [s["tick"] for s in doc["samples"]] == [4, 20, 40]  # warm-up is a tenth, at most
    assert doc["rss_start_mb"] > 10 and doc["rss_end_mb"] > 10
    assert doc["instances_seen"] == 50 + 10 * 40
    assert all(s["journal_mb"] > 0 and s["median_tick_ms"] > 0 for s in doc["samples"])


def test_a_veto_that_repeats_every_tick_is_journaled_once_per_window(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    clock = [1_700_000_000.0]
    c, fleet = _controller(Config(), 100, j, clock)
    j.meta.put("paused", True)  # every action is vetoed, every tick
    for _ in range(5):
        clock[0] += 30
        fleet.prepare()
        c.tick()
    vetoes = [r for r in j.actions.recent(10_000, executed_only=False) if r["verdict"] == "veto"]
    keys = [(r["action"], r["target"]) for r in vetoes]
    assert vetoes and len(keys) == len(set(keys))  # one row per held action, not one per tick
    clock[0] += VETO_REPEAT_S
    fleet.prepare()
    c.tick()
    again = [r for r in j.actions.recent(10_000, executed_only=False) if r["verdict"] == "veto"]
    again_keys = [(r["action"], r["target"]) for r in again]
    assert all(again_keys.count(k) == 2 for k in keys)  # still held after the window: again
    j.close()


def test_a_cooldown_veto_is_one_veto_though_its_wording_counts_the_seconds(
    tmp_path: Path,
) -> None:
    j = Journal(tmp_path / "j.db")
    clock = [1_700_000_000.0]
    c, fleet = _controller(Config(), 100, j, clock)
    for _ in range(6):  # the daemons stay down: restarts are held by the cooldown, tick on tick
        clock[0] += 30
        fleet.prepare()
        c.tick()
    held = [r for r in j.actions.recent(10_000, executed_only=False) if r["guard"] == "cooldown"]
    keys = [(r["action"], r["target"]) for r in held]
    assert held and len(keys) == len(set(keys))
    j.close()


def test_the_cli_collects_garbage_less_often_than_cpython_by_default() -> None:
    import gc

    from controller.service import gc_tuning

    main(["check"])
    assert gc.get_threshold() == (gc_tuning.YOUNG, gc_tuning.OLDER, gc_tuning.OLDER)
    assert gc_tuning.YOUNG > 700


def test_the_soak_commands_the_docs_print_run_as_printed_but_shorter(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each `bench soak` line of the README and BENCHMARKS.md, as pasted, with `--ticks 12`
    appended (the last one given wins): the printed flags are the parser's and run."""
    root = Path(__file__).resolve().parents[1]
    lines = [line.strip() for doc in ("README.md", "BENCHMARKS.md")
             for line in (root / doc).read_text().splitlines()
             if line.strip().startswith(".venv/bin/fleetgate bench soak")]  # fmt: skip
    assert len(lines) >= 4, lines
    for line in lines:
        words = line.split("#")[0].split()[1:]  # without the program and a trailing comment
        assert main([*words, "--ticks", "12", "--sample-every", "6", "--json"]) == 0, line
        doc = json.loads(capsys.readouterr().out)
        assert doc["path"] == ("synthetic" if "--path synthetic" in line else "real")
        want = words[words.index("--instances") + 1] if "--instances" in words else None
        assert doc["instances"] == int(want or (1000 if doc["path"] == "synthetic" else 200))

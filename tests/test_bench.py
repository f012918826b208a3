"""`fleetgate bench tick`: structure and consistency of the numbers, never wall-clock limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller import guards, loop
from controller.bench_soak import ChurningFleet
from controller.bench_tick import PHASES, _controller, synthetic_instances
from controller.cli import main
from controller.config import Config
from controller.journal import Journal
from controller.providers.base import LaunchRequest

pytestmark = pytest.mark.usefixtures("restore_logging")  # `main` re-points the root logger


def test_bench_tick_reports_every_phase_per_size(capsys: pytest.CaptureFixture[str]) -> None:
    patched_before = (loop.advance, loop.build_facts, loop.decide, guards.check)
    assert main(["bench", "tick", "--instances", "10,50", "--repeat", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["phases"] == list(PHASES) and doc["repeat"] == 2
    assert [r["instances"] for r in doc["sizes"]] == [10, 50]
    for r in doc["sizes"]:
        assert r["ticks"] == 2
        assert set(r["phases_ms"]) == set(PHASES)
        assert all(v >= 0 for v in r["phases_ms"].values())
        for phase in ("history", "track", "facts", "match", "decide", "journal"):
            assert r["phases_ms"][phase] > 0, phase
        total = r["total_ms"]
        assert total > 0 and r["engine_ms"] > 0 and r["engine_trivial_ms"] > 0
        # medians of 2 ticks are means, and `other` is the rest of each tick: they add up
        assert sum(r["phases_ms"].values()) == pytest.approx(total, rel=0.1, abs=0.5)
        assert r["ratio"] == pytest.approx(total / r["engine_ms"], rel=0.05)
        assert r["ratio_trivial"] == pytest.approx(total / r["engine_trivial_ms"], rel=0.05)
        assert r["peak_rss_mb"] > 0
        # one fleet fact, two sensors, two demands, one fact per instance
        assert r["facts"] == r["instances"] + 5
        assert r["matches"] > 0 and sum(r["decisions"].values()) > 0
    # the controller's functions are put back after the run
    assert (loop.advance, loop.build_facts, loop.decide, guards.check) == patched_before


def test_bench_tick_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "tick", "--instances", "10", "--repeat", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["N", "sense"] and "ratio" in lines[0]
    assert lines[1].split()[0] == "10"
    assert len(lines[1].split()) == len(lines[0].split()) - 2  # "x trivial", "RSS MB"


def test_bench_tick_rejects_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "tick", "--instances", "10,0"]) == 2
    assert "--instances" in capsys.readouterr().err


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


def test_bench_soak_samples_memory_over_many_ticks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "soak", "--ticks", "40", "--instances", "50", "--sample-every", "20",
                 "--json"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert [s["tick"] for s in doc["samples"]] == [4, 20, 40]  # warm-up is a tenth, at most
    assert doc["rss_start_mb"] > 10 and doc["rss_end_mb"] > 10
    assert doc["instances_seen"] == 50 + 10 * 40
    assert all(s["journal_mb"] > 0 and s["median_tick_ms"] > 0 for s in doc["samples"])


def test_a_veto_that_repeats_every_tick_is_journaled_once_per_window(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    clock = [1_700_000_000.0]
    c, fleet = _controller(Config(), 100, j, clock)
    j.put("paused", True)  # every action is vetoed, every tick
    for _ in range(5):
        clock[0] += 30
        fleet.prepare()
        c.tick()
    vetoes = [r for r in j.actions(10_000, executed_only=False) if r["verdict"] == "veto"]
    keys = [(r["action"], r["target"]) for r in vetoes]
    assert vetoes and len(keys) == len(set(keys))  # one row per held action, not one per tick
    clock[0] += loop.VETO_REPEAT_S
    fleet.prepare()
    c.tick()
    again = [r for r in j.actions(10_000, executed_only=False) if r["verdict"] == "veto"]
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
    held = [r for r in j.actions(10_000, executed_only=False) if r["guard"] == "cooldown"]
    keys = [(r["action"], r["target"]) for r in held]
    assert held and len(keys) == len(set(keys))
    j.close()


def test_the_cli_collects_garbage_less_often_than_cpython_by_default() -> None:
    import gc

    from controller import gc_tuning

    main(["check"])
    assert gc.get_threshold() == (gc_tuning.YOUNG, gc_tuning.OLDER, gc_tuning.OLDER)
    assert gc_tuning.YOUNG > 700

"""`fleetgate bench tick`: structure and consistency of the numbers, never wall-clock limits."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from controller import guards, loop
from controller.bench_tick import PHASES, synthetic_instances
from controller.cli import main


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """`main` points the root logger at this test's captured stderr; put it back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


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
    assert lines[1].split()[0] == "10" and len(lines[1].split()) == len(lines[0].split()) - 1


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

"""track.advance: history and the events each tick reveals."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from controller.core.facts import build_facts
from controller.core.model import Instance, Observation, SensorStatus
from controller.core.track import (
    NO_DEBOUNCE,
    Debounce,
    History,
    Track,
    _parked,
    advance,
    debounced,
)

OK = (SensorStatus("provider", "ok"), SensorStatus("demand", "ok"))


def inst(**kw: Any) -> Instance:
    base = dict(id="1", label="l", machine_id="m1", host_id="h1", status="running",
                stage="running", daemon="up", sidecar="up", tasks_running=1,
                daemon_uptime_s=100.0)  # fmt: skip
    return Instance(**{**base, **kw})


def step(
    hist: History, now: float, *instances: Instance, sensors: Any = OK
) -> tuple[History, list[Any]]:
    tracks, events = advance(hist, Observation(now, tuple(instances), (), sensors), now)
    keep = tuple(e for e in events if e.kind in ("death", "restart"))
    return replace(hist, instances=tracks, events=hist.events + keep), events


def kinds(events: list[Any]) -> list[str]:
    return [e.kind for e in events]


def test_first_sight_stage_changes_and_ages() -> None:
    h, ev = step(History(), 0, inst(stage="params", daemon="down", daemon_uptime_s=None))
    assert kinds(ev) == ["seen"]
    h, ev = step(h, 60, inst(stage="params", daemon="down", daemon_uptime_s=None))
    assert ev == []
    h, ev = step(h, 120, inst(stage="bench", daemon="up", daemon_uptime_s=5.0))
    assert kinds(ev) == ["stage"] and ev[0].detail == {"from": "params", "to": "bench"}
    facts = build_facts(Observation(300, (inst(stage="bench"),), (), OK), h, 300)
    f = next(x for x in facts if x["kind"] == "instance")
    assert f["stage_age_s"] == 180 and f["age_s"] == 300


def test_death_restart_and_a_restart_hidden_between_ticks() -> None:
    h, _ = step(History(), 0, inst())
    h, ev = step(h, 60, inst(daemon="down", daemon_uptime_s=None))
    assert kinds(ev) == ["death"]
    h, ev = step(h, 120, inst(daemon_uptime_s=10.0))
    assert kinds(ev) == ["restart"]
    h, ev = step(h, 180, inst(daemon_uptime_s=5.0))  # uptime went backwards: died and came back
    assert kinds(ev) == ["death", "restart"]
    facts = build_facts(Observation(200, (inst(),), (), OK), h, 200)
    f = next(x for x in facts if x["kind"] == "instance")
    assert (f["restarts_1h"], f["deaths_1h"]) == (2, 2)
    later = build_facts(Observation(4000, (inst(),), (), OK), h, 4000)
    assert next(x for x in later if x["kind"] == "instance")["restarts_1h"] == 0


def up(now: float, uptime: float, late_s: float = 0.0) -> Instance:
    """The daemon as probed at `now` (the answer's estimate of its start `late_s` late)."""
    return inst(daemon_uptime_s=uptime, daemon_started_at=now - uptime + late_s)


def test_a_restart_whose_uptime_grew_past_the_last_answers_is_counted() -> None:
    """Up 30 s at the probe at 0, restarted at 20, up 40 s at the probe at 60: the uptime went
    up, and only the start it dates shows the restart."""
    h, _ = step(History(), 0, up(0, 30))
    h, ev = step(h, 60, up(60, 40))
    assert kinds(ev) == ["death", "restart"]
    assert ev[1].detail == {"uptime_before": 30.0, "uptime_now": 40.0, "started_later_s": 50.0}
    h, ev = step(h, 120, up(120, 100))
    assert ev == [] and h.instances["1"].started == 20.0
    facts = build_facts(Observation(120, (up(120, 100),), (), OK), h, 120)
    assert next(f for f in facts if f["kind"] == "instance")["restarts_1h"] == 1


def test_estimates_of_one_start_that_disagree_by_seconds_are_one_start() -> None:
    """Whole-second uptimes, a probe whose request took 3 s to arrive (its estimate early),
    clocks that drift apart: no restart; the latest estimate is kept, so a drift that pulls
    the estimates early is followed once it passes the slack, and a real restart still shows."""
    h, _ = step(History(), 0, up(0, 500))
    for n, late in enumerate([-0.9, 0.4, -3.0, 0.9, -0.2], start=1):
        h, ev = step(h, 60 * n, up(60 * n, 500 + 60 * n, late))
        assert ev == [], late
    assert h.instances["1"].started == -500 + 0.9
    for n in range(6, 60):  # the estimate drifts 1 s earlier a tick, then 1 s later a tick
        drift = -(n - 5) if n < 30 else -25 + (n - 30)
        h, ev = step(h, 60 * n, up(60 * n, 500 + 60 * n, drift))
        assert ev == [], n
    h, ev = step(h, 3600, up(3600, 5))  # restarted 5 s ago
    assert kinds(ev) == ["death", "restart"]


def test_a_restart_behind_a_failed_probe_is_counted() -> None:
    """A probe that failed while the daemon restarted is a blip (it stays up), and the answer
    after it, from the new daemon, dates a later start."""
    d = Debounce(count=2, after_s=60.0)
    obs = [up(0, 1000), inst(daemon="down", daemon_uptime_s=None), up(120, 30)]
    hist, seen = History(), []
    for now, probe_ in zip((0.0, 60.0, 120.0), obs, strict=True):
        tracks, events = advance(hist, Observation(now, (probe_,), (), OK), now, d)
        hist, seen = replace(hist, instances=tracks), [*seen, kinds(events)]
    assert seen == [["seen"], [], ["death", "restart"]]


def test_a_daemon_back_from_a_stop_is_started_and_back_from_a_death_restarted() -> None:
    """Parked and started three times in an hour, a warm instance's daemon restarted nothing
    (three would refuse its next restart and replace it at its next death, as a crash loop);
    a daemon that died and came back through a reboot did restart."""
    h, _ = step(History(), 0, inst())
    now = 0
    for _ in range(3):
        h, ev = step(h, now + 60, inst(status="stopped", daemon="down", daemon_uptime_s=None))
        h, ev2 = step(h, now + 120, inst(status="loading", daemon="down", daemon_uptime_s=None))
        h, ev3 = step(h, now + 180, inst(daemon_uptime_s=10.0))
        assert "death" not in kinds(ev + ev2 + ev3) and "restart" not in kinds(ev + ev2 + ev3)
        now += 180
    facts = build_facts(Observation(now, (inst(),), (), OK), h, now)
    assert next(f for f in facts if f["kind"] == "instance")["restarts_1h"] == 0
    h, ev = step(h, now + 60, inst(daemon="down", daemon_uptime_s=None))
    h, ev2 = step(h, now + 120, inst(status="rebooting", daemon="down", daemon_uptime_s=None))
    h, ev3 = step(h, now + 180, inst(daemon_uptime_s=10.0))
    assert (kinds(ev), kinds(ev2), kinds(ev3)) == (["death"], ["status"], ["status", "restart"])


def test_down_for_and_idle_for() -> None:
    h, _ = step(History(), 0, inst())
    h, _ = step(h, 60, inst(daemon="down", daemon_uptime_s=None, tasks_running=0))
    facts = build_facts(Observation(150, (inst(daemon="down", tasks_running=0),), (), OK), h, 150)
    f = next(x for x in facts if x["kind"] == "instance")
    assert f["down_for_s"] == 90 and f["idle_for_s"] == 90
    h, _ = step(h, 200, inst(tasks_running=2))
    assert h.instances["1"].idle_since is None


def test_vanished_instances_are_gone_but_not_when_the_listing_failed() -> None:
    h, _ = step(History(), 0, inst(), inst(id="2"))
    failed = (SensorStatus("provider", "failed", "boom"), OK[1])
    h2, ev = step(h, 60, sensors=failed)
    assert ev == [] and set(h2.instances) == {"1", "2"}
    h3, ev = step(h, 60, inst())
    assert kinds(ev) == ["gone"] and ev[0].instance_id == "2" and set(h3.instances) == {"1"}


# ---- health debounce: a failed probe is a death only once failures persist -----------------
def probed(hist: History, now: float, daemon: str, d: Debounce) -> tuple[History, str, list[str]]:
    obs = Observation(now, (inst(daemon=daemon, daemon_uptime_s=None if daemon != "up" else
                                 now),), (), OK)  # fmt: skip
    tracks, events = advance(hist, obs, now, d)
    seen = debounced(obs, tracks).instances[0].daemon
    return replace(hist, instances=tracks), seen, kinds(events)


def test_a_daemon_counts_as_down_only_after_failures_that_persist() -> None:
    d = Debounce(count=2, after_s=60.0)
    hist, seen, _ = probed(History(), 0.0, "up", d)
    hist, seen, evs = probed(hist, 100.0, "down", d)
    assert seen == "up" and "death" not in evs  # one blip: still up
    hist, seen, evs = probed(hist, 130.0, "down", d)
    assert seen == "up" and "death" not in evs  # two, but within 60 s
    hist, seen, evs = probed(hist, 170.0, "down", d)
    assert seen == "down" and evs == ["death"]  # persisted: one death
    facts = build_facts(Observation(170.0, (inst(daemon="down"),), (), OK), hist, 170.0)
    fact = next(f for f in facts if f["kind"] == "instance")
    assert fact["down_for_s"] == 0.0  # down from now on
    hist, seen, evs = probed(hist, 200.0, "up", d)
    assert seen == "up" and evs == ["restart"] and hist.instances["1"].probe_fails == 0
    hist, seen, _ = probed(hist, 210.0, "down", d)
    assert seen == "up" and hist.instances["1"].probe_failing_since == 210.0  # counting anew


def test_without_debounce_one_failed_probe_is_down_and_unprobed_daemons_reset_the_count() -> None:
    hist, seen, evs = probed(History(), 0.0, "up", NO_DEBOUNCE)
    hist, seen, evs = probed(hist, 10.0, "down", NO_DEBOUNCE)
    assert seen == "down" and evs == ["death"]
    d = Debounce(count=3, after_s=0.0)
    hist, _, _ = probed(History(), 0.0, "up", d)
    hist, _, _ = probed(hist, 10.0, "down", d)
    hist, seen, _ = probed(hist, 20.0, "unknown", d)  # not probed this tick
    assert seen == "unknown" and hist.instances["1"].probe_fails == 0


def test_a_failed_probe_read_as_up_is_no_answer_from_the_status_server() -> None:
    d = Debounce(count=2, after_s=60.0)
    hist, seen, _ = probed(History(), 0.0, "down", d)
    assert seen == "up" and not hist.instances["1"].answered  # a blip, not an answer
    hist, seen, _ = probed(hist, 100.0, "down", d)
    assert seen == "down" and not hist.instances["1"].answered
    hist, seen, _ = probed(hist, 130.0, "up", d)
    assert hist.instances["1"].answered
    hist, seen, _ = probed(hist, 200.0, "down", d)
    assert hist.instances["1"].answered  # once answered, for good


def test_a_track_stored_before_probe_counting_loads_and_stays_down() -> None:
    old = Track("1", "m1", 0.0, "running", 0.0, "running", 0.0, "down", 5.0)
    hist = History(instances={"1": old})
    _, seen, evs = probed(hist, 10.0, "down", Debounce(count=5, after_s=600.0))
    assert seen == "down" and "death" not in evs


def test_the_parked_fields_are_what_the_parking_rules_give_for_every_instance() -> None:
    """`advance` asks `_parked` only of an instance with a journaled stop or parked fields;
    every other one gets what `_parked` answers for it all the same, in every combination."""
    now, stamps = 10_000.0, (None, 1_000.0, 5_000.0, 9_500.0)
    olds = [None] + [
        Track(f"i{n}", "m1", 0.0, "running", 0.0, status, 0.0, "up", 0.0,
              parked_since=since, start_asked=asked, left_stop=left)
        for n, (status, since, asked, left) in enumerate(
            (s, a, b, c) for s in ("running", "stopped") for a in stamps for b in stamps
            for c in stamps
        )
    ]  # fmt: skip
    for old in olds:
        for status in ("running", "stopped", "loading"):
            for stop, start in ((None, None), (2_000.0, None), (None, 3_000.0), (9_000.0, 4.0)):
                iid = old.id if old is not None else "new"
                acted = {f"{a}:instance:{iid}": t for a, t in (("stop", stop), ("start", start))
                         if t is not None}  # fmt: skip
                hist = History(instances={iid: old} if old else {}, last_acted=acted)
                tracks, _ = advance(hist, Observation(now, (inst(id=iid, status=status),), (),
                                                      OK), now)  # fmt: skip
                t = tracks[iid]
                got = (t.parked_since, t.start_asked, t.left_stop)
                assert got == _parked(old, inst(id=iid, status=status), hist, now), (old, acted)

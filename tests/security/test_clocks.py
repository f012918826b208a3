"""Steps of the wall clock and a journal lost under a running controller change nothing in
the fleet, and people are told; so are ticks that keep failing.

One test per failure seen before: after a crash and a 2 h step back the dead holder's SQLite
lease had 7,196 s left and the restarted controller stood by, silently; a 2 h step forward had
every booting instance replaced as "stuck"; a journal deleted while running went unnoticed (the
controller went on launching into a file nobody could read); failing ticks never escalated.

The controller runs on the simulator (the production fleet path on a simulated wire, real
SQLite journal in tmp_path). The simulator's virtual clock is the physical time (what the
monotonic clock measures); the wall clock the controller is given reads that plus a step the
test sets, which is what a stepped host clock is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support import BACKENDS, PG_DSN, fail_fleet_reads, journal_on, peer

from controller.service.app import App
from controller.service.assemble import assemble
from controller.service.config import Config
from controller.service.schedule import Runner
from controller.service.tick import FAILURES_TO_ESCALATE, Controller
from controller.store.backend import JournalError, SQLiteStore
from controller.store.journal import Journal
from controller.store.lease import Lease, read

TWO_HOURS = 7200.0


class Stepped:
    """The wall clock of a host: the physical time (the simulator's) plus `step`."""

    def __init__(self, physical: Callable[[], float]) -> None:
        self.physical, self.step = physical, 0.0

    def __call__(self) -> float:
        return self.physical() + self.step


def on_wall_clock(app: App, wall: Stepped) -> Controller:
    """`app`'s controller as `fleetgate run` builds it on a real host: given the wall clock,
    watched against the monotonic one (here the simulator's physical time)."""
    assert app.sim is not None
    old = app.controller
    c = Controller(journal=old.journal, provider=old.provider, demand=old.demand,
                   rules=old.rules, settings=old.settings, escalator=old.escalator, clock=wall,
                   before_tick=old.before_tick, after_tick=old.after_tick, on_gone=old.on_gone,
                   actions=old.actuator.provider, debounce=old.debounce,
                   monotonic=app.sim.now)  # fmt: skip
    app.controller = c
    return c


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    a = assemble(Config(), state=tmp_path / "state", clock=time.time, sleep=time.sleep)
    try:
        yield a
    finally:
        a.close()


def tick_actions(j: Journal, tick_id: int) -> list[dict[str, Any]]:
    return [r for r in j.actions.recent(500, executed_only=False) if r.get("tick_id") == tick_id]


def escalations_about(j: Journal, subject: str) -> list[dict[str, Any]]:
    return [e for e in j.escalations.recent() if e["subject"] == subject]


def delivered(app: App, subject: str) -> list[dict[str, Any]]:
    """What the file channel (escalations.jsonl in the state dir) received about `subject`."""
    path = app.state / "escalations.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [d for d in map(json.loads, lines) if subject in json.dumps(d)]


def booting(app: App) -> int:
    tracks = app.journal.fleet.history(app.controller.clock()).instances.values()
    return sum(1 for t in tracks if t.stage in ("provisioning", "loading", "registered", "params"))


# ---- the lease ---------------------------------------------------------------------------------


def test_a_dead_holders_lease_does_not_outlive_its_ttl_after_a_step_back_sqlite(
    tmp_path: Path,
) -> None:
    now = [1_750_000_000.0]
    dead = Journal(SQLiteStore(tmp_path / "j.db", clock=lambda: now[0]))
    assert Lease(dead, "host:111", ttl_s=15).renew()  # leads, then the process crashes
    now[0] -= TWO_HOURS  # the host's clock is stepped back two hours before the restart
    restarted = Journal(SQLiteStore(tmp_path / "j.db", clock=lambda: now[0]))
    state = read(restarted, ttl_s=15)
    assert state.expires_in_s > TWO_HOURS - 15 and not state.live  # the row, and its verdict
    lease = Lease(restarted, "host:222", ttl_s=15)
    assert lease.renew() and lease.token == 2  # taken over at once, with the next token
    assert lease.may_act()
    dead.close()
    restarted.close()


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_lease_further_ahead_than_its_ttl_is_expired_on_any_backend(
    kind: str, tmp_path: Path
) -> None:
    """On PostgreSQL the lease runs on the database's clock: a step back of that clock leaves
    the dead holder's expiry two hours ahead, which is what the row is set to here."""
    with journal_on(kind, tmp_path) as j:
        assert Lease(j, "dead", ttl_s=15).renew()
        with j.tx() as db:
            db.execute("UPDATE leases SET expires_at = expires_at + ?", (TWO_HOURS,))
        other = peer(j)
        lease = Lease(other, "alive", ttl_s=15)
        assert lease.renew() and lease.token == 2
        assert read(other).holder == "alive" and read(other).live
        other.close()


def test_a_restarted_controller_ticks_despite_the_dead_holders_stepped_lease(
    tmp_path: Path,
) -> None:
    """Through the Runner as `fleetgate run` drives it: before, it stood by for two hours."""
    j = Journal(tmp_path / "j.db")
    assert Lease(j, "host:111", ttl_s=2, margin_s=0.5).renew()
    with j.tx() as db:  # the dead holder wrote its expiry by a clock two hours ahead
        db.execute("UPDATE leases SET expires_at = expires_at + ?", (TWO_HOURS,))
    ticks: list[float] = []
    runner = Runner(lambda: ticks.append(time.monotonic()), 0.05, max_ticks=2,
                    lease=Lease(peer(j), "host:222", ttl_s=2, margin_s=0.5),
                    renew_s=0.5)  # fmt: skip
    t = threading.Thread(target=runner.run, daemon=True)
    t.start()
    t.join(timeout=10)
    runner.stop.set()
    t.join(timeout=10)
    assert len(ticks) == 2 and runner.standby == 0
    assert read(j).holder == "host:222" or not read(j).live  # released on the clean stop
    j.close()


# ---- the scheduler -----------------------------------------------------------------------------


def test_the_schedule_goes_on_when_the_wall_clock_steps_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """APScheduler reads the wall clock; stepped back by two hours while it waits, it waited
    out the two hours. The intervals are the monotonic clock's now."""
    step = [0.0]
    real = datetime

    class Wall(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return real.now(tz) - timedelta(seconds=step[0])

    import apscheduler.executors.base
    import apscheduler.schedulers.base

    import controller.service.schedule as schedule

    for module in (apscheduler.schedulers.base, apscheduler.executors.base, schedule):
        monkeypatch.setattr(module, "datetime", Wall)
    ticks: list[float] = []

    def tick() -> None:
        ticks.append(time.monotonic())
        if len(ticks) == 3:
            step[0] = TWO_HOURS

    runner = Runner(tick, 0.1, max_ticks=8)
    t = threading.Thread(target=runner.run, daemon=True)
    t.start()
    t.join(timeout=15)
    runner.stop.set()
    t.join(timeout=10)
    assert len(ticks) == 8, f"{len(ticks)} ticks: the schedule stopped at the step"
    assert ticks[-1] - ticks[2] < 8


# ---- steps of the wall clock between ticks -----------------------------------------------------


def test_a_forward_step_replaces_no_booting_instance(app: App) -> None:
    wall = Stepped(app.sim.now)  # type: ignore[union-attr]
    c = on_wall_clock(app, wall)
    for _ in range(15):
        c.tick()
    assert booting(app) > 0
    assert not [r for r in app.journal.actions.recent(500) if r["action"] == "replace"]
    wall.step = TWO_HOURS  # NTP, a restored VM, `date -s`
    c.tick()
    held = app.journal.meta.ticks(1)[0]
    assert "held" in held["summary"] and "forward by 7200 s" in held["summary"]["held"]
    assert tick_actions(app.journal, int(held["id"])) == []
    for _ in range(3):  # and the controller's own time goes on: nothing looks stuck
        c.tick()
    replaced = [r for r in app.journal.actions.recent(500, executed_only=False)
                if r["action"] == "replace"]  # fmt: skip
    assert replaced == [], [r["reason"] for r in replaced]
    assert abs(c.clock() - app.sim.now()) < 1  # type: ignore[union-attr]
    assert [e["status"] for e in escalations_about(app.journal, "clock")] == ["pending"]
    assert delivered(app, "jumped forward by 7200 s")


def test_a_step_back_holds_the_tick_and_time_goes_on(app: App) -> None:
    wall = Stepped(app.sim.now)  # type: ignore[union-attr]
    c = on_wall_clock(app, wall)
    for _ in range(5):
        c.tick()
    before = c.clock()
    wall.step = -TWO_HOURS
    c.tick()
    held = app.journal.meta.ticks(1)[0]
    assert "back by 7200 s" in held["summary"]["held"]
    assert tick_actions(app.journal, int(held["id"])) == []
    assert c.clock() > before  # continuous, not two hours back
    c.tick()
    assert "held" not in app.journal.meta.ticks(1)[0]["summary"]
    assert escalations_about(app.journal, "clock")


def test_a_restart_after_a_step_back_holds_its_first_tick_and_says_so(app: App) -> None:
    """A new process has no monotonic reading to compare: the journal's last tick is."""
    wall = Stepped(app.sim.now)  # type: ignore[union-attr]
    c = on_wall_clock(app, wall)
    for _ in range(5):
        c.tick()
    last = app.journal.meta.last_now()
    assert last is not None
    wall.step = -TWO_HOURS
    restarted = on_wall_clock(app, wall)  # a new process: a new watch of the clock
    restarted.tick()
    summary = app.journal.meta.ticks(1)[0]["summary"]
    assert "journal's last tick" in summary["held"]
    assert restarted.clock() >= last  # it resumes where the journal left off
    restarted.tick()
    assert "held" not in app.journal.meta.ticks(1)[0]["summary"]


def test_a_step_back_is_not_told_to_restart_which_would_hold_and_page_again(app: App) -> None:
    """The message said "restart it to take the wall clock as it is"; a restarted controller
    resumes from the journal's last tick, holds its first tick and pages again, saying the
    same."""
    wall = Stepped(app.sim.now)  # type: ignore[union-attr]
    c = on_wall_clock(app, wall)
    for _ in range(5):
        c.tick()
    wall.step = -TWO_HOURS
    c.tick()
    restarted = on_wall_clock(app, wall)  # as the message asked, a restart
    restarted.tick()
    first, again = escalations_about(app.journal, "clock")[::-1]
    assert "journal's last tick" in again["summary"]  # the restart held and paged again
    for esc in (first, again):
        [sent] = [d for d in delivered(app, "clock") if d["id"] == esc["id"]]
        assert "restart it" not in sent["message"]
        assert (
            "also after a restart, which resumes from the journal's last tick: check the "
            "host's time synchronisation; ticks go on acting from the next one"
        ) in sent["message"]


def test_a_forward_step_says_a_restart_takes_the_wall_clock_as_it_is(app: App) -> None:
    wall = Stepped(app.sim.now)  # type: ignore[union-attr]
    c = on_wall_clock(app, wall)
    for _ in range(3):
        c.tick()
    wall.step = TWO_HOURS
    c.tick()
    [sent] = delivered(app, "jumped forward by 7200 s")
    assert (
        "(+7200 s from the wall clock) until it is restarted: check the host's time "
        "synchronisation, then restart it to take the wall clock as it is"
    ) in sent["message"]


# ---- the journal lost under a running controller -----------------------------------------------


def remove_sqlite(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


@pytest.mark.parametrize("how", ["deleted", "replaced", "wal_deleted"])
def test_a_journal_lost_while_running_stops_all_acting(app: App, how: str) -> None:
    c = app.controller
    for _ in range(3):
        c.tick()
    path = app.state / "journal.db"
    assert path.exists()
    if how == "wal_deleted":  # its commits since the last checkpoint: the connection went
        Path(f"{path}-wal").unlink()  # on writing them where nobody reads, lost in a crash
    else:
        remove_sqlite(path)
    if how == "replaced":  # a restore, or another controller's fresh journal
        Journal(path).close()
    launched = app.sim.stats["instances_launched"]  # type: ignore[union-attr]
    would_act = 0
    for _ in range(4):
        planned = c.tick()
        would_act += sum(1 for d in planned.plan.decisions if d.verdict == "act")
    assert would_act > 0  # the plan wanted to launch...
    assert app.sim.stats["instances_launched"] == launched  # type: ignore[union-attr]
    assert c.lost is not None
    esc = escalations_about(app.journal, "journal")
    assert len(esc) == 1 and esc[0]["status"] == "pending"
    assert delivered(app, "acts on nothing until it is restarted")


def test_a_postgresql_journal_whose_identity_changed_stops_acting(tmp_path: Path) -> None:
    with journal_on("postgres", tmp_path) as j:
        schema = j.store.schema  # type: ignore[attr-defined]
        env = {"DSN": PG_DSN}
        from controller.service.config import parse_config

        text = f"journal: {{dsn: {{env: DSN}}, schema_name: {schema}}}\n"
        a = assemble(parse_config("pg.yaml", text, env), state=tmp_path / "state",
                     clock=time.time, sleep=time.sleep)  # fmt: skip
        try:
            c = a.controller
            for _ in range(3):
                c.tick()
            with j.tx() as db:  # the schema dropped and made again, or the row deleted
                db.execute("DELETE FROM kv WHERE key = 'journal_id'")
            launched = a.sim.stats["instances_launched"]  # type: ignore[union-attr]
            for _ in range(3):
                c.tick()
            assert a.sim.stats["instances_launched"] == launched  # type: ignore[union-attr]
            assert c.lost is not None and "identity" in c.lost
            assert escalations_about(a.journal, "journal")
        finally:
            a.close()


# ---- ticks that keep failing -------------------------------------------------------------------


def test_ticks_failing_in_a_row_are_escalated_and_resolve_when_ticks_work(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = app.controller
    c.tick()
    restore = fail_fleet_reads(monkeypatch, app.journal)
    for n in range(FAILURES_TO_ESCALATE):
        assert escalations_about(app.journal, "controller") == []
        with pytest.raises(JournalError):
            c.tick()
        # each failed tick has its row, never finished (what the failure metrics count)
        ticks = app.journal.meta.ticks(limit=100)
        assert len(ticks) == 2 + n and ticks[0]["finished_at"] is None
    esc = escalations_about(app.journal, "controller")
    assert len(esc) == 1 and esc[0]["status"] == "pending"
    assert f"{FAILURES_TO_ESCALATE} ticks in a row failed" in esc[0]["summary"]
    [sent] = delivered(app, "disk I/O error")
    # the failed tick sensed nothing: the message says so rather than print empty lines
    assert "Fleet:  not known (not sensed this tick)\n" in sent["message"]
    assert "Budget: not known (not sensed this tick)\n" in sent["message"]
    with pytest.raises(JournalError):
        c.tick()  # still failing: the same escalation, not one per tick
    assert len(escalations_about(app.journal, "controller")) == 1
    restore()
    c.tick()
    ticks = app.journal.meta.ticks(limit=100)
    failed = [True] * (FAILURES_TO_ESCALATE + 1)
    assert [t["finished_at"] is None for t in ticks] == [False, *failed, False]
    assert [e["status"] for e in escalations_about(app.journal, "controller")] == ["resolved"]
    assert c.failures == 0


def test_the_answers_printed_for_a_lost_journal_answer_nothing_in_another(app: App) -> None:
    """The lost journal's escalation #N is not #N of the file on disk now (a restore, another
    controller's fresh journal): the printed deny, run as pasted, would have denied that
    one. It carries the escalation's fingerprint and refuses."""
    c = app.controller
    for _ in range(3):
        c.tick()
    path = app.state / "journal.db"
    remove_sqlite(path)
    Journal(path).close()
    for _ in range(2):
        c.tick()
    [lost] = escalations_about(app.journal, "journal")
    [text] = [d["message"] for d in delivered(app, "acts on nothing until it is restarted")]
    [deny] = [x.split(":", 1)[1].strip() for x in text.splitlines() if x.startswith("Deny:")]
    assert deny.endswith(f"deny {lost['id']} --fingerprint {lost['fingerprint']}")
    other = Journal(path)  # the file on disk: an escalation of its own under the same number
    while (n := other.escalations.add_escalation(
            fingerprint="other", kind="unmatched", subject="instance:9", summary="x", now=1.0,
            deadline=4e9, situation={"kind": "unmatched"},
            default_action={"action": "hold", "params": {}})) < lost["id"]:  # fmt: skip
        pass
    other.close()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = subprocess.run(["bash", "-c", deny], env=env, cwd=app.state, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert run.returncode == 2 and "not the one the message was about" in run.stderr, run
    again = Journal(path)
    try:
        assert again.escalations.escalation(n)["status"] == "pending"  # type: ignore[index]
    finally:
        again.close()

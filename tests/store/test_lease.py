"""The leader lease and its fencing token, on both journal backends."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from support import journal_on, peer

from controller.service.cli import main
from controller.service.schedule import Runner
from controller.store.actions import Fence
from controller.store.backend import JournalError, StaleLeader
from controller.store.journal import Journal
from controller.store.lease import Lease, read


def act(j: Journal, target: str = "instance:1") -> int:
    return j.actions.record(tick_id=None, now=1.0, action="reboot", target=target, params={},
                            proposer="rule:r", reason="r", confidence=1.0, verdict="act",
                            why="w", status="intent")  # fmt: skip


def test_one_leads_and_its_actions_carry_the_token(j: Journal) -> None:
    other = peer(j)
    a, b = Lease(j, "a", ttl_s=30, margin_s=1), Lease(other, "b", ttl_s=30, margin_s=1)
    assert a.renew() and a.token == 1
    assert not b.renew() and b.token is None and other.actions.fence is None
    assert a.renew() and a.token == 1  # renewing keeps the term
    assert a.may_act() and not b.may_act()
    aid = act(j)
    assert [r["token"] for r in j.actions.recent() if r["id"] == aid] == [1]
    state = read(other)
    assert (state.holder, state.token, state.live) == ("a", 1, True)
    assert 29 < state.expires_in_s <= 30
    other.close()


def test_a_stale_leader_is_refused_and_nothing_is_written(j: Journal) -> None:
    other = peer(j)
    a, b = Lease(j, "a", ttl_s=0.3, margin_s=0.1), Lease(other, "b", ttl_s=30, margin_s=1)
    assert a.renew()
    time.sleep(0.4)  # a stops renewing (paused, partitioned) and its lease runs out
    with pytest.raises(StaleLeader, match="expired"):
        act(j)
    assert not a.may_act()
    assert b.renew() and b.token == 2  # a new term, a new token
    with pytest.raises(StaleLeader, match="held by b"):
        act(j)  # a still believes it leads: the store refuses it
    assert [r["target"] for r in j.actions.recent()] == []
    act(other, "instance:2")
    assert not a.renew() and not a.leading  # a learns it lost, and stands by
    with pytest.raises(StaleLeader):
        act(j)  # its fence stays on the lost term
    assert [(r["target"], r["token"]) for r in j.actions.recent()] == [("instance:2", 2)]
    other.close()


def test_a_tick_still_running_when_the_lease_is_lost_is_refused(j: Journal) -> None:
    """The lease thread learns of the loss first; the tick it interrupted goes on acting."""
    other = peer(j)
    a = Lease(j, "a", ttl_s=0.3, margin_s=0.1)
    assert a.renew()
    act(j, "instance:1")  # a leads and is mid-tick...
    time.sleep(0.4)  # ...when it is paused past its lease (SIGSTOP, a long GC, a VM stall)
    assert Lease(other, "b", ttl_s=30).renew()
    assert not a.renew()  # on waking, a's lease thread renews first and loses...
    with pytest.raises(StaleLeader, match="held by b"):
        act(j, "instance:2")  # ...and the tick's next action is refused, not unchecked
    assert [r["target"] for r in j.actions.recent()] == ["instance:1"]
    other.close()


def test_a_renewal_the_database_failed_leaves_the_tick_fenced(
    j: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = peer(j)
    a = Lease(j, "a", ttl_s=0.3, margin_s=0.1)
    runner = Runner(lambda: None, 1.0, lease=a, renew_s=0.1)
    runner._renew()
    assert a.leading

    def unreachable() -> None:
        raise JournalError("journal (test): connection lost")

    monkeypatch.setattr(a, "_acquire", unreachable)
    runner._renew()  # the lease thread cannot reach the database: a stands by
    assert not a.leading
    time.sleep(0.4)
    assert Lease(other, "b", ttl_s=30).renew()
    with pytest.raises(StaleLeader, match="held by b"):
        act(j)  # a tick of a's still under way is refused
    other.close()


def test_a_journal_that_fails_under_the_schedule_is_one_line_a_failure_and_no_tick(
    j: Journal, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The journal's database goes away between ticks: the lease check before a tick cannot
    be read (it ran in APScheduler's job, which logged a traceback every tick until the lease
    thread noticed), and a tick that fails on it is the journal's own error. Each is one line,
    no tick runs, and the lease is given up as a failed renewal gives it up."""
    ticks: list[int] = []
    a = Lease(j, "a", ttl_s=30, margin_s=1)
    runner = Runner(lambda: ticks.append(1), 1.0, lease=a, renew_s=0.1)
    runner._renew()

    def unreachable(*_: object, **__: object) -> None:
        raise JournalError("journal (test): connection refused")

    monkeypatch.setattr("controller.store.lease.read", unreachable)
    with caplog.at_level("ERROR"):
        runner._job()
    assert ticks == [] and runner.standby == 1 and not a.leading
    assert [r.getMessage() for r in caplog.records] == [
        "lease 'leader': journal (test): connection refused; not acting until it is renewed"
    ]
    assert all(r.exc_info is None for r in caplog.records)
    monkeypatch.undo()
    caplog.clear()
    failing = Runner(lambda: unreachable(), 1.0)
    with caplog.at_level("ERROR"):
        failing._job()
    assert failing.failed == 1
    assert [(r.getMessage(), r.exc_info) for r in caplog.records] == [
        ("tick failed: journal (test): connection refused; the next one runs on schedule", None)
    ]


def test_release_hands_over_at_once(j: Journal) -> None:
    other = peer(j)
    a, b = Lease(j, "a", ttl_s=60), Lease(other, "b", ttl_s=60)
    assert a.renew() and not b.renew()
    a.release()
    assert not read(j).live and j.actions.fence is None
    assert b.renew() and b.token == 2
    other.close()


def test_decisions_that_act_on_nothing_need_no_lease(j: Journal) -> None:
    other = peer(j)
    a = Lease(j, "a", ttl_s=60)
    assert a.renew()
    a.release()
    j.actions.fence = Fence("leader", "a", 1)  # a still believes it leads
    assert Lease(other, "b", ttl_s=60).renew()
    j.actions.record(tick_id=None, now=1.0, action="hold", target="fleet", params={},
                     proposer="p", reason="r", confidence=1.0, verdict="veto", why="w",
                     status="vetoed")  # fmt: skip
    with pytest.raises(StaleLeader):
        act(j)
    rows = j.actions.recent(executed_only=False)
    assert [(r["verdict"], r["token"]) for r in rows] == [("veto", None)]
    other.close()


def test_many_contenders_at_once_get_exactly_one_leader(tmp_path: Path) -> None:
    with journal_on("postgres", tmp_path) as j:
        journals = [peer(j) for _ in range(8)]
        leases = [Lease(x, f"c{n}", ttl_s=30) for n, x in enumerate(journals)]
        start = threading.Barrier(len(leases))
        won: list[str] = []

        def contend(lease: Lease) -> None:
            start.wait()
            if lease.renew():
                won.append(lease.holder)

        threads = [threading.Thread(target=contend, args=(x,)) for x in leases]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1 and read(j).holder == won[0] and read(j).token == 1
        for x in journals:
            x.close()


def test_runners_on_one_journal_tick_one_at_a_time_and_fail_over(tmp_path: Path) -> None:
    with journal_on("postgres", tmp_path) as j:
        ticks: dict[str, int] = {"a": 0, "b": 0}
        runners, opened = {}, []
        for name in ticks:
            lease = Lease(peer(j), name, ttl_s=1.5, margin_s=0.3)
            opened.append(lease.journal)
            runners[name] = Runner(lambda n=name: ticks.__setitem__(n, ticks[n] + 1), 0.05,
                                   lease=lease, renew_s=0.4)  # fmt: skip
        threads = {n: threading.Thread(target=r.run) for n, r in runners.items()}
        threads["a"].start()
        deadline = time.monotonic() + 10
        while ticks["a"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        threads["b"].start()
        time.sleep(1.0)
        assert ticks["a"] > 0 and ticks["b"] == 0 and runners["b"].standby > 0
        runners["a"].stop.set()  # a clean stop releases the lease
        threads["a"].join()
        while ticks["b"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ticks["b"] > 0 and read(j).holder == "b"
        runners["b"].stop.set()
        threads["b"].join()
        for x in opened:
            x.close()


def test_a_cron_tick_takes_the_lease_and_stands_aside_for_a_leader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "s"
    assert main(["--state", str(state), "tick"]) == 0
    j = Journal(state / "journal.db")
    assert len(j.meta.ticks()) == 1 and not read(j).live  # released after the tick
    assert main(["--state", str(state), "status"]) == 0
    assert "leader: none (last " in capsys.readouterr().out
    leader = Lease(j, "ops-1:4242", ttl_s=60)
    assert leader.renew()
    assert main(["--state", str(state), "tick"]) == 0
    said = capsys.readouterr().err
    assert "ops-1:4242 leads (token 2" in said
    assert "it ticks by itself: drop this cron line (or stop the service)" in said  # the fix
    assert "an earlier `fleetgate tick` still running" in said  # or another cron tick leads
    assert len(j.meta.ticks()) == 1  # it did not tick
    assert main(["--state", str(state), "status"]) == 0
    assert "leader: ops-1:4242 (token 2, lease" in capsys.readouterr().out
    j.close()


def test_a_cron_tick_longer_than_the_lease_keeps_it_and_acts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tick` renews the lease while it runs, as `run` does: a tick that outlasted ttl_s (a slow
    listing, vast's backoff) had every action after that refused as a stale leader's."""
    from controller.service import commands
    from controller.service.assemble import assemble
    from controller.service.config import Config

    config = Config.model_validate({"lease": {"ttl_s": 0.3, "renew_s": 0.05, "margin_s": 0.05},
                                    "escalation": {"channels": []}})  # fmt: skip
    app = assemble(config, state=tmp_path / "s", clock=time.time, sleep=time.sleep, seed=7)
    try:
        slow = app.controller.before_tick
        assert slow is not None

        def outlasting_the_lease() -> None:
            slow()
            time.sleep(0.6)  # sensing took twice the lease's TTL

        monkeypatch.setattr(app.controller, "before_tick", outlasting_the_lease)
        assert commands.tick_once(app) == 0
        acted = [a for a in app.journal.actions.recent() if a["verdict"] == "act"]
        assert acted and all(a["status"] not in ("intent", "interrupted") for a in acted), acted
        assert not read(app.journal).live  # let go after
    finally:
        app.close()


def test_a_standby_that_finds_its_own_name_renewed_on_the_lease_says_so(
    j: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    """The README runs every controller on the same config: one that sets `lease.holder` there
    names them all alike, and each standby logged that it stood by for itself while /readyz,
    the dashboard and the metrics of every one of them said it led. Once the lease of its name
    is renewed by another (a predecessor that died, or a term of its own that lapsed, is not),
    it is an error, once, that says what to change."""
    other = peer(j)
    leader = Lease(other, "fleetgate", ttl_s=30, margin_s=1)
    assert leader.renew()
    standby = Runner(lambda: None, 1.0, lease=Lease(j, "fleetgate", ttl_s=30, margin_s=1))
    with caplog.at_level("WARNING"):
        standby._renew()
        standby._renew()  # not renewed since: a predecessor of the same name, maybe
        assert [r.levelname for r in caplog.records] == ["WARNING"]
        for _ in range(2):
            assert leader.renew()
            standby._renew()
    assert [(r.levelname, r.getMessage()) for r in caplog.records[1:]] == [
        ("ERROR", "lease 'leader' is renewed by another controller named fleetgate (token 1): "
                  "give each controller a name of its own (lease.holder, or leave it unset "
                  "for host:pid), or none of them can tell who leads")]  # fmt: skip
    other.close()

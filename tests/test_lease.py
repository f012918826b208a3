"""The leader lease and its fencing token, on both journal backends."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import journal_on

from controller.journal import Fence, Journal
from controller.lease import Lease, read
from controller.schedule import Runner
from controller.store import PostgresStore, StaleLeader


@pytest.fixture(params=["sqlite", "postgres"])
def j(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Journal]:
    with journal_on(request.param, tmp_path) as journal:
        yield journal


def peer(j: Journal) -> Journal:
    """Another controller's connection to the same journal."""
    if isinstance(j.store, PostgresStore):
        return Journal(PostgresStore(j.store._dsn, j.store.schema))
    assert j.path is not None
    return Journal(j.path)


def act(j: Journal, target: str = "instance:1") -> int:
    return j.record(tick_id=None, now=1.0, action="reboot", target=target, params={},
                    proposer="rule:r", reason="r", confidence=1.0, verdict="act", why="w",
                    status="intent")  # fmt: skip


def test_one_leads_and_its_actions_carry_the_token(j: Journal) -> None:
    other = peer(j)
    a, b = Lease(j, "a", ttl_s=30, margin_s=1), Lease(other, "b", ttl_s=30, margin_s=1)
    assert a.renew() and a.token == 1
    assert not b.renew() and b.token is None and other.fence is None
    assert a.renew() and a.token == 1  # renewing keeps the term
    assert a.may_act() and not b.may_act()
    aid = act(j)
    assert [r["token"] for r in j.actions() if r["id"] == aid] == [1]
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
    assert [r["target"] for r in j.actions()] == []
    act(other, "instance:2")
    assert not a.renew() and j.fence is None  # a learns it lost, and stands by
    assert [(r["target"], r["token"]) for r in j.actions()] == [("instance:2", 2)]
    other.close()


def test_release_hands_over_at_once(j: Journal) -> None:
    other = peer(j)
    a, b = Lease(j, "a", ttl_s=60), Lease(other, "b", ttl_s=60)
    assert a.renew() and not b.renew()
    a.release()
    assert not read(j).live and j.fence is None
    assert b.renew() and b.token == 2
    other.close()


def test_decisions_that_act_on_nothing_need_no_lease(j: Journal) -> None:
    other = peer(j)
    a = Lease(j, "a", ttl_s=60)
    assert a.renew()
    a.release()
    j.fence = Fence("leader", "a", 1)  # a still believes it leads
    assert Lease(other, "b", ttl_s=60).renew()
    j.record(tick_id=None, now=1.0, action="hold", target="fleet", params={}, proposer="p",
             reason="r", confidence=1.0, verdict="veto", why="w", status="vetoed")  # fmt: skip
    with pytest.raises(StaleLeader):
        act(j)
    assert [(r["verdict"], r["token"]) for r in j.actions(executed_only=False)] == [("veto", None)]
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

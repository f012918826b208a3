"""The process scenarios at CI size: `fleetgate` killed with SIGKILL with launches in flight;
two controllers on one PostgreSQL journal with the leader killed, or paused and woken. Every
harm counter is 0 and the faults really landed. `run_chaos.py --full` runs the full counts."""

from __future__ import annotations

import pytest
from reliability import failover, kill9
from reliability.test_chaos import assert_harmless


@pytest.mark.timeout(120)
def test_sigkill_with_launches_in_flight_never_duplicates_or_loses_a_launch() -> None:
    killed = kill9.kill9(4, seed=1)
    assert_harmless("kill9", killed)
    rows = killed["rows"]
    assert rows["sqlite"]["runs"] == rows["postgres"]["runs"] == 2
    assert sum(x.get("kills_in_tick", 0) for x in rows.values()) >= 2
    # at least one kill landed while a launch was journaled and its create was under way
    assert sum(x.get("runs_mid_create", 0) for x in rows.values()) >= 1
    assert sum(x["creates"] for x in rows.values()) >= 8


@pytest.mark.timeout(120)
def test_a_killed_leader_is_replaced_within_the_ttl_and_acts_no_more() -> None:
    r = failover.failover(1, seed=1)
    assert_harmless("failover", r)
    assert r["kills"] == 1 and r["failovers"] == 1 and r["standby_acted"] == 1
    assert r["failover_max_s"] <= failover.TTL_S + failover.SLACK_S


@pytest.mark.timeout(120)
def test_a_paused_leader_woken_after_the_takeover_is_refused() -> None:
    r = failover.paused_leader(1, seed=1)
    assert_harmless("paused_leader", r)
    assert r["stops"] == 1 and r["failovers"] == 1 and r["standby_acted"] == 1
    assert r["noticed_loss"] == 1 and r["refused"] >= 1  # it tried, and the fence said no

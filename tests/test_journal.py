"""The SQLite journal: intents before results, history, escalations answered once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from controller.journal import Journal
from controller.track import Event, Track


@pytest.fixture
def j(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "state" / "journal.db")


def test_an_intent_is_durable_before_the_result(j: Journal) -> None:
    aid = j.record(tick_id=1, now=10.0, action="launch", target="fleet", params={"label": "x"},
                   proposer="rule:r", reason="why", confidence=0.9, verdict="act", why="ok",
                   status="intent", key="x")  # fmt: skip
    other = sqlite3.connect(j.path)  # another process would see it
    assert other.execute("SELECT status FROM actions WHERE id = ?", (aid,)).fetchone() == (
        "intent",
    )
    assert [r["key"] for r in j.in_flight()] == ["x"]
    j.finish(aid, 11.0, "ok", {"instance": "7"})
    assert j.in_flight() == []
    [row] = j.actions()
    assert row["status"] == "ok" and row["result"] == {"instance": "7"}
    with pytest.raises(sqlite3.IntegrityError):  # a launch label is used once
        j.record(
            tick_id=1,
            now=12.0,
            action="launch",
            target="fleet",
            params={},
            proposer="p",
            reason="r",
            confidence=1,
            verdict="act",
            why="w",
            status="intent",
            key="x",
        )


def test_history_is_rebuilt_from_what_was_stored(j: Journal) -> None:
    t = Track("1", "m1", 0, "running", 0, "running", 0, "up", 0)
    j.save_tracks(
        {"1": t},
        [
            Event("1", 50, "death"),
            Event("1", 60, "restart"),
            Event("1", 60, "bench", {"machine_id": "m1", "rate": 33.0}),
        ],
    )
    parent = j.record(
        tick_id=1,
        now=70.0,
        action="launch",
        target="fleet",
        params={"count": 1},
        proposer="p",
        reason="r",
        confidence=1,
        verdict="act",
        why="w",
        status="ok",
    )
    j.record(
        tick_id=1,
        now=70.0,
        action="launch",
        target="fleet",
        params={},
        proposer="p",
        reason="r",
        confidence=1,
        verdict="act",
        why="w",
        status="ok",
        key="k",
        parent_id=parent,
    )
    j.block_host("m9", 500.0, "crash loop")
    j.add_replacement("1", "lbl", 80.0, 2000.0, parent)
    h = j.history(100.0)
    assert h.instances == {"1": t}
    assert [e.kind for e in h.events] == ["death", "restart"]
    assert h.host_rates == {"m1": 33.0} and h.host_blocks == {"m9": 500.0}
    assert h.launches == (70.0,) and h.retiring == frozenset({"1"})
    assert h.last_acted == {"launch:fleet": 70.0}
    assert h.host_blocked("m9", 100.0) and not h.host_blocked("m9", 600.0)


def test_an_escalation_is_answered_once(j: Journal) -> None:
    eid = j.add_escalation(fingerprint="f", kind="unmatched", subject="instance:1", summary="s",
                           now=1.0, deadline=100.0, situation={"proposals": []},
                           default_action={"action": "hold", "params": {}})  # fmt: skip
    assert j.answer(eid, status="approved", by="ana", now=2.0, answer={"action": "hold"})
    assert not j.answer(eid, status="denied", by="bob", now=3.0, answer=None)
    esc = j.escalation(eid)
    assert esc and esc["status"] == "approved" and esc["answered_by"] == "ana"
    assert j.last_escalation("f")["id"] == eid  # type: ignore[index]


def test_key_value_and_reopen(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    j.put("paused", True)
    j.close()
    assert Journal(tmp_path / "j.db").get("paused") is True


def test_recent_actions_come_back_with_their_params_decoded(j: Journal) -> None:
    j.record(
        tick_id=1,
        now=10.0,
        action="reboot",
        target="instance:7",
        params={"instance": "7"},
        proposer="rule:r",
        reason="r",
        confidence=1,
        verdict="act",
        why="w",
        status="ok",
    )
    [row] = j.recent_for("instance:7", 0.0)
    assert row["params"] == {"instance": "7"} and row["action"] == "reboot"

"""The contract of `journal.actions`: intents before results, launches reconciled by label,
interrupted runs closed once, replacements in flight, the lease's fence."""

from __future__ import annotations

import pytest
from support import peer, record_action

from controller.store.actions import INTERRUPTED_NOTE, Fence
from controller.store.backend import DuplicateKey, StaleLeader
from controller.store.journal import Journal

_act = record_action


def test_an_intent_is_durable_before_the_result(j: Journal) -> None:
    aid = _act(j, 10.0, "launch", "fleet", params={"label": "x"}, proposer="rule:r",
               reason="why", confidence=0.9, why="ok", key="x")  # fmt: skip
    other = peer(j)  # another process would see it
    assert [(r["id"], r["status"]) for r in other.actions.in_flight()] == [(aid, "intent")]
    other.close()
    assert [r["key"] for r in j.actions.in_flight()] == ["x"]
    j.actions.finish(aid, 11.0, "ok", {"instance": "7"})
    assert j.actions.in_flight() == []
    [row] = j.actions.recent()
    assert row["status"] == "ok" and row["result"] == {"instance": "7"}
    assert row["params"] == {"label": "x"} and row["finished_at"] == 11.0
    with pytest.raises(DuplicateKey):  # a launch label is used once
        _act(j, 12.0, "launch", "fleet", key="x")


def test_recent_is_oldest_first_and_may_leave_out_what_was_not_executed(j: Journal) -> None:
    a = _act(j, 1.0, status="ok")
    v = _act(j, 2.0, "hold", "fleet", verdict="veto", status="vetoed")
    b = _act(j, 3.0, status="ok")
    assert [r["id"] for r in j.actions.recent()] == [a, v, b]
    assert [r["id"] for r in j.actions.recent(2)] == [v, b]
    assert [r["id"] for r in j.actions.recent(executed_only=True)] == [a, b]
    assert all(r["result"] is None for r in j.actions.recent())


def test_recent_actions_on_a_target_come_back_with_their_params_decoded(j: Journal) -> None:
    _act(j, 10.0, params={"instance": "7"}, proposer="rule:r", status="ok")
    _act(j, 11.0, "hold", verdict="veto", status="vetoed")  # not executed: left out
    _act(j, 12.0, target="instance:8", status="ok")
    [row] = j.actions.recent_for("instance:7", 0.0)
    assert row["params"] == {"instance": "7"} and row["action"] == "reboot"
    assert row["proposer"] == "rule:r" and j.actions.recent_for("instance:7", 10.5) == []


def test_launch_records_are_reconciled_by_label(j: Journal) -> None:
    parent = _act(j, 100.0, "launch", "fleet", status="ok")
    a = _act(j, 100.0, "launch", "fleet", key="fg-a", parent_id=parent)
    b = _act(j, 100.0, "launch", "fleet", key="fg-b", parent_id=parent)
    c = _act(j, 100.0, "launch", "fleet", key="fg-c", parent_id=parent)
    j.actions.finish(b, 101.0, "unknown", {"error": "timeout"})
    j.actions.finish(c, 101.0, "failed", {"error": "no offers"})
    rows = j.actions.recent_launches(50.0)
    assert [(r["key"], r["status"]) for r in rows] == [("fg-a", "intent"), ("fg-b", "unknown"),
                                                       ("fg-c", "failed")]  # fmt: skip
    assert rows[1]["result"] == {"error": "timeout"} and rows[0]["result"] == {}
    # open ones however old (until listed or lost); a success or failure only within the window
    assert [r["key"] for r in j.actions.recent_launches(150.0)] == ["fg-a", "fg-b"]
    j.actions.finish(a, 160.0, "ok", {"instance": "7", "label": "fg-a"})
    assert [r["key"] for r in j.actions.recent_launches(99.0)] == ["fg-a", "fg-b", "fg-c"]
    assert [r["key"] for r in j.actions.recent_launches(150.0)] == ["fg-b"]
    assert j.fleet.history(120.0).launches == (100.0, 100.0)
    assert [r["id"] for r in j.actions.in_flight()] == []
    assert j.actions.launched_after(0) == [(a, "7", "fg-a")]
    assert j.actions.launched_after(a) == []
    # a rented; c failed, and its label is still the launch's should vast list it after all
    assert j.actions.open_launches() == {b: "fg-b", c: "fg-c"}
    j.actions.finish(b, 170.0, "ok", {"instance": "8", "label": "fg-b", "confirmed_late": True})
    assert j.actions.open_launches() == {c: "fg-c"}
    assert j.actions.rented_by([b, c]) == [(b, "8", "fg-b")]


def test_an_interrupted_run_leaves_intents_that_are_closed_once(j: Journal) -> None:
    reboot = _act(j, 10.0)
    destroy = _act(j, 10.0, "destroy", "instance:8")
    launch = _act(j, 10.0, "launch", "fleet", key="fg-x", parent_id=1)
    gone = _act(j, 10.0, "destroy", "instance:9")
    closed = j.actions.close_interrupted(20.0, listed={"7", "8"})  # 9 is gone: destroyed
    assert [(r["id"], r["status"]) for r in closed] == [
        (reboot, "interrupted"), (destroy, "interrupted"), (gone, "ok")]  # fmt: skip
    assert j.actions.close_interrupted(21.0) == []
    assert [r["id"] for r in j.actions.in_flight()] == [launch]  # reconciled by label
    by_id = {r["id"]: r for r in j.actions.recent()}
    assert by_id[reboot]["result"] == {"note": INTERRUPTED_NOTE}
    assert by_id[gone]["result"] == {"instance": "9", "confirmed_by": "listing"}
    assert j.actions.destroyed_since(0.0) == {"9"}  # an interrupted destroy is not a destroy
    _act(j, 30.0, "destroy", "instance:10", status="ok")
    assert j.actions.destroyed_since(0.0) == {"9", "10"}
    assert j.actions.destroyed_since(31.0) == set()


def test_without_a_listing_every_interrupted_intent_is_interrupted(j: Journal) -> None:
    destroy = _act(j, 10.0, "destroy", "instance:8")
    parent = _act(j, 10.0, "launch", "fleet")  # a launch of several: closed here
    closed = j.actions.close_interrupted(20.0)
    assert [(r["id"], r["status"]) for r in closed] == [
        (destroy, "interrupted"), (parent, "interrupted")]  # fmt: skip


def test_actions_answering_an_escalation_are_found_by_it(j: Journal) -> None:
    aid = _act(j, 5.0, escalation_id=3, params={"instance": "7"})
    _act(j, 6.0, escalation_id=4)
    [row] = j.actions.actions_for_escalation(3)
    assert row["id"] == aid and row["params"] == {"instance": "7"} and row["result"] is None
    assert j.actions.actions_for_escalation(99) == []


def test_a_replacement_waits_for_its_instance_and_starts_over_when_replaced_again(
    j: Journal,
) -> None:
    j.actions.add_replacement("1", "fg-new", 10.0, 600.0, 5)
    j.actions.set_replacement("1", "waiting", new_id="9")
    j.actions.add_replacement("1", "fg-newer", 20.0, 700.0, 6)  # replacing again starts over
    [r] = j.actions.replacements()
    assert (r["new_label"], r["new_id"], r["deadline"]) == ("fg-newer", None, 700.0)
    assert r["action_id"] == 6
    j.actions.set_replacement("1", "done", new_id="10")
    j.actions.set_replacement("1", "done")  # a new id is kept when none is given
    assert j.actions.replacements() == [] and j.actions.replacements("done")[0]["new_id"] == "10"


def test_a_fence_without_its_lease_refuses_actions_but_not_other_decisions(j: Journal) -> None:
    j.actions.fence = Fence("leader", "a", 1)  # nobody holds the lease
    with pytest.raises(StaleLeader, match="held by nobody"):
        _act(j, 1.0)
    _act(j, 1.0, "hold", "fleet", verdict="veto", status="vetoed")
    assert [(r["verdict"], r["token"]) for r in j.actions.recent()] == [("veto", None)]
    j.actions.fence = None
    _act(j, 2.0)  # not leading (a single controller): written, no token
    assert [r["token"] for r in j.actions.recent()] == [None, None]

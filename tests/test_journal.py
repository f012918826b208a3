"""The journal's contract, run against both backends (SQLite and PostgreSQL): intents before
results, history, escalations answered once, unique launch labels, the lease's fence."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import PG_DSN, journal_on, peer

from controller.core.track import Event, Track
from controller.service import wiring
from controller.service.config import ConfigError, parse_config
from controller.store.backend import DuplicateKey, PostgresStore
from controller.store.journal import UPTIME_EVERY, Journal

BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(params=BACKENDS)
def j(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Journal]:
    with journal_on(request.param, tmp_path) as journal:
        yield journal


def test_an_intent_is_durable_before_the_result(j: Journal) -> None:
    aid = j.record(tick_id=1, now=10.0, action="launch", target="fleet", params={"label": "x"},
                   proposer="rule:r", reason="why", confidence=0.9, verdict="act", why="ok",
                   status="intent", key="x")  # fmt: skip
    other = peer(j)  # another process would see it
    assert [(r["id"], r["status"]) for r in other.in_flight()] == [(aid, "intent")]
    other.close()
    assert [r["key"] for r in j.in_flight()] == ["x"]
    j.finish(aid, 11.0, "ok", {"instance": "7"})
    assert j.in_flight() == []
    [row] = j.actions()
    assert row["status"] == "ok" and row["result"] == {"instance": "7"}
    with pytest.raises(DuplicateKey):  # a launch label is used once
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


def test_key_value_and_reopen(j: Journal) -> None:
    j.put("paused", True)
    j.put("paused", False)
    j.put("sim", {"t": 1.5, "ids": [1, 2]})
    other = peer(j)
    assert other.get("paused") is False and other.get("sim") == {"t": 1.5, "ids": [1, 2]}
    assert other.get("missing", 7) == 7
    other.close()


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


def _act(j: Journal, now: float, action: str = "reboot", target: str = "instance:7",
         **kw: object) -> int:  # fmt: skip
    fields: dict[str, object] = dict(tick_id=1, now=now, action=action, target=target,
                                     params={}, proposer="p", reason="r", confidence=1.0,
                                     verdict="act", why="w", status="intent")  # fmt: skip
    fields.update(kw)
    return j.record(**fields)  # type: ignore[arg-type]


def test_times_keep_their_precision(j: Journal) -> None:
    at = 1_790_000_000.123456  # epoch seconds: a float4 column would be off by minutes
    tick = j.start_tick(at, "digest")
    j.finish_tick(tick, at + 0.5, {"launched": 1})
    [row] = j.ticks(1)
    assert row["started_at"] == at and row["finished_at"] == at + 0.5
    assert row["summary"] == {"launched": 1} and j.last_now() == at


def test_launch_records_are_reconciled_by_label(j: Journal) -> None:
    parent = _act(j, 100.0, "launch", "fleet", status="ok")
    a = _act(j, 100.0, "launch", "fleet", key="fg-a", parent_id=parent)
    b = _act(j, 100.0, "launch", "fleet", key="fg-b", parent_id=parent)
    c = _act(j, 100.0, "launch", "fleet", key="fg-c", parent_id=parent)
    j.finish(b, 101.0, "unknown", {"error": "timeout"})
    j.finish(c, 101.0, "failed", {"error": "no offers"})
    rows = j.recent_launches(50.0)
    assert [(r["key"], r["status"]) for r in rows] == [("fg-a", "intent"), ("fg-b", "unknown")]
    assert rows[1]["result"] == {"error": "timeout"} and rows[0]["result"] == {}
    # open ones however old (until listed or lost); a success only within the window
    assert [r["key"] for r in j.recent_launches(150.0)] == ["fg-a", "fg-b"]
    j.finish(a, 160.0, "ok", {"instance": "7"})
    assert [r["key"] for r in j.recent_launches(99.0)] == ["fg-a", "fg-b"]
    assert [r["key"] for r in j.recent_launches(150.0)] == ["fg-b"]
    assert j.history(120.0).launches == (100.0, 100.0)
    assert [r["id"] for r in j.in_flight()] == []


def test_an_interrupted_run_leaves_intents_that_are_closed_once(j: Journal) -> None:
    reboot = _act(j, 10.0)
    destroy = _act(j, 10.0, "destroy", "instance:8")
    launch = _act(j, 10.0, "launch", "fleet", key="fg-x", parent_id=1)
    gone = _act(j, 10.0, "destroy", "instance:9")
    closed = j.close_interrupted(20.0, listed={"7", "8"})  # 9 is no longer listed: destroyed
    assert [(r["id"], r["status"]) for r in closed] == [
        (reboot, "interrupted"), (destroy, "interrupted"), (gone, "ok")]  # fmt: skip
    assert j.close_interrupted(21.0) == []
    assert [r["id"] for r in j.in_flight()] == [launch]  # launches are reconciled by label
    assert j.destroyed_since(0.0) == {"9"}  # an interrupted destroy is not a destroy
    _act(j, 30.0, "destroy", "instance:10", status="ok")
    assert j.destroyed_since(0.0) == {"9", "10"} and j.destroyed_since(31.0) == set()


def test_tracks_events_hosts_and_replacements(j: Journal) -> None:
    assert not j.has_tracks()
    t = Track("1", "m1", 0, "running", 0, "running", 0, "up", 0)
    j.save_tracks({"1": t}, [Event("1", 5.0, "seen"), Event("2", 6.0, "seen", {"x": 1})])
    assert j.has_tracks() and j.seen_instances(5.5, ["1", "2", "3"]) == {"2"}
    assert j.seen_instances(0.0, ["1"]) == {"1"} and j.seen_instances(0.0, []) == set()
    assert [e["detail"] for e in j.events()] == [{}, {"x": 1}]
    assert [e["kind"] for e in j.events("2")] == ["seen"]
    j.save_tracks({}, [])
    assert not j.has_tracks()
    j.block_host("m1", 100.0, "crash loop")
    j.block_host("m1", 200.0, "again")
    [host] = j.hosts()
    assert (host["failures"], host["blocked_until"], host["block_reason"]) == (2, 200.0, "again")
    j.add_replacement("1", "fg-new", 10.0, 600.0, 5)
    j.set_replacement("1", "waiting", new_id="9")
    j.add_replacement("1", "fg-newer", 20.0, 700.0, 6)  # replacing again starts over
    [r] = j.replacements()
    assert (r["new_label"], r["new_id"], r["deadline"]) == ("fg-newer", None, 700.0)
    j.set_replacement("1", "done", new_id="10")
    assert j.replacements() == [] and j.replacements("done")[0]["new_id"] == "10"


def test_escalations_deliveries_and_llm_usage(j: Journal) -> None:
    eid = j.add_escalation(fingerprint="f", kind="unmatched", subject="s", summary="s", now=1.0,
                           deadline=9.0, situation={"a": [1]},
                           default_action={"action": "hold"})  # fmt: skip
    j.add_delivery(eid, "slack", 2.0, True, "200")
    j.add_delivery(eid, "email", 2.0, False, "refused")
    assert [(d["channel"], d["ok"]) for d in j.deliveries(eid)] == [("slack", 1), ("email", 0)]
    assert [e["id"] for e in j.escalations("pending")] == [eid]
    j.set_escalation_status(eid, "executed", 42)
    esc = j.escalation(eid)
    assert esc and esc["status"] == "executed" and esc["executed_action_id"] == 42
    assert esc["situation"] == {"a": [1]} and j.escalations("pending") == []
    call = j.add_llm_call(escalation_id=eid, now=3.0, model="m", status="ok", action="hold",
                          params={"why": "x"}, confidence=0.5, tokens=120)  # fmt: skip
    assert [c["id"] for c in j.llm_calls(eid)] == [call]
    assert j.llm_calls(eid)[0]["params"] == {"why": "x"}
    j.add_llm_usage(3.0, 120)
    j.add_llm_usage(4.0, 80)
    assert j.llm_usage_since(0.0) == (2, 200) and j.llm_usage_since(3.5) == (1, 80)
    assert j.llm_usage_since(10.0) == (0, 0)
    aid = _act(j, 5.0, escalation_id=eid)
    assert [a["id"] for a in j.actions_for_escalation(eid)] == [aid]


def test_reloads_are_journaled(j: Journal) -> None:
    j.add_reload(1.0, True, "abc")
    j.add_reload(2.0, False, "abc", "rules/x.yaml:3: bad")
    assert [(r["ok"], r["problems"]) for r in j.reloads()] == [(1, ""), (0, "rules/x.yaml:3: bad")]


def _track(i: str, uptime: float, stage: str = "running") -> Track:
    return Track(i, "m" + i, 0, stage, 0, "running", 0, "up", 0, uptime=uptime)


def test_tracks_are_saved_by_change_and_read_back_by_any_process(j: Journal) -> None:
    j.save_tracks({"1": _track("1", 10), "2": _track("2", 10)}, [])
    other = peer(j)
    assert other.tracks() == {"1": _track("1", 10), "2": _track("2", 10)}
    # uptime alone: this process sees it at once, others within UPTIME_EVERY saves
    j.save_tracks({"1": _track("1", 40), "2": _track("2", 40, stage="params")}, [])
    assert j.history(0.0).instances == {"1": _track("1", 40), "2": _track("2", 40, "params")}
    seen = other.tracks()
    assert seen["2"] == _track("2", 40, "params")  # a stage change is stored at once
    assert seen["1"].stage == "running" and seen["1"].uptime in (10, 40)
    for n in range(UPTIME_EVERY):
        j.save_tracks({"1": _track("1", 100 + n)}, [])  # 2 vanished: removed at once
        assert set(other.tracks()) == {"1"}
    assert other.tracks()["1"].uptime >= 100  # written within UPTIME_EVERY saves
    # another process saving makes this one read the store again
    other.save_tracks({"3": _track("3", 5)}, [])
    assert j.tracks() == {"3": _track("3", 5)} and j.history(0.0).instances == j.tracks()
    other.close()


def test_hosts_written_here_or_elsewhere_read_back_the_same(j: Journal) -> None:
    j.save_tracks({}, [Event("1", 5.0, "bench", {"machine_id": "m1", "rate": 30.0})])
    assert j.history(10.0).host_rates == {"m1": 30.0}
    j.block_host("m1", 100.0, "crash loop")
    other = peer(j)
    assert other.history(10.0).host_blocks == {"m1": 100.0}
    other.block_host("m2", 200.0, "slow")  # written elsewhere: this process reads again
    j.save_tracks({}, [Event("2", 6.0, "bench", {"machine_id": "m1", "rate": 35.0})])
    h = j.history(10.0)
    assert h.host_rates == {"m1": 35.0} and h.host_blocks == {"m1": 100.0, "m2": 200.0}
    assert [(r["machine_id"], r["failures"]) for r in j.hosts()] == [("m1", 1), ("m2", 1)]
    j.hosts()[0]["failures"] = 99  # a caller's copy, not the journal's
    assert j.hosts()[0]["failures"] == 1 and other.hosts() == j.hosts()
    other.close()


def test_the_config_puts_the_journal_on_postgresql(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = "fg_test_cfg_" + os.urandom(4).hex()
    cfg = parse_config("c.yaml", "journal:\n  dsn: {env: FG_TEST_JOURNAL_DSN}\n"
                       f"  schema_name: {schema}\n")  # fmt: skip
    with pytest.raises(ConfigError, match="journal.dsn"):
        wiring.open_journal(cfg, tmp_path)  # the variable is not set
    monkeypatch.setenv("FG_TEST_JOURNAL_DSN", PG_DSN)
    j = wiring.open_journal(cfg, tmp_path)
    try:
        assert isinstance(j.store, PostgresStore) and j.store.schema == schema
        assert "password" not in j.store.where and schema in j.store.where
        j.put("k", 1)
        assert not (tmp_path / "journal.db").exists() and j.get("k") == 1
    finally:
        assert isinstance(j.store, PostgresStore)
        j.store.drop()
        j.close()

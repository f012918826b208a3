"""The contract of the instance records (`LifecycleStore`): registration, stages only forward,
commands handed out once or overdue, logs sanitized and capped; on both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.store.journal import Journal
from controller.store.records import (
    MAX_LINE_CHARS,
    MAX_LOG_LINES,
    LifecycleStore,
    StageOrderError,
    UnknownCommand,
    UnknownInstance,
    VastIdTaken,
    sanitize,
)


@pytest.fixture
def store(j: Journal) -> LifecycleStore:
    return LifecycleStore(j)


def test_register_creates_a_record_and_registering_again_only_fills_in(
    store: LifecycleStore,
) -> None:
    rec = store.register("fg-a1", "1001", 12.0, None, now=100.0, agent_version="0.1.0")
    assert (rec.stage, rec.stage_at, rec.registered_at, rec.vast_id) == (
        "registered",
        100,
        100,
        "1001",
    )
    store.advance("fg-a1", "params", 150.0)
    again = store.register("fg-a1", None, None, "10.0.0.5:12300", now=200.0)
    assert again.stage == "params" and again.stage_at == 150.0  # a re-run boot script
    assert (again.vast_id, again.min_rate, again.host_and_port) == ("1001", 12.0, "10.0.0.5:12300")
    assert store.register("C.2002", None, None, None, now=1.0).vast_id == "2002"
    assert sorted(store.records()) == ["C.2002", "fg-a1"]


def test_stages_only_go_forward_and_repeats_change_nothing(store: LifecycleStore) -> None:
    store.register("fg-a1", None, 10.0, None, now=0.0)
    assert store.advance("fg-a1", "params", 10.0).stage_at == 10.0
    assert store.advance("fg-a1", "params", 20.0).stage_at == 10.0  # idempotent
    bench = store.advance("fg-a1", "bench", 30.0, bench_rate=14.5)
    assert (bench.stage, bench.bench_rate) == ("bench", 14.5)
    assert store.advance("fg-a1", "bench", 40.0, bench_rate=99.0).bench_rate == 14.5
    with pytest.raises(StageOrderError, match="'bench'; cannot go back to 'params'"):
        store.advance("fg-a1", "params", 50.0)
    assert store.advance("fg-a1", "running", 60.0).stage == "running"
    with pytest.raises(StageOrderError):
        store.advance("fg-a1", "registered", 70.0)
    with pytest.raises(UnknownInstance, match="'nope'"):
        store.advance("nope", "params", 1.0)
    with pytest.raises(ValueError, match="unknown stage 'done'"):
        store.advance("fg-a1", "done", 1.0)


def test_a_stage_may_be_skipped_forward(store: LifecycleStore) -> None:
    store.register("fg-a1", None, None, None, now=0.0)
    assert store.advance("fg-a1", "running", 5.0).stage == "running"


def test_heartbeat_hands_out_queued_commands_once(store: LifecycleStore) -> None:
    store.register("fg-a1", None, None, None, now=0.0)
    store.register("fg-b2", None, None, None, now=0.0)
    cid = store.queue_command("fg-a1", "restart_daemon", now=100.0, deadline_s=300.0)
    assert store.queue_command("fg-a1", "restart_daemon", now=110.0, deadline_s=300.0) == cid
    assert store.heartbeat("fg-b2", now=120.0) == []
    picked = store.heartbeat("fg-a1", now=130.0, daemon_uptime_s=42.0, daemon_state="RUNNING")
    assert [(c.id, c.command, c.picked_at) for c in picked] == [(cid, "restart_daemon", 130.0)]
    assert store.heartbeat("fg-a1", now=160.0) == []
    rec = store.records()["fg-a1"]
    assert (rec.last_heartbeat, rec.daemon_uptime_s, rec.daemon_state) == (160.0, None, None)
    assert store.complete(cid, {"ok": True, "detail": "restarted"}, now=170.0, label="fg-a1")
    assert not store.complete(cid, {"ok": False, "detail": "again"}, now=180.0)
    done = store.command(cid)
    assert done and done.done_at == 170.0 and done.result == {"ok": True, "detail": "restarted"}
    # picked but not done still counts as outstanding; done does not
    assert store.queue_command("fg-a1", "restart_daemon", now=200.0, deadline_s=60.0) != cid
    with pytest.raises(UnknownCommand):
        store.complete(cid, {"ok": True}, now=1.0, label="fg-b2")
    with pytest.raises(UnknownInstance):
        store.heartbeat("nope", now=1.0)
    with pytest.raises(UnknownInstance):
        store.queue_command("nope", "restart_daemon", now=1.0, deadline_s=60.0)
    with pytest.raises(ValueError, match="unknown command 'reboot'"):
        store.queue_command("fg-a1", "reboot", now=1.0, deadline_s=60.0)


def test_a_command_not_picked_before_its_deadline_is_overdue_and_never_handed_out(
    store: LifecycleStore,
) -> None:
    store.register("fg-a1", None, None, None, now=0.0)
    store.register("fg-b2", None, None, None, now=0.0)
    late = store.queue_command("fg-a1", "restart_daemon", now=100.0, deadline_s=60.0)
    fine = store.queue_command("fg-b2", "restart_daemon", now=100.0, deadline_s=600.0)
    assert store.overdue_commands(now=159.0) == []
    assert [c.id for c in store.overdue_commands(now=160.0)] == [late]
    assert store.heartbeat("fg-a1", now=161.0) == []  # too late: the controller reboots instead
    assert [c.id for c in store.heartbeat("fg-b2", now=161.0)] == [fine]
    assert [c.id for c in store.overdue_commands(now=1000.0)] == [late]  # picked is never overdue
    store.complete(late, {"ok": False, "detail": "overdue: rebooted instead"}, now=170.0)
    assert store.overdue_commands(now=1000.0) == []
    again = store.queue_command("fg-a1", "restart_daemon", now=200.0, deadline_s=60.0)
    assert again not in (late, fine)


def test_logs_are_sanitized_truncated_and_capped_per_instance(store: LifecycleStore) -> None:
    store.register("fg-a1", None, None, None, now=0.0)
    store.register("fg-b2", None, None, None, now=0.0)
    store.push_logs("fg-b2", ["other"], now=1.0)
    dirty = "\x1b[31mERROR\x1b[0m cuzk\x00 died\tbadly\x07\u202e\r\n"
    store.push_logs("fg-a1", [dirty, "x" * 5000], now=2.0)
    first = store.logs("fg-a1")
    assert first[0].line == "ERROR cuzk died badly" and first[0].at == 2.0
    assert len(first[1].line) == MAX_LINE_CHARS and first[1].line.endswith("…")
    for batch in range(3):
        store.push_logs("fg-a1", [f"line {batch}-{i}" for i in range(200)], now=10.0 + batch)
    kept = store.logs("fg-a1")
    assert len(kept) == MAX_LOG_LINES
    assert kept[0].line == "line 0-100" and kept[-1].line == "line 2-199"
    assert [x.line for x in store.logs("fg-b2")] == ["other"]
    with pytest.raises(UnknownInstance):
        store.push_logs("nope", ["x"], now=1.0)


def test_sanitize_keeps_ordinary_text() -> None:
    assert sanitize("PoRep 3/10 done — 12.5 GiB ✓") == "PoRep 3/10 done — 12.5 GiB ✓"
    assert sanitize("a\u2028b\x85c\x7f") == "abc"


def test_resolve_by_label_vast_id_container_label_and_host_and_port(
    store: LifecycleStore,
) -> None:
    store.register("fg-a1", "1001", None, "10.0.0.5:12300", now=0.0)
    store.register("C.2002", None, None, None, now=0.0)
    store.register("fg-c3", None, None, None, now=0.0)
    store.link("fg-c3", vast_id="3003", machine_id="m-77")
    for name in ("fg-a1", "1001", "C.1001", "10.0.0.5:12300"):
        assert (r := store.resolve(name)) and r.label == "fg-a1", name
    for name in ("C.2002", "2002"):
        assert (r := store.resolve(name)) and r.label == "C.2002", name
    assert (r := store.resolve("C.3003")) and r.label == "fg-c3" and r.machine_id == "m-77"
    assert store.resolve("4004") is None and store.resolve("") is None
    with pytest.raises(VastIdTaken):  # an agent cannot claim another instance's vast id
        store.register("fg-dup", "1001", None, None, now=0.0)
    assert store.record("fg-dup") is None
    assert (r := store.resolve("1001")) and r.label == "fg-a1"
    store.register("fg-dup", None, None, None, now=0.0)
    store.link("fg-dup", vast_id="1001")  # two records name one vast id: neither is meant
    assert store.resolve("1001") is None
    with pytest.raises(UnknownInstance):
        store.link("nope", vast_id="1")


def test_forget_drops_records_logs_and_commands(store: LifecycleStore) -> None:
    store.register("fg-a1", None, None, None, now=0.0)
    store.push_logs("fg-a1", ["x"], now=1.0)
    store.queue_command("fg-a1", "restart_daemon", now=1.0, deadline_s=5.0)
    token = store.tokens.issue("fg-a1", now=0.0)
    store.forget("fg-a1")
    assert store.records() == {} and store.logs("fg-a1") == []
    assert store.commands("fg-a1") == [] and store.overdue_commands(now=100.0) == []
    assert store.tokens.label_for(token) is None and not store.tokens.launched("fg-a1")


def test_the_store_survives_reopening(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.db")
    LifecycleStore(journal).register("fg-a1", "7", 3.0, None, now=1.0)
    journal.close()
    journal = Journal(tmp_path / "j.db")
    try:
        assert LifecycleStore(journal).records()["fg-a1"].min_rate == 3.0
    finally:
        journal.close()

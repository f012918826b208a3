"""Journal retention: the running service and `fleetgate prune` delete old rows in batches and
keep what says which instances fleetgate owns (real processes, the built-in simulator)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from test_cli_ops import fg, ok

from controller.store.journal import Journal

DAY = 86_400.0
SIX_HOURS = "sim: {seconds_per_tick: 21600}\n"  # 12 ticks: three virtual days


def _run(tmp: Path, retention: str) -> sqlite3.Connection:
    cfg = tmp / "fleetgate.yaml"
    cfg.write_text(f"interval_s: 0.01\n{SIX_HOURS}{retention}")
    ok(fg("--config", str(cfg), "--state", str(tmp / "s"), "run", "--ticks", "12", "--seed", "7"))
    return sqlite3.connect(tmp / "s" / "journal.db")


def _oldest_tick_age_days(db: sqlite3.Connection) -> float:
    lo, hi = db.execute("SELECT MIN(started_at), MAX(started_at) FROM ticks").fetchone()
    return float(hi - lo) / DAY


def _launched(db: sqlite3.Connection) -> set[str]:
    """The instance ids of the launches that rented an instance."""
    rows = db.execute(
        "SELECT json_extract(result, '$.instance') FROM actions "
        "WHERE action = 'launch' AND status = 'ok' AND parent_id IS NOT NULL"
    ).fetchall()
    return {str(i) for (i,) in rows}


def test_without_retention_everything_stays(tmp_path: Path) -> None:
    db = _run(tmp_path, "retention: {days: null}\n")
    assert db.execute("SELECT COUNT(*) FROM ticks").fetchone()[0] == 12
    assert _oldest_tick_age_days(db) == pytest.approx(2.75)


def test_the_service_prunes_after_ticks_and_keeps_the_launches_of_listed_instances(
    tmp_path: Path,
) -> None:
    (tmp_path / "keep").mkdir()
    kept = _run(tmp_path / "keep", "retention: {days: null}\n")
    db = _run(tmp_path, "retention: {days: 1, every_s: 0.001, batch: 2}\n")
    assert _oldest_tick_age_days(db) <= 1.0
    assert db.execute("SELECT COUNT(*) FROM ticks").fetchone()[0] == 5  # 1 day of 6 h ticks
    last = db.execute("SELECT MAX(started_at) FROM ticks").fetchone()[0]
    old = db.execute(
        "SELECT COUNT(*) FROM actions WHERE at < ? AND NOT (action = 'launch' AND "
        "status = 'ok' AND parent_id IS NOT NULL)",
        (last - DAY,),
    ).fetchone()[0]
    assert old == 0
    # the same seed launched as many; those whose instance went over a day ago are gone
    went = {r[0] for r in kept.execute("SELECT instance_id FROM events WHERE kind = 'gone' "
                                     "AND at < ?", (last - DAY,))}  # fmt: skip
    owned, launched = _launched(db), _launched(kept)
    assert went and went < launched, (went, launched)
    assert owned == launched - went


def test_prune_command_counts_then_deletes(tmp_path: Path) -> None:
    db = _run(tmp_path, "retention: {days: null}\n")
    state = str(tmp_path / "s")
    ticks = db.execute("SELECT COUNT(*) FROM ticks").fetchone()[0]
    dry = ok(fg("--state", state, "prune", "--days", "1", "--dry-run")).stdout
    assert dry.startswith("would delete 7 ticks"), dry
    assert db.execute("SELECT COUNT(*) FROM ticks").fetchone()[0] == ticks
    done = ok(fg("prune", "--state", state, "--days", "1")).stdout
    assert done.startswith("deleted 7 ticks"), done
    assert db.execute("SELECT COUNT(*) FROM ticks").fetchone()[0] == ticks - 7
    assert ok(fg("--state", state, "prune", "--days", "1")).stdout.startswith("deleted nothing")
    ok(fg("--state", state, "status"))  # the journal still reads
    for days in ("0.5", "nan", "inf", "-3"):  # nan and inf were taken: nothing deleted, exit 0
        refused = fg("--state", state, "prune", "--days", days)
        assert refused.returncode == 2 and "at least 1" in refused.stderr, (days, refused)


def test_prune_goes_in_batches_and_stops_at_its_budget(tmp_path: Path) -> None:
    from controller.store.retention import prune

    j = Journal(tmp_path / "journal.db")
    try:
        for n in range(7):
            j.meta.finish_tick(j.meta.start_tick(n * DAY, "r"), n * DAY + 1, {})
        clock = iter(range(100))
        deleted, done = prune(
            j.store, 6 * DAY, 1, batch=2, budget_s=2.5, monotonic=lambda: float(next(clock))
        )
        assert (deleted, done) == ({"ticks": 4}, False)  # two batches fit the budget
        deleted, done = prune(j.store, 6 * DAY, 1, batch=2)
        assert (deleted, done) == ({"ticks": 1}, True)
        assert [t["started_at"] for t in j.meta.ticks()] == [6 * DAY, 5 * DAY]
    finally:
        j.close()


def test_launches_of_gone_instances_go_in_pages_within_the_budget(tmp_path: Path) -> None:
    from support import record_action

    from controller.core.track import Event
    from controller.store.retention import prune

    j = Journal(tmp_path / "journal.db")
    try:
        parent = record_action(j, 0.0, action="launch", target="fleet", status="ok")
        for n in range(5):
            row = record_action(j, 0.0, action="launch", target="fleet", status="ok",
                                parent_id=parent)  # fmt: skip
            j.actions.finish(row, 60.0, "ok", {"instance": f"i{n}", "label": f"fg-{n}"})
        j.fleet.save_tracks({}, [Event(f"i{n}", 120.0, "gone", {}) for n in range(4)])
        clock = iter(range(100))
        deleted, done = prune(
            j.store, 5 * DAY, 1, batch=2, budget_s=3.5, monotonic=lambda: float(next(clock))
        )
        assert (deleted, done) == (
            {"actions": 3},
            False,
        )  # ticks: none; the parent; one page of two launches
        deleted, done = prune(j.store, 5 * DAY, 1, batch=2)
        assert (deleted, done) == ({"actions": 2, "events": 4}, True)
        assert j.actions.launched_after(0) == [(parent + 5, "i4", "fg-4")]  # i4 never went
    finally:
        j.close()


def test_retention_settings_are_strict() -> None:
    from controller.store.retention import RetentionSettings

    assert RetentionSettings().days == 90
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        RetentionSettings(days=0.5)
    with pytest.raises(ValueError, match="Extra inputs"):
        RetentionSettings.model_validate({"keep": 3})


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_prune_on_each_backend_keeps_what_is_still_needed(backend: str, tmp_path: Path) -> None:
    """A journal past its window shrinks, on SQLite and on PostgreSQL alike; what the
    controller still needs stays: open intents, unknown outcomes, launches that rented an
    instance which may still be listed, pending escalations, the tracks of live instances, the
    demand history's last day."""
    from support import journal_on, record_action

    from controller.core.model import Demand
    from controller.core.track import Event, Track
    from controller.store.retention import count, prune

    now = 10 * DAY
    old, recent = 2 * DAY, now - 3600.0
    with journal_on(backend, tmp_path) as j:
        for at in (old, old + 60, recent):
            j.meta.finish_tick(j.meta.start_tick(at, "r"), at + 1, {})
            j.demand.record(at, [Demand("all", 3, 1)], {})
        done = record_action(j, old, status="ok")
        intent = record_action(j, old, action="destroy", status="intent")
        unknown = record_action(j, old, action="destroy", status="unknown")
        parent = record_action(j, old, action="launch", target="fleet", status="ok")

        def rented(instance: str | None) -> int:
            row = record_action(j, old, action="launch", target="fleet", status="ok",
                                parent_id=parent)  # fmt: skip
            j.actions.finish(row, old, "ok", {"instance": instance} if instance else {})
            return row

        # a launch stays while its instance may be listed: live (i1), or gone within the window
        # (i3); it goes once the instance went before the cutoff (i2), or if it names none
        owns_live, owns_late, owns_gone, owns_none = map(rented, ("i1", "i3", "i2", None))
        fresh = record_action(j, recent, status="ok")
        escs = {}
        for name, created in (("old_closed", old), ("old_pending", old), ("new", recent)):
            escs[name] = j.escalations.add_escalation(
                fingerprint=name, kind="unmatched", subject="s", summary=name, now=created,
                deadline=created + 600, situation={}, default_action={})  # fmt: skip
        j.escalations.set_escalation_status(escs["old_closed"], "expired")
        live = Track("i1", "m1", old, "running", old, "running", old, "up", old)
        j.fleet.save_tracks(
            {"i1": live}, [Event("i1", old, "seen", {}), Event("i1", recent, "seen", {}),
                           Event("i2", old + 60, "gone", {}), Event("i3", recent, "gone", {})]
        )  # fmt: skip

        would = count(j.store, now, 1)
        assert would == {"ticks": 2, "actions": 4, "events": 2, "escalations": 1,
                         "demand_history": 2}, would  # fmt: skip
        deleted, finished = prune(j.store, now, 1, batch=1)  # one row a transaction
        assert finished and deleted == would
        assert count(j.store, now, 1) == {}

        ids = {int(r["id"]) for r in j.actions.recent(100, executed_only=False)}
        assert ids == {intent, unknown, owns_live, owns_late, fresh}, ids
        assert not ids & {done, owns_gone, owns_none}
        assert {i for _, i, _ in j.actions.launched_after(0)} == {"i1", "i3"}
        left = {int(e["id"]) for e in j.escalations.recent(limit=10)}
        assert left == {escs["old_pending"], escs["new"]}
        assert set(j.fleet.tracks()) == {"i1"}
        assert [float(e["at"]) for e in j.fleet.events("i1")] == [recent]
        assert j.fleet.gone_before(now) == {"i3"}
        assert [t["started_at"] for t in j.meta.ticks()] == [recent]
        assert [at for at, *_ in j.demand.scored()] == [recent]

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


def _owned_launches(db: sqlite3.Connection) -> int:
    return int(
        db.execute(
            "SELECT COUNT(*) FROM actions WHERE action = 'launch' AND status = 'ok' "
            "AND parent_id IS NOT NULL"
        ).fetchone()[0]
    )


def test_without_retention_everything_stays(tmp_path: Path) -> None:
    db = _run(tmp_path, "retention: {days: null}\n")
    assert db.execute("SELECT COUNT(*) FROM ticks").fetchone()[0] == 12
    assert _oldest_tick_age_days(db) == pytest.approx(2.75)


def test_the_service_prunes_after_ticks_and_keeps_the_launches(tmp_path: Path) -> None:
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
    assert _owned_launches(db) == _owned_launches(kept) > 0  # the same seed launched as many


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
    too_short = fg("--state", state, "prune", "--days", "0.5")
    assert too_short.returncode == 2 and "at least 1" in too_short.stderr


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


def test_retention_settings_are_strict() -> None:
    from controller.store.retention import RetentionSettings

    assert RetentionSettings().days == 90
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        RetentionSettings(days=0.5)
    with pytest.raises(ValueError, match="Extra inputs"):
        RetentionSettings.model_validate({"keep": 3})

"""`explain` is gather + plan: it runs against a journal opened read-only and writes nothing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from controller.service.cli import main
from controller.store.journal import Journal, JournalError


def _digest(state: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(state.iterdir())}


def test_explain_plans_on_a_read_only_journal_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    for _ in range(6):  # a simulated fleet with instances, tracks, actions
        assert main(["--state", str(state), "tick"]) == 0
    capsys.readouterr()
    before = _digest(state)
    assert main(["--state", str(state), "explain", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert any(f["kind"] == "instance" for f in doc["facts"])  # it sensed the fleet
    assert doc["plan"] is not None
    after = _digest(state)
    assert after["journal.db"] == before["journal.db"]  # not a byte of the journal changed
    # SQLite's reader of a WAL journal may leave its index and an empty log, nothing more
    assert set(after) - set(before) <= {"journal.db-shm", "journal.db-wal"}
    assert not (state / "journal.db-wal").exists() or not (state / "journal.db-wal").read_bytes()


def test_a_read_only_journal_refuses_every_write(tmp_path: Path) -> None:
    Journal(tmp_path / "j.db").close()
    j = Journal(tmp_path / "j.db", read_only=True)
    assert j.meta.get("paused", False) is False
    with pytest.raises(JournalError, match="readonly|read-only|read only"):
        j.meta.put("paused", True)
    with pytest.raises(JournalError):
        j.meta.start_tick(1.0, "digest")
    j.close()

"""The contract of `journal.meta`: ticks, rule reloads, the key/value store."""

from __future__ import annotations

import pytest
from support import peer

from controller.store.backend import JournalError, JournalLost
from controller.store.journal import Journal
from controller.store.meta import MAX_PROBLEMS_CHARS


def test_times_keep_their_precision(j: Journal) -> None:
    at = 1_790_000_000.123456  # epoch seconds: a float4 column would be off by minutes
    tick = j.meta.start_tick(at, "digest")
    j.meta.finish_tick(tick, at + 0.5, {"launched": 1})
    [row] = j.meta.ticks(1)
    assert row["started_at"] == at and row["finished_at"] == at + 0.5
    assert row["summary"] == {"launched": 1} and j.meta.last_now() == at


def test_ticks_come_newest_first_and_an_unfinished_one_has_no_summary(j: Journal) -> None:
    assert j.meta.ticks() == [] and j.meta.last_now() is None
    first = j.meta.start_tick(10.0, "a")
    j.meta.finish_tick(first, 11.0, {})
    second = j.meta.start_tick(20.0, "b")
    rows = j.meta.ticks()
    assert [(r["id"], r["rules"]) for r in rows] == [(second, "b"), (first, "a")]
    assert rows[0]["summary"] is None and rows[0]["finished_at"] is None
    assert [r["id"] for r in j.meta.ticks(1)] == [second] and j.meta.last_now() == 20.0


def test_key_value_and_reopen(j: Journal) -> None:
    j.meta.put("paused", True)
    j.meta.put("paused", False)
    j.meta.put("sim", {"t": 1.5, "ids": [1, 2]})
    other = peer(j)
    assert other.meta.get("paused") is False and other.meta.get("sim") == {"t": 1.5, "ids": [1, 2]}
    assert other.meta.get("missing", 7) == 7 and other.meta.get("missing") is None
    other.close()


def test_reloads_are_journaled_with_their_problems_capped(j: Journal) -> None:
    j.meta.add_reload(1.0, True, "abc")
    j.meta.add_reload(2.0, False, "abc", "rules/x.yaml:3: bad")
    j.meta.add_reload(3.0, False, "def", "x" * (MAX_PROBLEMS_CHARS + 10))
    rows = j.meta.reloads()
    assert [(r["ok"], r["problems"]) for r in rows[:2]] == [(1, ""), (0, "rules/x.yaml:3: bad")]
    assert len(rows[2]["problems"]) == MAX_PROBLEMS_CHARS and rows[2]["digest"] == "def"


def test_the_identity_row_is_read_again_only_after_another_connection_wrote(
    j: Journal,
) -> None:
    made = j.meta.identity()
    reads: list[str] = []
    get = j.meta.get

    def counted(key: str, default: object = None) -> object:
        reads.append(key)
        return get(key, default)

    j.meta.get = counted  # type: ignore[method-assign]
    for _ in range(3):
        j.meta.check_identity(made)
    j.meta.put("paused", True)  # this process's own write: its identity row stays as it was
    j.meta.check_identity(made)
    expected_reads = 1 if j.store.kind == "sqlite" else 4  # PostgreSQL reads it every time
    assert reads == ["journal_id"] * expected_reads
    with pytest.raises(JournalLost, match="another journal"):
        j.meta.check_identity("some other id")  # asked about another id: read, and refused
    other = peer(j)
    with other.tx() as db:  # another connection deletes the row
        db.execute("DELETE FROM kv WHERE key = 'journal_id'")
    with pytest.raises(JournalLost, match="no identity row"):
        j.meta.check_identity(made)
    other.close()


def test_a_journal_a_later_release_wrote_is_refused_in_one_line(j: Journal) -> None:
    """A downgrade: the release before this one read the tracks this one stores as an error in
    every tick (an unexpected keyword), ticking on, escalating its own failures. A journal is
    marked with the format of the release that wrote it; one of a later format is refused when
    it is opened, saying why and what to do, and nothing is written to it."""
    from controller.store import meta

    other = peer(j)
    assert other.meta.get(meta.FORMAT_KEY) == meta.FORMAT  # opening marked it
    other.meta.put(meta.FORMAT_KEY, meta.FORMAT + 1)  # a later release opened it since
    other.close()
    with pytest.raises(JournalError, match=f"format {meta.FORMAT + 1};.* up to {meta.FORMAT}"):
        peer(j).close()
    assert j.meta.get(meta.FORMAT_KEY) == meta.FORMAT + 1

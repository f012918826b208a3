"""The contract of the escalation outbox's table (controller/store/outbox.py), on both backends:
one job of a kind per escalation, taken by one worker at a time, due again after a retry, kept
across a restart."""

from __future__ import annotations

from typing import Any

import pytest
from support import peer

from controller.store.journal import Journal
from controller.store.outbox import READ_AND_DELIVER, RESOLVE, Job, OutboxStore


def _raise(j: Journal, now: float = 1.0) -> int:
    return j.escalations.add_escalation(fingerprint="f", kind="unmatched", subject="fleet",
                                        summary="s", now=now, deadline=now + 99, situation={},
                                        default_action={"action": "hold"})  # fmt: skip


def _take(box: OutboxStore, now: float, worker: str = "w1") -> Job:
    job = box.take(now, worker, hold_s=60)
    assert job is not None
    return job


def test_a_job_is_queued_once_per_kind_and_taken_in_order(j: Journal) -> None:
    box = OutboxStore(j.store)
    a, b = _raise(j), _raise(j)
    first = box.add(a, READ_AND_DELIVER, 5.0, targets={"7", "3"})
    assert first is not None
    assert box.add(a, READ_AND_DELIVER, 6.0) is None  # queued already: nothing changes
    assert box.add(b, READ_AND_DELIVER, 5.0) and box.add(a, RESOLVE, 5.0)
    assert box.take(4.0, "w1", 60) is None  # not due before it was queued
    job = _take(box, 5.0)
    assert (job.id, job.escalation_id, job.kind, job.targets) == (first, a, READ_AND_DELIVER,
                                                                  ("3", "7"))  # fmt: skip
    assert job.attempts == 0 and job.routed is None and job.sent == ()
    assert [_take(box, 5.0).escalation_id, _take(box, 5.0).kind] == [b, RESOLVE]
    assert box.take(5.0, "w1", 60) is None  # all held
    with pytest.raises(ValueError, match="is not one of"):
        box.add(a, "page", 5.0)


def test_a_held_job_is_nobody_elses_until_its_hold_runs_out(j: Journal) -> None:
    box = OutboxStore(j.store)
    box.add(_raise(j), READ_AND_DELIVER, 1.0)
    job = _take(box, 1.0, "w1")
    other = OutboxStore(j.store)
    assert other.take(1.0, "w2", 60) is None
    assert not other.finish(job, "w2", 2.0, "not mine")  # only the holder records an outcome
    assert box.finish(job, "w1", 2.0, "delivered to 1 channel(s)", sent=["0:console"])
    [row] = box.jobs()
    assert row["done_at"] == 2.0 and row["outcome"].startswith("delivered")
    assert row["attempts"] == 1 and row["sent"] == ["0:console"] and row["taken_by"] is None
    assert box.take(9.0, "w2", 60) is None  # done: never taken again


def test_a_hold_that_ran_out_lets_another_worker_take_the_job(j: Journal) -> None:
    box = OutboxStore(j.store)
    box.add(_raise(j), READ_AND_DELIVER, 1.0)
    job = box.take(1.0, "dead", hold_s=-1.0)  # its worker died long ago
    assert job is not None
    again = _take(box, 1.0, "w2")
    assert again.id == job.id
    assert not box.routed(job, "dead", {"acted": False, "why": "x"})


def test_a_retry_keeps_progress_and_is_due_after_its_backoff(j: Journal) -> None:
    box = OutboxStore(j.store)
    box.add(_raise(j), READ_AND_DELIVER, 1.0)
    job = _take(box, 1.0)
    routed: dict[str, Any] = {"acted": False, "why": "the LLM is unsure", "proposal": None}
    assert box.routed(job, "w1", routed)
    assert box.retry(job, "w1", next_at=31.0, error="email: timed out", sent=["0:console"])
    assert box.take(30.0, "w1", 60) is None
    again = _take(box, 31.0)
    assert again.attempts == 1 and again.routed == routed and again.sent == ("0:console",)
    assert again.last_error == "email: timed out"
    assert box.release(again, "w1", next_at=40.0, error="stopped", routed={"acted": False,
                                                                           "why": "y"})  # fmt: skip
    [row] = box.jobs(again.escalation_id, undone=True)
    assert row["attempts"] == 2 and row["routed"]["why"] == "y" and row["next_at"] == 40.0


def test_jobs_survive_a_restart(j: Journal) -> None:
    esc = _raise(j)
    OutboxStore(j.store).add(esc, READ_AND_DELIVER, 1.0, routed={"acted": False, "why": "w"})
    later = peer(j)  # another process opening the same journal
    try:
        job = _take(OutboxStore(later.store), 2.0)
        assert job.escalation_id == esc and job.routed == {"acted": False, "why": "w"}
    finally:
        later.close()


def test_an_escalation_and_its_job_are_written_together(j: Journal) -> None:
    box = OutboxStore(j.store)
    with pytest.raises(RuntimeError), j.tx():
        esc = _raise(j)
        box.add(esc, READ_AND_DELIVER, 1.0)
        raise RuntimeError("the process stops here")
    assert j.escalations.recent() == [] and box.jobs() == []

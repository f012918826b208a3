"""The outbox worker: the LLM calls and deliveries the tick queued, done off the tick.

`Outbox.work(now, deadline_s=...)`:

1. take the first due job nobody holds (controller/store/outbox.py), held for `HOLD_S`;
2. `read_and_deliver`: an escalation no longer pending (answered, resolved, expired) is
   nobody's business: the job ends there. Otherwise ask the LLM unless the job says it is
   people's already (`Escalator.read` journals the call); an answer that may act approves the
   escalation; anything else goes to the channels that do not have it yet, with the LLM's
   proposal and why it came to people, and, under "already done", how the earlier escalations
   of the same situation ended; an LLM that answered `notify` has its message sent as a notice
   of its own. `resolve`: end the open alerts on every channel that keeps them, whatever the
   escalation's state. A notice (`notice:<source>`: a `notify` action, an approved answer the
   guards changed): to the channels that do not have it yet, each outcome kept in its row;
3. record the outcome: done; or, when a channel failed, due again after `backoff_s`, doubled
   each try, for the failed channels only; after `attempts` tries, done as failed;
4. go on until no job is due, `deadline_s` (real seconds) has passed, or `stopping` is set.

Who runs it: the simulator right after each write, in the tick (`Escalator.after_write`), so a
replay is the same every run; `fleetgate run` a daemon thread (`Background`), woken by each
write; `fleetgate tick` one pass bounded in real time after the tick (`step`).

A job cut short (a step that ran out, a shutdown) is let go for the next worker: cut short
while the LLM was thinking, it goes to people next time (the silence is journaled as an
unavailable LLM); cut short while delivering, it is tried again (a channel may get it twice).

Must not: decide whether to escalate (the router does), act on the fleet, or block a tick
outside the simulator.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from controller.store.outbox import NO_ESCALATION, RESOLVE, Job
from escalation.channels.base import Channel
from escalation.notify import Notifier, earlier_entries, llm_notice
from escalation.router import Escalator, Routed
from escalation.situation import Situation, from_dict

log = logging.getLogger(__name__)

HOLD_S = 300.0  # a job taken by a worker that died is taken again this much later
MAX_BACKOFF_S = 3600.0


@dataclass(frozen=True)
class _Doing:
    job: Job
    stage: str  # "read" (the LLM), "deliver" or "resolve"


def _keyed(channels: Sequence[Channel]) -> list[tuple[str, Channel]]:
    """Each channel with the key a job remembers it by (two channels may share a name)."""
    return [(f"{n}:{getattr(c, 'name', type(c).__name__)}", c) for n, c in enumerate(channels)]


class Outbox:
    """Works the outbox of one escalator (its journal, LLM reader and channels)."""

    def __init__(self, escalator: Escalator, *, attempts: int = 6, backoff_s: float = 30.0,
                 hold_s: float = HOLD_S, worker: str | None = None) -> None:  # fmt: skip
        if attempts < 1 or backoff_s < 0:
            raise ValueError("outbox attempts must be >= 1 and backoff_s >= 0")
        self.escalator, self.jobs = escalator, escalator.jobs
        self.attempts, self.backoff_s, self.hold_s = attempts, backoff_s, hold_s
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._doing: _Doing | None = None

    def work(self, now: float, *, deadline_s: float | None = None, limit: int | None = None) -> int:
        """Steps 1-4 (at most `limit` jobs); returns how many jobs were taken."""
        started, taken = time.monotonic(), 0
        while not self.stopping.is_set() and (limit is None or taken < limit):
            if deadline_s is not None and time.monotonic() - started >= deadline_s:
                break
            job = self.jobs.take(now, self.worker, self.hold_s)
            if job is None:
                break
            taken += 1
            self._run(job, now)
        return taken

    def _run(self, job: Job, now: float) -> None:
        try:
            if job.attempts >= self.attempts:  # its tries were cut short, each one
                log.error("outbox job #%d (escalation #%d): %s; gave up after %d tries", job.id,
                          job.escalation_id, job.last_error, job.attempts)  # fmt: skip
                self._finish(job, now, f"failed after {job.attempts} tries")
            elif job.kind == RESOLVE:
                self._resolve(job, now)
            elif job.is_notice:
                self._notice(job, now)
            else:
                self._read_and_deliver(job, now)
        except Exception as exc:  # noqa: BLE001 - one bad job must not stop the others
            if self.stopping.is_set():
                log.debug("outbox job #%d stopped: %s", job.id, exc)
                return
            log.exception("outbox job #%d (escalation #%d) failed", job.id, job.escalation_id)
            self._again(job, now, f"{type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._doing = None

    def _stage(self, job: Job, stage: str) -> None:
        with self._lock:
            self._doing = _Doing(job, stage)

    def _read_and_deliver(self, job: Job, now: float) -> None:
        fresh = self.escalator.fresh.pop(job.escalation_id, None)
        esc = self._pending(job, now)
        if esc is None:
            return
        s = fresh if fresh is not None else from_dict(esc["situation"])
        if job.routed is not None:
            routed = Routed.of(job.routed)
        else:
            self._stage(job, "read")
            routed = self.escalator.read(job.escalation_id, s, job.targets, now)
            if not self.jobs.routed(job, self.worker, routed.as_dict()):
                return  # let go while the LLM was thinking: the next worker has it
            esc = self._pending(job, now)  # people may have answered meanwhile
            if esc is None:
                return
        if routed.acted and routed.proposal is not None:
            ok = self.escalator.approve(job.escalation_id, routed, now)
            self._finish(job, now, f"approved by {routed.proposal['proposer']}" if ok
                         else "not approved: the escalation was answered meanwhile")  # fmt: skip
            return
        proposal = routed.proposal or {}
        if proposal.get("action") == "notify":  # what it wants people to know, as it said it
            self.jobs.add_notice(
                job.escalation_id,
                "llm",
                llm_notice(job.escalation_id, s.subject, proposal, now),
                now,
            )
        self._stage(job, "deliver")
        shown = self.escalator.shown(s, routed)
        before = self.escalator.journal.escalations.earlier(str(esc["fingerprint"]),
                                                            job.escalation_id)  # fmt: skip
        if before:
            shown = replace(shown, recent_actions=(*earlier_entries(before),
                                                   *shown.recent_actions))  # fmt: skip
        self._deliver(job, esc, shown, routed.why, now)

    def _pending(self, job: Job, now: float) -> dict[str, Any] | None:
        """The escalation, if it still waits for an answer; else the job ends here."""
        esc = self.escalator.journal.escalations.escalation(job.escalation_id)
        if esc is None or esc["status"] != "pending":
            state = esc["status"] if esc else "gone"
            log.info("escalation #%d is %s: nobody is told", job.escalation_id, state)
            self._finish(job, now, f"not sent: the escalation is {state}")
            return None
        return esc

    def _deliver(self, job: Job, esc: dict[str, Any], s: Situation, why: str, now: float) -> None:
        left = [(k, c) for k, c in _keyed(self.escalator.notifier.channels) if k not in job.sent]
        out = self.escalator.deliver(job.escalation_id, s, str(esc["fingerprint"]),
                                     float(esc["created_at"]), now, why,
                                     [c for _, c in left], again=job.attempts > 0)  # fmt: skip
        self._settle(job, now, left, out, "delivered")

    def _settle(self, job: Job, now: float, left: list[tuple[str, Any]], out: list[Any],
                done: str) -> None:  # fmt: skip
        """After a delivery to the channels `left`: try again those that failed, else done."""
        sent = [*job.sent, *(k for (k, _), d in zip(left, out, strict=True) if d.ok)]
        failed = [f"{d.channel}: {d.detail}" for d in out if not d.ok]
        if failed:
            self._again(job, now, "; ".join(failed), sent)
        else:
            self._finish(job, now, f"{done} to {len(sent)} channel(s)", sent=sent)

    def _notice(self, job: Job, now: float) -> None:
        """Send a notice to the channels that do not have it yet; keep each outcome."""
        if job.notice is None:
            self._finish(job, now, "not sent: the notice is empty")
            return
        self._stage(job, "deliver")
        left = [(k, c) for k, c in _keyed(self.escalator.notifier.channels) if k not in job.sent]
        how = {}
        if job.escalation_id != NO_ESCALATION:
            how = {k: v for k, v in self.escalator.how(job.escalation_id).items()
                   if k == "view_url"}  # fmt: skip
        notifier = Notifier([c for _, c in left], self.escalator.notifier.renderer)
        out = notifier.notice(job.notice, how, self.escalator.journal.meta.identity())
        self.jobs.delivered(job, [{"channel": d.channel, "at": now, "ok": d.ok,
                                   "detail": d.detail} for d in out])  # fmt: skip
        self._settle(job, now, left, out, "notice delivered")

    def _resolve(self, job: Job, now: float) -> None:
        esc = self.escalator.journal.escalations.escalation(job.escalation_id)
        if esc is None:
            self._finish(job, now, "not resolved: no such escalation")
            return
        self._stage(job, "resolve")
        left = [(k, c) for k, c in _keyed(self.escalator.notifier.channels)
                if k not in job.sent and getattr(c, "resolve", None) is not None]  # fmt: skip
        errors = self.escalator.resolve_alerts(job.escalation_id, esc, [c for _, c in left])
        sent = [*job.sent, *(k for (k, _), e in zip(left, errors, strict=True) if e is None)]
        failed = [e for e in errors if e is not None]
        if failed:
            self._again(job, now, "; ".join(failed), sent)
        else:
            self._finish(job, now, f"resolved on {len(sent)} channel(s)", sent=sent)

    def _finish(self, job: Job, now: float, outcome: str, *, error: str | None = None,
                sent: Sequence[str] | None = None) -> None:  # fmt: skip
        self.jobs.finish(job, self.worker, now, outcome, error=error, sent=sent)

    def _again(self, job: Job, now: float, error: str, sent: Sequence[str] | None = None) -> None:
        """A try failed: due again after the backoff, or, out of tries, done as failed."""
        tries = job.attempts + 1
        if tries >= self.attempts:
            log.error("outbox job #%d (escalation #%d): %s; gave up after %d tries", job.id,
                      job.escalation_id, error, tries)  # fmt: skip
            self._finish(job, now, f"failed after {tries} tries", error=error, sent=sent)
            return
        delay = min(self.backoff_s * 2 ** (tries - 1), MAX_BACKOFF_S)
        log.warning("outbox job #%d (escalation #%d): %s; trying again in %.0f s", job.id,
                    job.escalation_id, error, delay)  # fmt: skip
        self.jobs.retry(job, self.worker, next_at=now + delay, error=error, sent=sent)

    def abandon(self, now: float, why: str) -> None:
        """Stop, and let the job in progress go for the next worker (see the module's text)."""
        self.stopping.set()
        with self._lock:
            doing, self._doing = self._doing, None
        if doing is None:
            return
        job, reader = doing.job, self.escalator.reader
        thinking = doing.stage == "read" and reader is not None
        routed = Routed(False, f"the LLM gave no usable answer (unavailable: {why})")
        delay = 0.0 if thinking else min(self.backoff_s * 2**job.attempts, MAX_BACKOFF_S)
        if not self.jobs.release(job, self.worker, next_at=now + delay, error=why,
                                 routed=routed.as_dict() if thinking else None):  # fmt: skip
            return
        log.warning("outbox job #%d (escalation #%d): %s; let go for the next run", job.id,
                    job.escalation_id, why)  # fmt: skip
        if thinking and reader is not None:
            self.escalator.journal.llm.add_llm_call(escalation_id=job.escalation_id, now=now,
                                                model=reader.model, status="unavailable",
                                                error=why, routed="people")  # fmt: skip


class Background:
    """`fleetgate run`: a daemon thread that works the outbox whenever a write wakes it, and
    every `poll_s` (jobs due for a retry, jobs another process queued)."""

    def __init__(self, outbox: Outbox, clock: Callable[[], float], *, poll_s: float = 1.0,
                 grace_s: float = 5.0) -> None:  # fmt: skip
        self.outbox, self.clock = outbox, clock
        self.poll_s, self.grace_s = poll_s, grace_s
        self._wake, self._stopped = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._loop, name="outbox", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self, _now: float = 0.0) -> None:
        self._wake.set()

    def stop(self) -> None:
        """What is due gets `grace_s` more (one last pass); then the job in progress is let go
        and the rest waits for the next run."""
        self._stopped.set()
        self._wake.set()
        self._thread.join(self.grace_s)
        if self._thread.is_alive():
            self.outbox.abandon(self.clock(), "the controller stopped before the job was done")

    def _loop(self) -> None:
        while True:
            last = self._stopped.is_set()
            self._wake.clear()
            try:
                while self.outbox.work(self.clock(), limit=1):  # each job at its own time
                    pass
            except Exception:  # noqa: BLE001 - the worker outlives a journal outage
                log.exception("outbox: the worker failed; trying again in %.0f s", self.poll_s)
                if not last:
                    self._stopped.wait(self.poll_s)  # pushed back, woken or not
            if last or self.outbox.stopping.is_set():
                return
            self._wake.wait(self.poll_s)


def step(outbox: Outbox, clock: Callable[[], float], seconds: float) -> int:
    """`fleetgate tick`: work the outbox for at most `seconds` (real time), in a thread of its
    own; a job still running then is let go for the next run. Returns the jobs taken."""
    taken: list[int] = []

    def run() -> None:
        try:
            taken.append(outbox.work(clock(), deadline_s=seconds))
        except Exception:  # noqa: BLE001 - the tick is done; what is left waits for the next
            log.exception("outbox: the step failed; its jobs wait for the next run")

    thread = threading.Thread(target=run, name="outbox-step", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        outbox.abandon(clock(), f"not done within the outbox step of {seconds:g} s")
    return taken[0] if taken else 0

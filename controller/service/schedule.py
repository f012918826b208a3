"""Drive ticks on an interval with APScheduler 3.

One tick at a time (a single worker, `max_instances=1`), missed ticks coalesced into one,
the first tick at once. Intervals are kept by the monotonic clock: each tick is scheduled
`interval_s` after the one before (`SteadyInterval`), APScheduler's wait is a monotonic one, and
if the wall clock stepped back while it waited (APScheduler would then wait out the step), a
watchdog runs the overdue tick. The controller notices the step itself and holds that tick
(`controller.service.tick`). SIGTERM/SIGINT set a flag: the tick in progress finishes, no new one
starts, and `run` returns. A tick that raises is logged and the schedule goes on.

With a lease (controller/store/lease.py), a thread of its own renews it every `renew_s` and a tick
runs only while this process leads; a standby polls until the leader's lease runs out (waking
just after it expires, so failover takes at most the TTL plus a poll's jitter) and ticks at
once when it takes over. A clean stop releases the lease so a standby need not wait.

The escalation outbox (escalation/outbox.py) runs in a thread of its own beside the ticks, so
an LLM or a mail server that hangs never delays one; it stops after the last tick.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.base import BaseTrigger

from controller.service.sdnotify import Notifier
from controller.store.backend import JournalError, StaleLeader
from controller.store.lease import Lease, LeaseState, read
from escalation.outbox import Background

log = logging.getLogger(__name__)

OVERDUE_S = 1.0  # a tick this late by the monotonic clock was lost to a step of the wall clock


class _NoSkippedRuns(logging.Filter):
    """APScheduler's warning for each run skipped while a tick outlasts `interval_s` (a line
    with the job's repr, every interval): the runner says it once a tick, in its own words."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "maximum number of running instances reached" not in str(record.msg)


logging.getLogger("apscheduler.scheduler").addFilter(_NoSkippedRuns())


class SteadyInterval(BaseTrigger):  # type: ignore[misc]
    """Every `interval_s` after the last fire, whatever the wall clock did in between; `due` is
    the next fire by the monotonic clock."""

    def __init__(self, interval_s: float, monotonic: Callable[[], float] = time.monotonic):
        self.interval_s, self.monotonic = interval_s, monotonic
        self.due: float | None = None

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime:
        self.due = self.monotonic() + self.interval_s
        return now + timedelta(seconds=self.interval_s)

    def overdue(self) -> bool:
        return self.due is not None and self.monotonic() > self.due + OVERDUE_S


class Runner:
    """Runs `tick` every `interval_s` seconds until stopped or `max_ticks` ticks are done."""

    def __init__(self, tick: Callable[[], Any], interval_s: float, max_ticks: int | None = None,
                 on_hup: Callable[[], None] | None = None, lease: Lease | None = None,
                 renew_s: float = 5.0, outbox: Background | None = None,
                 notify: Notifier | None = None):  # fmt: skip
        self.tick = tick
        self.on_hup = on_hup
        self.interval_s = interval_s
        self.max_ticks = max_ticks
        self.lease = lease
        self.renew_s = renew_s
        self.outbox = outbox  # the escalation outbox's thread: started and stopped with the ticks
        self.notify = notify or Notifier(None)  # systemd (controller/service/sdnotify.py)
        self.done = 0
        self.failed = 0
        self.standby = 0  # ticks skipped while another controller leads
        self.stop = threading.Event()
        self._scheduler: BackgroundScheduler | None = None
        self._trigger = SteadyInterval(interval_s)
        self._running = threading.Event()
        self._seen: tuple[str | None, int] | None = None  # the leader last reported standing by
        self._named: tuple[int, float] | None = None  # (token, expiry) of a lease of our name
        self._told: int | None = None  # the term another controller of our name was told of
        self._long = False  # the tick running has outlasted interval_s (said once a tick)

    def _job(self) -> None:
        self._running.set()
        self._long = False
        try:
            self._run_once()
        finally:
            self._running.clear()

    def _run_once(self) -> None:
        if self.stop.is_set():
            return
        if self.lease is not None and not self._may_act():
            self.standby += 1
            self.notify.watchdog()
            return
        try:
            self.tick()
        except StaleLeader as exc:
            self.failed += 1
            log.error("%s; standing by", exc)
            self._renew()
        except JournalError as exc:  # the journal's database failed: its own words say it all
            self.failed += 1
            log.error("tick failed: %s; the next one runs on schedule", exc)
        except Exception:  # noqa: BLE001 - one bad tick must not end the service
            self.failed += 1
            log.exception("tick failed; the next one runs on schedule")
        if not self.stop.is_set():  # alive: a tick that fails still came back
            self.notify.watchdog()
        self.done += 1
        if self.max_ticks is not None and self.done >= self.max_ticks:
            self.stop.set()

    def _may_act(self) -> bool:
        """The lease allows a tick; a journal that cannot say so stops this process leading,
        as a failed renewal does (the lease thread says so and tries again)."""
        assert self.lease is not None
        try:
            return self.lease.may_act()
        except JournalError as exc:
            log.error("lease %r: %s; not acting until it is renewed", self.lease.name, exc)
            self.lease.token = None
            return False

    def _renew(self) -> float:
        """Renew (or try to take) the lease; seconds until the next try."""
        assert self.lease is not None
        was = self.lease.leading
        try:
            leading = self.lease.renew()
            if leading:
                if not was and self._scheduler is not None:  # took over: tick at once
                    self._scheduler.modify_job("tick", next_run_time=datetime.now(UTC))
                if not was:
                    self.notify.ready(f"leading as {self.lease.holder}")
                return self.renew_s
            state = read(self.lease.journal, self.lease.name, ttl_s=self.lease.ttl_s)
            left = state.expires_in_s
            if not self.stop.is_set():  # after STOPPING=1, nothing more
                if not self.notify.ready_sent or was:
                    self.notify.ready(f"standing by: lease {self.lease.name!r} held by "
                                      f"{state.holder}")  # fmt: skip
                self.notify.watchdog()  # the standby loop is alive
            if self._seen != (state.holder, state.token):
                self._seen = (state.holder, state.token)
                log.warning("standing by: lease %r is held by %s (token %d, %.0f s left)",
                            self.lease.name, state.holder, state.token, left)  # fmt: skip
            if state.holder == self.lease.holder:
                self._same_name(state)
        except JournalError as exc:
            log.error("lease %r: %s; not acting until it is renewed", self.lease.name, exc)
            self.lease.token = None  # no new tick; the fence stays: the store still checks it
            return self.renew_s
        return min(self.renew_s, max(0.05, left + 0.05))

    def _same_name(self, state: LeaseState) -> None:
        """This controller's name on a lease it does not hold: a term of its own that lapsed,
        or a predecessor's of the same name (a restart), until it is renewed; then another
        controller has this one's name, and is told of once per term."""
        assert self.lease is not None
        seen, self._named = self._named, (state.token, state.expires_at)
        if seen is None or seen[0] != state.token or seen[1] == state.expires_at:
            return
        if self._told != state.token:
            self._told = state.token
            log.error("lease %r is renewed by another controller named %s (token %d): give "
                      "each controller a name of its own (lease.holder, or leave it unset for "
                      "host:pid), or none of them can tell who leads", self.lease.name,
                      state.holder, state.token)  # fmt: skip

    def _watch(self) -> None:
        """Run an overdue tick now: the wall clock stepped back under APScheduler's wait."""
        if self._scheduler is None or self._running.is_set() or not self._trigger.overdue():
            return
        log.warning(
            "the tick is %.1f s overdue by the monotonic clock (the wall clock stepped "
            "back, or this process was stopped or its host suspended): running it now",
            self._trigger.monotonic() - (self._trigger.due or 0),
        )
        self._trigger.due = None  # once, until it has fired
        self._scheduler.modify_job("tick", next_run_time=datetime.now(UTC))

    def _lease_loop(self) -> None:
        while not self.stop.wait(self._renew()):
            pass

    def _on_hup(self, _signum: int, _frame: FrameType | None) -> None:
        log.warning("SIGHUP: the rules are read again on the next tick")
        if self.on_hup is not None:
            self.on_hup()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        log.warning("%s: finishing the current tick, then exiting", signal.Signals(signum).name)
        self.stop.set()

    def run(self) -> int:
        """Block until stopped; return the number of ticks run."""
        scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=1)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            timezone=UTC,
        )
        trigger = self._trigger
        keeper = None
        # before READY=1: systemd runs a `reload` queued behind the start once it is ready, and
        # a SIGHUP that came before the handler ended the process (a clean exit to systemd,
        # which Restart=on-failure does not restart)
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
            signal.signal(signal.SIGHUP, self._on_hup)
        try:
            if self.lease is not None:
                self._renew()  # lead (or not) before the first tick; READY=1 either way
                keeper = threading.Thread(target=self._lease_loop, name="lease", daemon=True)
            else:
                self.notify.ready("leading (no lease)")
        except BaseException:
            self._restore(previous)
            raise
        scheduler.add_listener(self._skipped, EVENT_JOB_MAX_INSTANCES)
        scheduler.add_job(self._job, trigger, id="tick", next_run_time=datetime.now(UTC))
        self._scheduler = scheduler
        if self.outbox is not None:
            self.outbox.start()
        scheduler.start()
        if keeper is not None:
            keeper.start()
        try:
            while not self.stop.wait(0.2):
                self._watch()
        finally:
            self.notify.stopping("finishing the current tick")
            scheduler.shutdown(wait=True)  # lets a tick in progress finish
            if self.outbox is not None:
                self.outbox.stop()  # the job in progress gets a grace, then waits for the next run
            if keeper is not None and self.lease is not None:
                keeper.join()
                try:
                    self.lease.release()
                except JournalError as exc:
                    log.error("could not release the lease: %s", exc)
            self._restore(previous)
        return self.done

    def _skipped(self, _event: JobSubmissionEvent) -> None:
        """A run skipped because the tick before it still runs: said once a tick."""
        if not self._long:
            self._long = True
            log.warning("a tick has run longer than interval_s (%g s): the next one starts "
                        "when it ends", self.interval_s)  # fmt: skip

    @staticmethod
    def _restore(previous: dict[signal.Signals, Any]) -> None:
        if threading.current_thread() is threading.main_thread():
            for s, handler in previous.items():
                signal.signal(s, handler)

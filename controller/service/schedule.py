"""Drive ticks on an interval with APScheduler 3.

One tick at a time (a single worker, `max_instances=1`), missed ticks coalesced into one,
the first tick at once. SIGTERM/SIGINT set a flag: the tick in progress finishes, no new one
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
from collections.abc import Callable
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from controller.store.backend import JournalError, StaleLeader
from controller.store.lease import Lease, read
from escalation.outbox import Background

log = logging.getLogger(__name__)


class Runner:
    """Runs `tick` every `interval_s` seconds until stopped or `max_ticks` ticks are done."""

    def __init__(self, tick: Callable[[], Any], interval_s: float, max_ticks: int | None = None,
                 on_hup: Callable[[], None] | None = None, lease: Lease | None = None,
                 renew_s: float = 5.0, outbox: Background | None = None):  # fmt: skip
        self.tick = tick
        self.on_hup = on_hup
        self.interval_s = interval_s
        self.max_ticks = max_ticks
        self.lease = lease
        self.renew_s = renew_s
        self.outbox = outbox  # the escalation outbox's thread: started and stopped with the ticks
        self.done = 0
        self.failed = 0
        self.standby = 0  # ticks skipped while another controller leads
        self.stop = threading.Event()
        self._scheduler: BackgroundScheduler | None = None

    def _job(self) -> None:
        if self.stop.is_set():
            return
        if self.lease is not None and not self.lease.may_act():
            self.standby += 1
            return
        try:
            self.tick()
        except StaleLeader as exc:
            self.failed += 1
            log.error("%s; standing by", exc)
            self._renew()
        except Exception:  # noqa: BLE001 - one bad tick must not end the service
            self.failed += 1
            log.exception("tick failed; the next one runs on schedule")
        self.done += 1
        if self.max_ticks is not None and self.done >= self.max_ticks:
            self.stop.set()

    def _renew(self) -> float:
        """Renew (or try to take) the lease; seconds until the next try."""
        assert self.lease is not None
        was = self.lease.leading
        try:
            leading = self.lease.renew()
            if leading:
                if not was and self._scheduler is not None:  # took over: tick at once
                    self._scheduler.modify_job("tick", next_run_time=datetime.now(UTC))
                return self.renew_s
            left = read(self.lease.journal, self.lease.name).expires_in_s
        except JournalError as exc:
            log.error("lease %r: %s; not acting until it is renewed", self.lease.name, exc)
            self.lease.token = None  # no new tick; the fence stays: the store still checks it
            return self.renew_s
        return min(self.renew_s, max(0.05, left + 0.05))

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
        trigger = IntervalTrigger(seconds=self.interval_s, timezone=UTC)
        keeper = None
        if self.lease is not None:
            self._renew()  # lead (or not) before the first tick
            keeper = threading.Thread(target=self._lease_loop, name="lease", daemon=True)
        scheduler.add_job(self._job, trigger, id="tick", next_run_time=datetime.now(UTC))
        self._scheduler = scheduler
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
            signal.signal(signal.SIGHUP, self._on_hup)
        if self.outbox is not None:
            self.outbox.start()
        scheduler.start()
        if keeper is not None:
            keeper.start()
        try:
            while not self.stop.wait(0.2):
                pass
        finally:
            scheduler.shutdown(wait=True)  # lets a tick in progress finish
            if self.outbox is not None:
                self.outbox.stop()  # the job in progress gets a grace, then waits for the next run
            if keeper is not None and self.lease is not None:
                keeper.join()
                try:
                    self.lease.release()
                except JournalError as exc:
                    log.error("could not release the lease: %s", exc)
            if threading.current_thread() is threading.main_thread():
                for s, handler in previous.items():
                    signal.signal(s, handler)
        return self.done

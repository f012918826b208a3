"""Drive ticks on an interval with APScheduler 3.

One tick at a time (a single worker, `max_instances=1`), missed ticks coalesced into one,
the first tick at once. SIGTERM/SIGINT set a flag: the tick in progress finishes, no new one
starts, and `run` returns. A tick that raises is logged and the schedule goes on.
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

log = logging.getLogger(__name__)


class Runner:
    """Runs `tick` every `interval_s` seconds until stopped or `max_ticks` ticks are done."""

    def __init__(self, tick: Callable[[], Any], interval_s: float, max_ticks: int | None = None,
                 on_hup: Callable[[], None] | None = None):  # fmt: skip
        self.tick = tick
        self.on_hup = on_hup
        self.interval_s = interval_s
        self.max_ticks = max_ticks
        self.done = 0
        self.failed = 0
        self.stop = threading.Event()

    def _job(self) -> None:
        if self.stop.is_set():
            return
        try:
            self.tick()
        except Exception:  # noqa: BLE001 - one bad tick must not end the service
            self.failed += 1
            log.exception("tick failed; the next one runs on schedule")
        self.done += 1
        if self.max_ticks is not None and self.done >= self.max_ticks:
            self.stop.set()

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
        scheduler.add_job(self._job, trigger, id="tick", next_run_time=datetime.now(UTC))
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
            signal.signal(signal.SIGHUP, self._on_hup)
        scheduler.start()
        try:
            while not self.stop.wait(0.2):
                pass
        finally:
            scheduler.shutdown(wait=True)  # lets a tick in progress finish
            if threading.current_thread() is threading.main_thread():
                for s, handler in previous.items():
                    signal.signal(s, handler)
        return self.done

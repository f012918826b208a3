"""The runner's schedule: a tick that outlasts `interval_s` is said once, in the runner's words."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from controller.service.schedule import Runner


def test_a_tick_longer_than_the_interval_is_said_once_not_at_every_skipped_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two ticks of 0.4 s every 0.05 s: APScheduler skips about seven runs a tick and logged a
    warning with the job's repr for each; the runner says it once a tick."""
    done = threading.Event()

    def slow_tick() -> None:
        time.sleep(0.4)
        done.set()

    runner = Runner(slow_tick, 0.05, max_ticks=2)
    with caplog.at_level(logging.WARNING):
        assert runner.run() == 2
    assert done.is_set()
    skipped = [r for r in caplog.records if "maximum number of running instances" in r.getMessage()]
    said = [r for r in caplog.records if "has run longer than interval_s" in r.getMessage()]
    assert skipped == [] and 1 <= len(said) <= 2, [r.getMessage() for r in caplog.records]

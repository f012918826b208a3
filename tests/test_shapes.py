"""The simulator's generated workloads: the `short` shape is deterministic, cycles daily and
weekly by the ratios it promises, bursts, and keeps its run times within 20-120 s."""

from __future__ import annotations

import hashlib
import statistics
from collections import Counter

import pytest

from controller.sim.shapes import DAY, ShortShape, short_tasks, tasks_of

HOUR = 3600.0


def test_the_same_seed_gives_the_same_tasks_and_another_seed_others() -> None:
    first, again, other = short_tasks(2, 5), short_tasks(2, 5), short_tasks(2, 6)
    assert first == again
    assert first != other
    assert tasks_of("short", 2, 5) == first


def test_run_times_stay_within_20_and_120_s_and_arrivals_are_sorted_within_the_days() -> None:
    tasks = short_tasks(3, 1)
    services = [t.service_s for t in tasks]
    assert min(services) >= 20.0 and max(services) <= 120.0
    # spread over the range, not bunched at one end
    assert 60.0 < statistics.mean(services) < 80.0
    arrivals = [t.arrival_s for t in tasks]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0.0 and arrivals[-1] < 3 * DAY


def test_the_daily_cycle_has_a_peak_at_least_ten_times_its_trough() -> None:
    shape = ShortShape()
    rates = [shape.daily(h * HOUR) for h in range(24)]
    assert max(rates) / min(rates) >= 10.0
    # and the generated arrivals follow it: weekday hours near the peak against near the trough
    tasks = short_tasks(5, 3, ShortShape(bursts_per_day=0.0))  # Monday to Friday, no bursts
    by_hour = Counter(int(t.arrival_s // HOUR) % 24 for t in tasks)
    peak = sum(by_hour[h] for h in (13, 14, 15))
    trough = sum(by_hour[h] for h in (1, 2, 3))
    assert peak / trough >= 8.0, (peak, trough)


def test_weekends_are_quieter_than_weekdays() -> None:
    tasks = short_tasks(7, 4, ShortShape(bursts_per_day=0.0))
    by_day = Counter(int(t.arrival_s // DAY) for t in tasks)
    weekday = statistics.mean(by_day[d] for d in range(5))
    weekend = statistics.mean(by_day[d] for d in (5, 6))
    assert 0.4 < weekend / weekday < 0.6  # weekend_factor 0.5


def test_bursts_add_arrivals_above_the_cycle() -> None:
    calm = short_tasks(7, 9, ShortShape(bursts_per_day=0.0))
    bursty = short_tasks(7, 9)
    assert len(bursty) > len(calm) * 1.02
    # some 10-minute window holds far more arrivals than the cycle's peak gives (150 per 10 min)
    windows = Counter(int(t.arrival_s // 600) for t in bursty)
    assert max(windows.values()) > 1.5 * ShortShape().peak_per_h / 6


@pytest.mark.parametrize("days", [0, -1])
def test_a_non_positive_length_is_refused(days: float) -> None:
    with pytest.raises(ValueError, match="days must be > 0"):
        short_tasks(days, 1)


def test_an_unknown_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown shape 'long'"):
        tasks_of("long", 1, 1)


def test_the_generated_tasks_stay_the_ones_the_benchmarks_were_measured_on() -> None:
    """BENCHMARKS.md's short-shape figures are of these tasks: a faster generator (the bursts
    under way kept in a heap, not every burst scanned for every candidate) gives them exactly."""
    tasks = short_tasks(2, 1)
    digest = hashlib.sha256(repr([(t.arrival_s, t.service_s) for t in tasks]).encode())
    assert (len(tasks), digest.hexdigest()[:16]) == (24408, "0b75cccde90cb7e1")

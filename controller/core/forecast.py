"""Demand forecast: how many tasks (pending + running) one boot time from now, per task name.

Pure: the history is passed in, as (at, demand) samples per tick from the journal's own
record (`controller.store.demand`); nothing external. The method, simple enough to explain:

1. **horizon**: the fleet's own boot time, the median of first-seen to serving of the most
   recent launches still tracked (`boot_horizon`), else a default (30 min);
2. **level and trend**: an exponentially weighted mean of the last hour (half-life 10 min,
   the current reading included), and the least-squares slope of the last 30 min, damped to
   a quarter (`TREND_DAMPING`): `recent = level + 0.25 x slope x horizon`;
3. **seasonality**: for each lag (a day, a week) with history around both `now - lag` and
   `now + horizon - lag`, the change seen then from that moment to one horizon later is
   applied to today's level: as a ratio (clipped to [1/2, 2]) when the reference is at least
   `MIN_RATIO_BASE` tasks, else as a difference. The week counts 0.6, the day 0.4 when both
   exist (the week knows weekends);
4. **blend**: 0.5 seasonal + 0.5 recent when there is seasonal history, the recent estimate
   alone when there is only recent history, the current reading when there is none. Never
   below 0.

`forecast_error` scores forecasts against the demand recorded one horizon later (MAE, MAPE).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Any

DAY = 86_400.0
WEEK = 7 * DAY
DEFAULT_BOOT_S = 1800.0  # the horizon before the fleet has booted enough instances to measure
BOOT_SAMPLES = 20  # the most recent launches the boot time is the median of
MIN_BOOT_SAMPLES = 3
RECENT_S = 3600.0  # the window of level and trend
HALF_LIFE_S = 600.0  # of the level's exponential weights
TREND_S = 1800.0  # the slope is fitted over this
TREND_DAMPING = 0.25
SEASON_HALF_WIDTH_S = 900.0  # the reference a lag back: the mean of +-15 min around it
LAG_WEIGHTS: dict[float, float] = {DAY: 0.4, WEEK: 0.6}
SEASONAL_WEIGHT = 0.5
MIN_POINTS = 5  # samples a window needs to count
MIN_RATIO_BASE = 2.0
RATIO_CLIP = (0.5, 2.0)

Series = Sequence[tuple[float, float]]


@dataclass(frozen=True)
class Forecast:
    """Demand of one task name predicted at `now + horizon_s`, and how it was made."""

    task: str
    pending: float
    horizon_s: float
    basis: str  # "seasonal", "trend" or "current"
    count: int = 0
    """Instances that hold `pending` (see `sized`)."""

    def sized(self, tasks_per_instance: float) -> Forecast:
        """The same forecast with `count`: instances at `tasks_per_instance` tasks each, for
        the forecast rounded to whole tasks (the tail of an exponential mean, 0.2 tasks an hour
        after the last one, asks for no instance)."""
        per = tasks_per_instance if tasks_per_instance > 0 else 1.0
        return replace(self, count=math.ceil(math.floor(self.pending + 0.5) / per))


def boot_horizon(samples: Iterable[float], default: float = DEFAULT_BOOT_S) -> float:
    """The median of the positive boot times (first seen to serving), else `default`."""
    good = [s for s in samples if s > 0]
    if len(good) < MIN_BOOT_SAMPLES:
        return default
    return float(statistics.median(good))


def boot_samples(tracks: Iterable[Any]) -> list[float]:
    """First seen to first serving, of the `BOOT_SAMPLES` most recently seen instances that
    served (tracks with `first_seen` and `served_at`; one first seen serving has none). Not to
    its present stage: one started after hours parked, or back from a reboot, did not take
    those hours to boot."""
    served = sorted((t for t in tracks if t.served_at is not None), key=lambda t: -t.first_seen)
    return [t.served_at - t.first_seen for t in served[:BOOT_SAMPLES]]


def spans(now: float, horizon_s: float) -> list[tuple[float, float]]:
    """The [from, to] windows of history a forecast at `now` reads (recent, then each lag)."""
    out = [(now - RECENT_S, now)]
    for lag in LAG_WEIGHTS:
        out.append((now - lag - RECENT_S, now + horizon_s - lag + SEASON_HALF_WIDTH_S))
    return out


def forecast(task: str, current: float, history: Series, now: float,
             horizon_s: float) -> Forecast:  # fmt: skip
    """Demand of `task` at `now + horizon_s` from `history` (samples before `now`, any order)
    and the `current` reading (see the module docstring)."""
    points = _Sorted(history)
    recent = points.window(now - RECENT_S, now, closed=False)
    if not recent:
        return Forecast(task, float(current), horizon_s, "current")
    recent.append((now, float(current)))
    level = _ewma(recent, now)
    estimate = max(0.0, level + TREND_DAMPING * _slope(recent, now - TREND_S) * horizon_s)
    seasonal = _seasonal(points, now, horizon_s, level)
    if seasonal is None:
        return Forecast(task, estimate, horizon_s, "trend")
    blended = SEASONAL_WEIGHT * seasonal + (1.0 - SEASONAL_WEIGHT) * estimate
    return Forecast(task, max(0.0, blended), horizon_s, "seasonal")


class _Sorted:
    """A series by time, for its windows by bisection (a tick reads several of one series)."""

    def __init__(self, history: Series) -> None:
        self.points = sorted(history)  # linear on the sorted series the journal returns
        self.times = list(map(itemgetter(0), self.points))

    def window(self, lo: float, hi: float, closed: bool = True) -> list[tuple[float, float]]:
        """The points with lo <= t <= hi (t < hi when not `closed`)."""
        end = bisect.bisect_right if closed else bisect.bisect_left
        return self.points[bisect.bisect_left(self.times, lo) : end(self.times, hi)]


def _seasonal(points: _Sorted, now: float, horizon_s: float, level: float) -> float | None:
    total, weights = 0.0, 0.0
    for lag, weight in LAG_WEIGHTS.items():
        then = points.window(now - lag - RECENT_S, now - lag)
        ahead_at = now + horizon_s - lag
        ahead = [v for _, v in points.window(ahead_at - SEASON_HALF_WIDTH_S,
                                             ahead_at + SEASON_HALF_WIDTH_S)]  # fmt: skip
        if len(then) < MIN_POINTS or len(ahead) < MIN_POINTS:
            continue
        base, later = _ewma(then, now - lag), sum(ahead) / len(ahead)
        if base >= MIN_RATIO_BASE:
            low, high = RATIO_CLIP
            value = level * min(high, max(low, later / base))
        else:
            value = level + later - base
        total += weight * max(0.0, value)
        weights += weight
    return total / weights if weights else None


def _ewma(points: Series, at: float) -> float:
    """Exponentially weighted mean of `points`, weights halving every HALF_LIFE_S before `at`."""
    num = den = 0.0
    for t, v in points:
        w = 0.5 ** (max(0.0, at - t) / HALF_LIFE_S)
        num += w * v
        den += w
    return num / den if den else 0.0


def _slope(points: Series, since: float) -> float:
    """Least-squares slope (tasks per second) of the points at or after `since`; 0 if < 2."""
    pts = [(t, v) for t, v in points if t >= since]
    if len(pts) < MIN_POINTS:
        return 0.0
    mt = sum(t for t, _ in pts) / len(pts)
    mv = sum(v for _, v in pts) / len(pts)
    var = sum((t - mt) ** 2 for t, _ in pts)
    return sum((t - mt) * (v - mv) for t, v in pts) / var if var > 0 else 0.0


def forecast_error(rows: Sequence[tuple[float, float, float | None, float | None]],
                   tolerance_s: float = 90.0) -> dict[str, Any]:  # fmt: skip
    """MAE and MAPE of forecasts against the demand recorded one horizon later.

    `rows`: (at, demand, forecast, horizon_s) of one task, by `at`. A forecast is scored when
    a reading exists within `tolerance_s` of `at + horizon_s`; MAPE leaves out readings of 0
    (`mape_n` says how many count). Also the same for the naive forecast "demand stays as it
    is now", to compare against."""
    ats = [r[0] for r in rows]
    errors: list[tuple[float, float, float]] = []  # (|forecast - actual|, |now - actual|, actual)
    j = 0
    for at, now_demand, predicted, horizon in rows:
        if predicted is None or horizon is None:
            continue
        target = at + horizon
        while j < len(ats) and ats[j] < target - tolerance_s:
            j += 1
        k = min(range(j, min(j + 3, len(ats))), key=lambda i: abs(ats[i] - target), default=None)
        if k is None or abs(ats[k] - target) > tolerance_s:
            continue
        actual = rows[k][1]
        errors.append((abs(predicted - actual), abs(now_demand - actual), actual))
    return _scores(errors)


def _scores(errors: list[tuple[float, float, float]]) -> dict[str, Any]:
    if not errors:
        return {"n": 0, "mae": None, "mape": None, "mape_n": 0, "naive_mae": None,
                "naive_mape": None}  # fmt: skip
    pos = [e for e in errors if e[2] > 0]
    return {
        "n": len(errors),
        "mae": round(sum(e[0] for e in errors) / len(errors), 3),
        "mape": round(sum(e[0] / e[2] for e in pos) / len(pos), 4) if pos else None,
        "mape_n": len(pos),
        "naive_mae": round(sum(e[1] for e in errors) / len(errors), 3),
        "naive_mape": round(sum(e[1] / e[2] for e in pos) / len(pos), 4) if pos else None,
    }


def by_task(series: Mapping[str, Series], current: Mapping[str, float], now: float,
            horizon_s: float, tasks_per_instance: float) -> dict[str, Forecast]:  # fmt: skip
    """A forecast for every task read now (`current`: task -> pending + running), sized."""
    return {task: forecast(task, value, series.get(task, ()), now, horizon_s)
            .sized(tasks_per_instance) for task, value in current.items()}  # fmt: skip

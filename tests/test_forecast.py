"""The demand forecast: pure (seasonal series, trend, no history, the boot horizon, its
error), then through the real tick path (the journal's demand history into the facts), the
shipped rules' use of it, and `simulate` reporting its error."""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any

import pytest

from controller.core import forecast as fc
from controller.core.decide import resolve
from controller.core.facts import build_facts
from controller.core.model import Demand, Instance, Observation, Proposal
from controller.core.track import History, Track, advance
from controller.service.assemble import assemble
from controller.service.cli import main
from controller.service.config import load_config
from controller.sim.trace import TraceTask
from controller.store.journal import Journal
from controller.tools.replay.run import trace_config, write_tasks

ROOT = Path(__file__).resolve().parents[1]
NO_FAULTS = ROOT / "controller" / "examples" / "simulate-no-faults.yaml"
# the opt-in forecast variant of scaling.yaml beside the other shipped rules files
FORECAST_RULES = [str(ROOT / "controller" / "examples" / "forecast" / "scaling.yaml")] + [
    str(ROOT / "rules" / name) for name in ("crashes.yaml", "lifecycle.yaml", "hosts.yaml")
]
DAY, STEP = fc.DAY, 60.0

pytestmark = pytest.mark.usefixtures("restore_logging")  # `main` re-points the root logger


def daily(t: float) -> float:
    """A demand cycle: 2 tasks at 02:00, 20 at 14:00."""
    return 11.0 - 9.0 * math.cos(2 * math.pi * ((t % DAY) / 3600.0 - 2.0) / 24.0)


def history(until: float, value: object = daily, since: float = 0.0) -> list[tuple[float, float]]:
    f = value if callable(value) else (lambda _t: float(value))  # type: ignore[arg-type]
    return [(t, f(t)) for t in _ticks(since, until)]


def _ticks(since: float, until: float) -> list[float]:
    n = int((until - since) // STEP)
    return [since + i * STEP for i in range(n) if since + i * STEP < until]


# --- pure


def test_no_history_forecasts_the_current_demand() -> None:
    f = fc.forecast("all", 7.0, [], now=1000.0, horizon_s=1800.0)
    assert (f.pending, f.horizon_s, f.basis) == (7.0, 1800.0, "current")
    # history that is not recent counts as none too
    old = fc.forecast("all", 3.0, history(50_000.0, 9.0), now=90_000.0, horizon_s=1800.0)
    assert (old.pending, old.basis) == (3.0, "current")


def test_a_seasonal_series_predicts_the_next_days_peak() -> None:
    # two days of the cycle; at 13:30 on day 3 the forecast for 14:00 is the peak (20), and
    # the flat "stays as it is now" (about 19.8 at 13:30, rising) is not what is being tested:
    # take a point on the steep part instead, 09:00 -> 09:30
    horizon = 1800.0
    for hour in (13.5, 9.0, 4.0):
        now = 2 * DAY + hour * 3600.0
        f = fc.forecast("all", daily(now), history(now), now, horizon)
        actual = daily(now + horizon)
        assert f.basis == "seasonal"
        assert abs(f.pending - actual) <= 0.1 * actual, (hour, f.pending, actual)
    # on the rise the seasonal forecast is closer to what comes than the current reading
    now = 2 * DAY + 8 * 3600.0
    f = fc.forecast("all", daily(now), history(now), now, horizon)
    assert abs(f.pending - daily(now + horizon)) < 0.75 * abs(daily(now) - daily(now + horizon))


def test_the_week_back_outweighs_the_day_back() -> None:
    # a week of flat demand at 10, then a day at 2 (yesterday was a quiet Sunday): a week back
    # says 10 and a day back says 2, at a level of 10 today the blend leans to the week
    week = fc.WEEK

    def shape(t: float) -> float:
        return 2.0 if week - DAY <= t < week else 10.0

    now = week + 12 * 3600.0
    f = fc.forecast("all", 10.0, history(now, shape), now, 1800.0)
    assert f.basis == "seasonal" and 9.0 <= f.pending <= 10.5, f


def test_a_rising_trend_is_extrapolated_damped(monkeypatch: pytest.MonkeyPatch) -> None:
    # no seasonal history, demand rising 1 task per 5 minutes over the last hour
    now = 10 * 3600.0
    rising = history(now, lambda t: 10.0 + (t - (now - 3600.0)) / 300.0, since=now - 3600.0)
    falling = [(t, 40.0 - v) for t, v in rising]
    current = 10.0 + 3600.0 / 300.0  # 22 now
    up = fc.forecast("all", current, rising, now, 1800.0)
    down = fc.forecast("all", 40.0 - current, falling, now, 1800.0)
    assert up.basis == down.basis == "trend"
    monkeypatch.setattr(fc, "TREND_DAMPING", 0.0)  # the level alone (an exponential mean)
    level_up = fc.forecast("all", current, rising, now, 1800.0).pending
    level_down = fc.forecast("all", 40.0 - current, falling, now, 1800.0).pending
    # the slope says +-6 in 30 min; damped to a quarter: +-1.5 on the level
    assert up.pending - level_up == pytest.approx(1.5, abs=0.05), (up, level_up)
    assert level_down - down.pending == pytest.approx(1.5, abs=0.05), (down, level_down)
    assert level_up < current  # the level lags a rise: the trend is what carries it forward


def test_the_forecast_is_never_negative_and_sized_in_instances() -> None:
    now = 10 * 3600.0
    falling = history(now, lambda t: max(0.0, (now - t) / 60.0), since=now - 3600.0)
    f = fc.forecast("all", 0.0, falling, now, 3600.0)
    assert f.pending >= 0.0
    assert fc.Forecast("all", 5.0, 1800.0, "trend").sized(2).count == 3
    assert fc.Forecast("all", 4.0, 1800.0, "trend").sized(2).count == 2
    assert fc.Forecast("all", 0.0, 1800.0, "trend").sized(2).count == 0
    # rounded to whole tasks first: a fading tail asks for nothing, half a task for one
    assert fc.Forecast("all", 0.4, 1800.0, "trend").sized(2).count == 0
    assert fc.Forecast("all", 0.5, 1800.0, "trend").sized(2).count == 1


def test_the_backlog_is_the_slots_that_finish_it_within_a_boot() -> None:
    obs = Observation(0.0, (), (Demand("all", 300, 20), Demand("PoRep", 6, 1)), ())
    horizon = {t: fc.Forecast(t, 0.0, 1800.0, "current") for t in ("all", "PoRep")}

    def demand(hist: History) -> dict[str, dict[str, Any]]:
        return {f["task"]: f for f in build_facts(obs, hist, 0.0) if f["kind"] == "demand"}

    # untimed: a slot per pending task, and no task_s to match on
    untimed = demand(History(forecasts=horizon))
    assert untimed["all"]["backlog_slots"] == 300.0 and "task_s" not in untimed["all"]
    # 300 tasks of 90 s are 7.5 hours of work: 15 slots finish them within the 30 min boot
    timed = demand(History(forecasts=horizon, task_s={"all": 90.0, "PoRep": 3600.0}))
    assert timed["all"]["task_s"] == 90.0 and timed["all"]["backlog_slots"] == 15.0
    # tasks longer than a boot: each needs its own slot however long the wait
    assert timed["PoRep"]["backlog_slots"] == 6.0
    # no horizon (no forecast), no shortening
    assert demand(History(task_s={"all": 90.0}))["all"]["backlog_slots"] == 300.0


def _track(id: str, first_seen: float, stage: str, stage_since: float,
           served_at: float | None = None) -> Track:  # fmt: skip
    served = stage_since if stage == "running" and served_at is None else served_at
    return Track(id, "m", first_seen, stage, stage_since, "running", first_seen, "up", first_seen,
                 served_at=served)  # fmt: skip


def test_the_horizon_is_the_median_boot_of_recent_launches_else_the_default() -> None:
    tracks = [_track("a", 0.0, "running", 1500.0), _track("b", 100.0, "running", 2100.0),
              _track("c", 200.0, "running", 2000.0), _track("d", 300.0, "bench", 900.0),
              _track("e", 400.0, "running", 400.0)]  # fmt: skip  # e: seen serving, no boot
    samples = fc.boot_samples(tracks)
    assert sorted(samples) == [0.0, 1500.0, 1800.0, 2000.0]
    assert fc.boot_horizon(samples, 999.0) == 1800.0
    assert fc.boot_horizon([1500.0, 0.0], 999.0) == 999.0  # too few boots measured


def test_a_start_after_hours_parked_is_no_boot_of_hours() -> None:
    # f booted in 1,700 s, was parked, and serves again since a start at 30,000: its boot
    # stays 1,700 s (its present stage began at 30,000)
    parked = _track("f", 500.0, "running", 30_000.0, served_at=2200.0)
    assert fc.boot_samples([parked]) == [1700.0]
    # and so the track remembers it: first serving, not the latest return to running
    mk = lambda stage, now: Instance("f", "fg-f", "m", "h", "running", stage, "up", "up")  # noqa: E731
    tracks: dict[str, Track] = {}
    for stage, now in [("loading", 500.0), ("running", 2200.0), ("loading", 29_000.0),
                       ("running", 30_000.0)]:  # fmt: skip
        obs = Observation(now, (mk(stage, now),), (), ())
        tracks, _ = advance(History(instances=tracks), obs, now)
    assert tracks["f"].served_at == 2200.0 and tracks["f"].stage_since == 30_000.0
    assert fc.boot_samples(tracks.values()) == [1700.0]


def test_the_forecast_error_scores_against_the_demand_one_horizon_later() -> None:
    # forecasts of 4 made at 0 and 60 for 120 s later; the demand there is 2 then 5
    rows = [(0.0, 1.0, 4.0, 120.0), (60.0, 1.0, 4.0, 120.0), (120.0, 2.0, None, None),
            (180.0, 5.0, 3.0, 120.0)]  # fmt: skip
    err = fc.forecast_error(rows)
    assert err["n"] == 2  # the last has no reading 120 s after it
    assert err["mae"] == pytest.approx((2.0 + 1.0) / 2)
    assert err["mape"] == pytest.approx((2.0 / 2 + 1.0 / 5) / 2)
    assert err["naive_mae"] == pytest.approx((1.0 + 4.0) / 2)
    assert fc.forecast_error([])["n"] == 0


# --- the forecast rules: a kept instance's destroy loses


def test_keeping_an_idle_instance_for_the_forecast_supersedes_its_scale_down() -> None:
    keep = Proposal("undrain", {"instance": "i1"}, "rule:keep-idle-for-forecast", "k", 0.9, 7)
    down = Proposal("destroy", {"instance": "i1"}, "rule:scale-down-idle-instance", "d", 0.9, 6)
    winners, lost, doubts = resolve([down, keep])
    assert winners == [keep] and not doubts
    assert [d.verdict for d in lost] == ["superseded"]


# --- through the real tick path


def test_the_forecast_reaches_the_facts_from_the_journals_demand_history(tmp_path: Path) -> None:
    config = load_config(str(NO_FAULTS))
    state = tmp_path / "state"
    state.mkdir()
    trace = state / "trace.csv"
    write_tasks(trace, [TraceTask(0.0, 60.0)])  # one task, at the start
    config = trace_config(config, trace).model_copy(update={"rules": FORECAST_RULES})
    app = assemble(config, state=state, clock=time.time, sleep=time.sleep, seed=3)
    try:
        controller = app.controller
        first = controller.tick()
        now_demand = first.by_id["demand:all"]
        assert now_demand["pending"] + now_demand["running"] == 1  # the trace's one task
        # no history: the forecast is the demand now
        assert now_demand["forecast_pending"] == 1.0 and now_demand["forecast_instances"] == 1
        # yesterday, half an hour after this time of day, 20 tasks were in the system; an
        # hour of quiet before it (today: the one task)
        now = first.now
        rows = [(t, 0) for t in _ticks(now - DAY - 3600.0, now - DAY + 600.0)]
        rows += [(t, 20) for t in _ticks(now - DAY + 900.0, now - DAY + 2700.0)]
        for at, value in rows:
            controller.journal.demand.record(at, [Demand("all", value, 0)], {})
        for _ in range(5):  # recent history of today's quiet
            planned = controller.tick()
        demand = planned.by_id["demand:all"]
        assert demand["forecast_horizon_s"] == fc.DEFAULT_BOOT_S  # nothing booted yet
        # seasonal: 1 now + (20 - 0) a day back, half the blend; the other half the level (1)
        assert 9.0 <= demand["forecast_pending"] <= 13.0, demand
        assert demand["forecast_instances"] == math.ceil(round(demand["forecast_pending"]) / 2)
        # the forecast rules size the fleet for it, not for the one task waiting now: the
        # burst rule (nothing serves yet) scales to the forecast's instances
        scaled = [d for d in planned.plan.decisions if d.proposal.action == "scale_to"]
        assert [d.proposal.params["count"] for d in scaled] == [demand["forecast_instances"]]
        # rented in the first tick that saw the forecast: the fleet holds it, for one task
        assert planned.by_id["fleet"]["active"] == demand["forecast_instances"] > 1
        # and the tick recorded its own reading and forecast for the next ones
        recorded = controller.journal.demand.scored("all")
        assert recorded[-1][0] == planned.now and recorded[-1][2] == demand["forecast_pending"]
    finally:
        app.close()


def test_the_demand_history_reads_windows_and_fills_quiet_tasks_with_zero(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    try:
        j.demand.record(100.0, [Demand("PoRep", 2, 1), Demand("all", 2, 1)], {})
        j.demand.record(160.0, [Demand("all", 0, 0)], {})
        j.demand.record(220.0, [Demand("WdPost", 1, 0), Demand("all", 1, 0)], {})
        got = j.demand.series([(90.0, 170.0), (200.0, 230.0)])
        assert got["all"] == [(100.0, 3.0), (160.0, 0.0), (220.0, 1.0)]
        assert got["PoRep"] == [(100.0, 3.0), (160.0, 0.0), (220.0, 0.0)]
        assert j.demand.series([(150.0, 170.0)]) == {"all": [(160.0, 0.0)]}
    finally:
        j.close()


def test_the_kept_series_answers_as_reading_it_all_every_tick(tmp_path: Path) -> None:
    """The series a window keeps tick by tick (slices, not a pass over the rows) is the
    full read's, every tick: tasks that come, go quiet for longer than the spans and come
    back, spans that overlap and that leave the window's start behind; then rows of a time
    already kept, after which it builds the series from the rows, still the same."""
    from controller.store.demand import Window

    j = Journal(tmp_path / "j.db")
    try:
        window = Window()
        rng = random.Random(11)
        for k in range(400):
            tasks = [Demand("all", rng.randint(0, 9), rng.randint(0, 3))]
            if k % 3:
                tasks.append(Demand("PoRep", rng.randint(0, 4), 0))
            if k < 40 or k > 300:  # quiet for longer than every span in between
                tasks.append(Demand("WdPost", rng.randint(1, 2), 1))
            if k % 50 == 7:
                tasks.append(Demand("Rare", 1, 0))
            j.demand.record(60.0 * k, tasks, {})
            now = 60.0 * k
            spans = [(now - 1800.0, now), (now - 2400.0, now - 1200.0),
                     (now - 9000.0, now - 8000.0)]  # fmt: skip
            assert j.demand.series(spans, window) == j.demand.series(spans), k
            assert window.exact, k
        j.demand.record(60.0 * 399, [Demand("Late", 1, 0)], {})  # a time already kept
        spans = [(60.0 * 380, 60.0 * 400)]
        assert j.demand.series(spans, window) == j.demand.series(spans)
        assert not window.exact and "Late" in j.demand.series(spans, window)
    finally:
        j.close()


def test_a_kept_window_of_the_demand_history_answers_as_reading_it_all(tmp_path: Path) -> None:
    """The window a controller keeps gives the forecast the rows a full read would, tick
    after tick, with overlapping spans, rows written out of order and rows of equal time, and
    reads only the rows written since its last read."""
    from controller.store.demand import Window

    j = Journal(tmp_path / "j.db")
    try:
        window = Window()
        rng = random.Random(5)
        for k in range(300):
            at = 60.0 * k if k != 150 else 60.0 * 140  # one tick written late
            tasks = [Demand("all", rng.randint(0, 9), rng.randint(0, 3))]
            tasks += [Demand("PoRep", rng.randint(0, 4), 0)] if k % 3 else []
            j.demand.record(at, tasks, {})
            if k % 7 and k != 299:
                continue
            now = 60.0 * k
            spans = [(now - 1800.0, now), (now - 3000.0, now - 1500.0), (now - 9000.0, now - 8000)]
            assert j.demand.series(spans, window) == j.demand.series(spans), k
        assert window.last_id == j.store.query("SELECT max(id) AS m FROM demand_history")[0]["m"]
        assert window.ats and window.ats[0] >= 60.0 * 299 - 9000.0  # the older rows dropped
    finally:
        j.close()


def test_simulate_reports_the_forecasts_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    argv = ["simulate", "--config", str(NO_FAULTS), "--shape", "short", "--days", "0.25",
            "--report", str(out), "--seed", "2"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    doc = json.loads((out / "report.json").read_text())
    err = doc["fleetgate"]["forecast"]
    # 360 ticks, each forecast scored 30 min (the default horizon) later, or at the fleet's
    # measured boot time once it has one
    assert 100 < err["n"] < 360, err
    assert err["mae"] is not None and err["mae"] >= 0 and err["naive_mae"] is not None
    assert f"MAE {err['mae']:.2f} tasks" in printed
    assert doc["shape"] == "short" and doc["tasks"] > 500


def test_a_tick_reuses_the_forecast_while_what_it_is_made_from_holds(tmp_path: Path) -> None:
    from controller.service.gather import FORECAST_EVERY_S, ForecastCache, gather

    config = load_config(str(NO_FAULTS))
    state = tmp_path / "state"
    state.mkdir()
    trace = state / "trace.csv"
    write_tasks(trace, [TraceTask(0.0, 60.0)])
    app = assemble(trace_config(config, trace), state=state, clock=time.time, sleep=time.sleep,
                   seed=3)  # fmt: skip
    try:
        c = app.controller
        c.tick()
        reads: list[object] = []
        series = c.journal.demand.series

        def counted(spans: object, window: object = None) -> object:
            reads.append(spans)
            return series(spans, window)  # type: ignore[arg-type]

        c.journal.demand.series = counted  # type: ignore[method-assign]
        cache, now = ForecastCache(), 10 * FORECAST_EVERY_S
        first = gather(c.journal, c.provider, c.demand, now, pending_s=600, cache=cache)
        again = gather(c.journal, c.provider, c.demand, now + 60, pending_s=600, cache=cache)
        assert len(reads) == 1 and again.history.forecasts == first.history.forecasts
        later = gather(c.journal, c.provider, c.demand, now + FORECAST_EVERY_S, pending_s=600,
                       cache=cache)  # fmt: skip
        assert len(reads) == 2 and later.history.forecasts  # a new slot: made again
        gather(c.journal, c.provider, c.demand, now + FORECAST_EVERY_S, pending_s=600,
               boot_s=600.0, cache=cache)  # fmt: skip
        assert len(reads) == 3  # another horizon: made again
    finally:
        app.close()

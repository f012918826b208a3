"""GET /metrics on the operator API over a real journal, scraped over HTTP and checked with
promtool; the shipped alert rules pass `promtool check rules` and their unit tests."""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from controller.core.model import Demand
from controller.core.track import Track
from controller.fleet.base import SensorError, StaleReading
from controller.service.api import Server, create_app
from controller.service.app import status as app_status
from controller.service.assemble import assemble
from controller.service.config import Config
from controller.service.status import status_lines
from controller.store import retention
from controller.store.journal import Journal
from controller.store.lease import Lease
from controller.store.totals import TICK_BUCKETS_S
from tests.support import BACKENDS, ROOT, journal_on, record_action

PROMTOOL = "/usr/bin/promtool"
DAY = 86_400.0
RULES = ROOT / "deploy" / "prometheus"

# (action, status, proposer as written, its class as exposed)
ACTIONS = [
    ("reboot", "done", "rule:restart-frozen", "rule"),
    ("reboot", "done", "rule:restart-frozen", "rule"),
    ("reboot", "done", "rule:other-rule", "rule"),  # same class: counted together
    ("reboot", "failed", "rule:restart-frozen", "rule"),
    ("replace", "done", "llm:gpt-x", "llm"),
    ("replace", "refused", "human:ana", "human"),
    ("scale_to", "done", "deadline:esc-4", "deadline"),
    ("destroy", "done", "controller:replace", "controller"),  # the old one of a replace
    ("destroy", "intent", "someone typed this: drop everything", "other"),
]
TICKS = [(100.0, 101.5), (160.0, 160.2), (220.0, None), (280.0, 283.0), (340.0, None)]
SUMMARY = {
    "instances": 7, "pending": 42, "spend_per_h": 12.5, "running_tasks": 5,
    # as the tick writes them (controller/service/tick.py `_queue`, the sensors' states)
    "demand": [{"task": "all", "pending": 42, "running": 5, "oldest_pending_s": 610.5,
                "forecast_pending": 50.25, "forecast_horizon_s": 1800.0},
               {"task": "PoRep", "pending": 40, "running": 5, "oldest_pending_s": 610.5},
               {"task": "Win Post!", "pending": 2, "running": 0, "oldest_pending_s": 30.0},
               {"task": "Odd Task?", "pending": 1, "running": 1, "oldest_pending_s": 90.0}],
    "sensors": {"provider": "ok", "demand": "stale"},
}  # fmt: skip


def _track(i: str, stage: str, status: str) -> Track:
    return Track(i, "m" + i, 0, stage, 0, status, 0, "up", 0)


def _fill(j: Journal) -> None:
    for started, finished in TICKS:
        tick = j.meta.start_tick(started, "digest")
        if finished is not None:
            j.meta.finish_tick(tick, finished, {**SUMMARY, "tick": tick})
    for n, (action, status, proposer, _cls) in enumerate(ACTIONS):
        record_action(j, 300.0 + n, action=action, status=status, proposer=proposer)
    raised = [("unmatched", "pending"), ("unmatched", "pending"), ("unmatched", "approved"),
              ("budget", "pending")]  # fmt: skip
    for n, (kind, status) in enumerate(raised):
        esc = j.escalations.add_escalation(fingerprint=f"fp{n}", kind=kind, subject="s",
                                           summary="x", now=1000.0 + n, deadline=5000.0,
                                           situation={}, default_action={})  # fmt: skip
        if status != "pending":
            j.escalations.set_escalation_status(esc, status)
    for status, tokens, latency_ms in [("ok", 1200, 800.0), ("ok", 300, 2500.0),
                                       ("error", 0, None), ("invalid", 50, 40000.0)]:  # fmt: skip
        j.llm.add_llm_call(escalation_id=None, now=500.0, model="m", status=status,
                           tokens=tokens, latency_ms=latency_ms)  # fmt: skip
    tracks = {"1": _track("1", "running", "running"), "2": _track("2", "running", "running"),
              "3": _track("3", "booting", "loading"),
              "4": _track("4", "running", "an odd status from the provider!")}  # fmt: skip
    j.fleet.save_tracks(tracks, [])


@pytest.fixture
def scraped(tmp_path: Path) -> Iterator[tuple[requests.Response, Journal]]:
    journal = Journal(tmp_path / "j.db")
    lease = Lease(journal, "host-a:1", ttl_s=30, margin_s=1)
    assert lease.renew()
    _fill(journal)
    app = create_app(journal, SecretStr("t0ken"), clock=lambda: 500.0)
    server = Server(app, "127.0.0.1", 0)
    server.start()
    try:
        yield requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10), journal
    finally:
        server.stop()
        journal.close()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_scrape_passes_promtool_and_matches_the_journal(
    scraped: tuple[requests.Response, Journal],
) -> None:
    resp, _ = scraped
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain; version=")
    check = subprocess.run([PROMTOOL, "check", "metrics"], input=resp.text, text=True,
                           capture_output=True, timeout=60)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    got = _samples(resp.text)

    # actions with an outcome: one series per (kind, status, proposer class), equal to the
    # rows written; the open intent is a gauge's
    want = Counter((a, s, c) for a, s, _p, c in ACTIONS if s != "intent")
    series = {k: v for k, v in got.items() if k[0] == "fleetgate_actions_total"}
    assert series == {("fleetgate_actions_total",
                       (("action", a), ("proposer", c), ("status", s))): float(n)
                      for (a, s, c), n in want.items()}  # fmt: skip
    opened = {k: v for k, v in got.items() if k[0] == "fleetgate_actions_open"}
    assert opened == {("fleetgate_actions_open", (("action", "destroy"), ("status", "intent"))): 1}
    assert "drop everything" not in resp.text and "host-a" not in resp.text

    # ticks: three finished (1.5 s, 0.2 s, 3 s), one failed, the newest still running
    durations = [f - s for s, f in TICKS if f is not None]
    assert got[("fleetgate_tick_duration_seconds_count", ())] == len(durations)
    assert got[("fleetgate_tick_duration_seconds_sum", ())] == pytest.approx(sum(durations))
    # a small fleet's ticks take milliseconds: buckets from 5 ms, as Prometheus's defaults
    assert got[("fleetgate_tick_duration_seconds_bucket", (("le", "0.005"),))] == 0
    assert got[("fleetgate_tick_duration_seconds_bucket", (("le", "0.25"),))] == 1
    assert got[("fleetgate_tick_duration_seconds_bucket", (("le", "2.5"),))] == 2
    assert got[("fleetgate_tick_duration_seconds_bucket", (("le", "5.0"),))] == 3
    assert got[("fleetgate_tick_failures_total", ())] == 1
    assert got[("fleetgate_last_tick_finished_timestamp_seconds", ())] == 283.0
    assert got[("fleetgate_fleet_instances", ())] == SUMMARY["instances"]
    assert got[("fleetgate_pending_tasks", ())] == SUMMARY["pending"]
    assert got[("fleetgate_running_tasks", ())] == SUMMARY["running_tasks"]
    assert got[("fleetgate_spend_per_hour", ())] == SUMMARY["spend_per_h"]

    # the queue per task (a name that is not a label value is `other`), its forecast
    assert got[("fleetgate_task_pending", (("task", "all"),))] == 42
    assert got[("fleetgate_task_pending", (("task", "PoRep"),))] == 40
    assert got[("fleetgate_task_pending", (("task", "other"),))] == 2 + 1  # one series
    assert got[("fleetgate_task_oldest_pending_seconds", (("task", "other"),))] == 90.0
    assert got[("fleetgate_task_running", (("task", "PoRep"),))] == 5
    assert got[("fleetgate_task_oldest_pending_seconds", (("task", "all"),))] == 610.5
    assert got[("fleetgate_task_forecast", (("task", "all"),))] == 50.25
    assert ("fleetgate_task_forecast", (("task", "PoRep"),)) not in got
    # one series per sensor and state, 1 for the state it is in
    states = {k[1]: v for k, v in got.items() if k[0] == "fleetgate_sensor_state"}
    assert states == {(("sensor", s), ("state", st)): float(st == now)
                      for s, now in SUMMARY["sensors"].items()  # type: ignore[union-attr]
                      for st in ("ok", "stale", "failed")}  # fmt: skip

    # escalations by kind and status; the oldest pending one
    assert got[("fleetgate_escalations", (("kind", "unmatched"), ("status", "pending")))] == 2
    assert got[("fleetgate_escalations", (("kind", "unmatched"), ("status", "approved")))] == 1
    assert got[("fleetgate_escalations", (("kind", "budget"), ("status", "pending")))] == 1
    assert got[("fleetgate_escalation_oldest_pending_timestamp_seconds", ())] == 1000.0

    # LLM calls, tokens, latency
    assert got[("fleetgate_llm_calls_total", (("status", "ok"),))] == 2
    assert got[("fleetgate_llm_calls_total", (("status", "error"),))] == 1
    assert got[("fleetgate_llm_calls_total", (("status", "invalid"),))] == 1
    assert got[("fleetgate_llm_tokens_total", ())] == 1550
    assert got[("fleetgate_llm_latency_seconds_count", ())] == 3
    assert got[("fleetgate_llm_latency_seconds_sum", ())] == pytest.approx(43.3)
    assert got[("fleetgate_llm_latency_seconds_bucket", (("le", "1.0"),))] == 1
    assert got[("fleetgate_llm_latency_seconds_bucket", (("le", "30.0"),))] == 2

    # instances by stage and status; a status that is not a name is `other`
    instances = {k[1]: v for k, v in got.items() if k[0] == "fleetgate_instances"}
    assert instances == {(("stage", "running"), ("status", "running")): 2,
                         (("stage", "booting"), ("status", "loading")): 1,
                         (("stage", "running"), ("status", "other")): 1}  # fmt: skip

    # leadership
    assert got[("fleetgate_lease_live", (("lease", "leader"),))] == 1
    assert 0 < got[("fleetgate_lease_seconds_left", (("lease", "leader"),))] <= 30


def test_metrics_follow_the_journal_between_scrapes(
    scraped: tuple[requests.Response, Journal],
) -> None:
    resp, j = scraped
    base = resp.url
    before = _samples(resp.text)[("fleetgate_actions_total", (("action", "reboot"),
                                  ("proposer", "rule"), ("status", "done")))]  # fmt: skip
    record_action(j, 400.0, action="reboot", status="done", proposer="rule:restart-frozen")
    # an intent that finishes leaves the open gauge and is counted; no counter goes down
    before_all = _counted(_samples(resp.text))
    intent = record_action(j, 410.0, action="drain", status="intent", proposer="rule:d")
    during = _samples(requests.get(base, timeout=10).text)
    assert during[("fleetgate_actions_open", (("action", "drain"), ("status", "intent")))] == 1
    j.actions.finish(intent, 411.0, "ok", {})
    done = _samples(requests.get(base, timeout=10).text)
    assert ("fleetgate_actions_open", (("action", "drain"), ("status", "intent"))) not in done
    assert done[("fleetgate_actions_total", (("action", "drain"), ("proposer", "rule"),
                 ("status", "ok")))] == 1  # fmt: skip
    for key, value in {**before_all, **_counted(during)}.items():
        assert done[key] >= value, key

    with j.tx() as db:  # the leader stopped renewing 100 s ago
        db.execute("UPDATE leases SET expires_at = expires_at - 100")
    after = _samples(requests.get(base, timeout=10).text)
    assert after[("fleetgate_actions_total", (("action", "reboot"), ("proposer", "rule"),
                  ("status", "done")))] == before + 1  # fmt: skip
    assert after[("fleetgate_lease_live", (("lease", "leader"),))] == 0
    assert after[("fleetgate_lease_seconds_left", (("lease", "leader"),))] == 0

    with j.tx() as db:  # a journal that cannot be read: the scrape fails, it reports no zeros
        db.execute("DROP TABLE llm_calls")
    broken = requests.get(base, timeout=10)
    assert broken.status_code == 503 and "fleetgate_" not in broken.text


def test_shipped_alert_rules_pass_promtool() -> None:
    check = subprocess.run([PROMTOOL, "check", "rules", "fleetgate-alerts.yaml"], cwd=RULES,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "5 rules found" in check.stdout
    unit = subprocess.run([PROMTOOL, "test", "rules", "fleetgate-alerts_test.yaml"], cwd=RULES,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert unit.returncode == 0, unit.stdout + unit.stderr
    tested = (RULES / "fleetgate-alerts_test.yaml").read_text(encoding="utf-8")
    for alert in ("FleetgateTickStalled", "FleetgateMetricsAbsent", "FleetgateTickFailures",
                  "FleetgateBudgetNearCap", "FleetgateEscalationPending"):  # fmt: skip
        assert f"alertname: {alert}" in tested


def _scrape(journal: Journal) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    server = Server(create_app(journal, SecretStr("t0ken"), clock=lambda: 500.0), "127.0.0.1", 0)
    server.start()
    try:
        resp = requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10)
    finally:
        server.stop()
    assert resp.status_code == 200, resp.text
    return _samples(resp.text)


def _counted(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[Any, float]:
    """The samples of counters and histograms: what must never go down."""
    ends = ("_total", "_bucket", "_count", "_sum")
    return {k: v for k, v in samples.items() if k[0].endswith(ends)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_counters_do_not_go_down_when_retention_deletes_old_rows(
    backend: str, tmp_path: Path
) -> None:
    with journal_on(backend, tmp_path) as j:
        _fill(j)  # all of it at times under 1,000 s
        new = j.meta.start_tick(3 * DAY, "digest")  # a day of ticks later, one more
        j.meta.finish_tick(new, 3 * DAY + 0.7, {**SUMMARY, "tick": new})
        record_action(j, 3 * DAY, action="reboot", status="done", proposer="rule:r")
        before = _counted(_scrape(j))
        assert before[("fleetgate_tick_failures_total", ())] == 2  # 220 and 340 never finished
        assert before[("fleetgate_tick_duration_seconds_count", ())] == 4

        deleted, done = retention.prune(j.store, 3 * DAY + 1, 1, batch=2)
        assert done and deleted["ticks"] == len(TICKS) and deleted["llm_calls"] == 4
        assert deleted["actions"] == len(ACTIONS) - 1  # not the open intent
        after = _counted(_scrape(j))
        assert after == before
        # a bucket's total is kept by its bound, so buckets added later do not shift it
        saved = {labels for metric, labels in j.totals.read() if metric == "tick.le"}
        assert {"0.25", "2.5", "5"} <= saved <= {f"{b:g}" for b in TICK_BUCKETS_S}

        # the totals are in the journal: another controller, or this one restarted, reads them
        reopened = Journal(j.store)
        assert _counted(_scrape(reopened)) == before
        # and they go on counting from there
        record_action(j, 3 * DAY + 5, action="reboot", status="done", proposer="rule:r")
        j.llm.add_llm_call(escalation_id=None, now=3 * DAY + 6, model="m", status="ok",
                           tokens=10, latency_ms=300.0)  # fmt: skip
        later = _counted(_scrape(j))
        key = ("fleetgate_actions_total", (("action", "reboot"), ("proposer", "rule"),
                                           ("status", "done")))  # fmt: skip
        assert later[key] == before[key] + 1
        assert later[("fleetgate_llm_calls_total", (("status", "ok"),))] == 3
        assert later[("fleetgate_llm_tokens_total", ())] == 1560
        assert later[("fleetgate_llm_latency_seconds_bucket", (("le", "0.5"),))] == 1
        assert later[("fleetgate_llm_latency_seconds_count", ())] == 4
        assert all(later[k] >= v for k, v in before.items())


def test_instance_statuses_from_the_provider_are_a_bounded_set_of_labels(tmp_path: Path) -> None:
    """vast's actual_status is the provider's text: 1,000 instances each with a status of its
    own (name-like, so not filtered as free text) are still a handful of series."""
    journal = Journal(tmp_path / "j.db")
    try:
        tracks = {str(i): _track(str(i), "running", f"status_{i}") for i in range(1000)}
        tracks["a"] = _track("a", "running", "running")
        tracks["b"] = _track("b", "registered", "rebooting")
        journal.fleet.save_tracks(tracks, [])
        got = _scrape(journal)
    finally:
        journal.close()
    instances = {k[1]: v for k, v in got.items() if k[0] == "fleetgate_instances"}
    assert instances == {(("stage", "running"), ("status", "other")): 1000,
                         (("stage", "running"), ("status", "running")): 1,
                         (("stage", "registered"), ("status", "rebooting")): 1}  # fmt: skip


class ManyTasks:
    """The simulator's demand with 59 more task names before its total (`all`, last)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def demand(self) -> list[Demand]:
        queues = list(self.inner.demand())
        extra = [Demand(f"Task{n}", 1, 0) for n in range(59)]
        return [*[q for q in queues if q.task != "all"], *extra,
                *[q for q in queues if q.task == "all"]]  # fmt: skip


def test_the_total_queue_is_kept_whatever_the_number_of_task_names(tmp_path: Path) -> None:
    app = assemble(Config(), state=tmp_path / "s", clock=time.time, sleep=time.sleep, seed=7)
    try:
        app.controller.demand = ManyTasks(app.controller.demand)
        app.controller.tick()
        [last] = app.journal.meta.ticks(1)
        got = _scrape(app.journal)
    finally:
        app.close()
    tasks = {dict(k[1])["task"] for k in got if k[0] == "fleetgate_task_pending"}
    assert "all" in tasks and len(tasks) == 50
    assert got[("fleetgate_task_pending", (("task", "all"),))] == last["summary"]["pending"]


def test_each_controller_says_whether_it_leads(tmp_path: Path) -> None:
    """Several controllers share a journal, each scraped: every one reported the same lease
    (some controller leads), and no metric said which one, so neither a graph nor an alert
    could follow the leader through a failover. Each says whether it is the holder."""
    from controller.service.dashboard import View

    journal = Journal(tmp_path / "j.db")
    servers = {name: Server(create_app(journal, SecretStr("t0ken"), clock=lambda: 500.0,
                                       view=View(holder=name)), "127.0.0.1", 0)
               for name in ("host-a:1", "host-b:2")}  # fmt: skip
    for server in servers.values():
        server.start()

    def held() -> dict[str, float | None]:
        key = ("fleetgate_lease_held", (("lease", "leader"),))
        return {name: _samples(requests.get(f"http://127.0.0.1:{s.port}/metrics",
                                            timeout=10).text).get(key)
                for name, s in servers.items()}  # fmt: skip

    try:
        assert held() == {"host-a:1": 0, "host-b:2": 0}  # nobody leads yet
        a = Lease(journal, "host-a:1", ttl_s=30, margin_s=1)
        assert a.renew()
        assert held() == {"host-a:1": 1, "host-b:2": 0}
        a.release()
        assert Lease(journal, "host-b:2", ttl_s=30, margin_s=1).renew()
        assert held() == {"host-a:1": 0, "host-b:2": 1}
    finally:
        for server in servers.values():
            server.stop()
        journal.close()


class Failing:
    """A sensor that fails every reading: the listing (or the queue) is unknown."""

    def __init__(self, inner: Any, stale: bool = False) -> None:
        self.inner, self.stale = inner, stale

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def list_instances(self) -> list[Any]:
        raise SensorError("vast instance list page 1: HTTP 503 (after 4 attempts)")

    def demand(self) -> list[Demand]:
        raise (StaleReading if self.stale else SensorError)("Curio's queue is not readable")


@pytest.mark.parametrize("failed", ["provider", "demand"])
def test_numbers_a_failed_sensor_did_not_read_are_unknown_not_zero(
    tmp_path: Path, failed: str
) -> None:
    """A failed listing was journaled as 0 instances costing $0/h and a stale queue as 0
    tasks, and shown so by `status`, the dashboard and /metrics (the spend alert went quiet
    while the fleet billed unseen). They are unknown: absent from the metrics, '-' in words."""
    app = assemble(Config(), state=tmp_path / "s", clock=time.time, sleep=time.sleep, seed=7)
    try:
        app.controller.tick()  # the simulator's first fleet and queue, read well
        if failed == "provider":
            app.controller.provider = Failing(app.controller.provider)
        else:
            app.controller.demand = Failing(app.controller.demand, stale=True)
        app.controller.tick()
        [last] = app.journal.meta.ticks(1)
        got = _scrape(app.journal)
        lines = status_lines(app_status(app))
    finally:
        app.close()
    summary = last["summary"]
    assert summary["sensors"][failed] in ("failed", "stale")
    unknown = {"provider": ("instances", "spend_per_h", "running_tasks"),
               "demand": ("pending",)}[failed]  # fmt: skip
    names = {
        "instances": "fleetgate_fleet_instances",
        "spend_per_h": "fleetgate_spend_per_hour",
        "running_tasks": "fleetgate_running_tasks",
        "pending": "fleetgate_pending_tasks",
    }
    for field in unknown:
        assert summary[field] is None, (field, summary)
        assert (names[field], ()) not in got, names[field]
    if failed == "provider":
        assert ", spend -" in lines[2] and "not listed yet" not in lines[2], lines
        assert summary["pending_launches"] is None  # every recent launch counted on its way
    else:
        assert lines[3] == "demand: unknown (the queue read stale at the last tick)", lines


def test_a_launch_given_up_as_lost_then_listed_late_leaves_its_counter_as_it_was(
    tmp_path: Path,
) -> None:
    """A lost launch whose instance vast lists late after all is recorded as ok: the 'lost'
    series went from 1 back to 0, which Prometheus reads as a counter reset."""
    journal = Journal(tmp_path / "j.db")
    try:
        row = record_action(journal, 100.0, action="launch", target="fleet",
                            proposer="rule:scale", status="unknown")  # fmt: skip
        journal.actions.finish(row, 400.0, "lost", {"label": "fg-1"})
        before = _counted(_scrape(journal))
        journal.actions.finish(row, 700.0, "ok", {"instance": "5", "confirmed_late": True})
        after = _counted(_scrape(journal))
    finally:
        journal.close()
    lost = ("fleetgate_actions_total", (("action", "launch"), ("proposer", "rule"),
                                        ("status", "lost")))  # fmt: skip
    ok = (lost[0], (*lost[1][:2], ("status", "ok")))
    assert before[lost] == after[lost] == 1 and after[ok] == 1 and ok not in before
    assert all(after.get(k, 0) >= v for k, v in before.items())

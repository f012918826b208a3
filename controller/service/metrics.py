"""Prometheus metrics over the journal, computed when scraped: GET /metrics.

Nothing is counted in memory: every scrape reads the journal (a few aggregate SELECTs), so
the numbers are the same whichever controller of several serves them, survive a restart, and
say what the journal says. What retention deleted is in the journal's running totals
(controller/store/totals.py) and added in, so no counter goes down when old rows go. Label
values come from fixed sets or from names the controller itself chose (action kinds,
statuses, stages); anything else is `other`, never free text.

    fleetgate_tick_duration_seconds              histogram of finished ticks
    fleetgate_tick_failures_total                ticks started, never finished, before the
                                                 last finished one
    fleetgate_last_tick_finished_timestamp_seconds
    fleetgate_actions_total{action,status,proposer}   actions with an outcome (counted once
                                                 they have one: a counter's series never drops)
    fleetgate_actions_open{action,status}        intents, and outcomes still unknown
    fleetgate_escalations{kind,status}
    fleetgate_escalation_oldest_pending_timestamp_seconds
    fleetgate_llm_calls_total{status}, fleetgate_llm_tokens_total, fleetgate_llm_latency_seconds
    fleetgate_instances{stage,status}            the tracked instances (vast's status: one of
                                                 its documented values, else other)
    fleetgate_fleet_instances, fleetgate_pending_tasks, fleetgate_running_tasks,
    fleetgate_spend_per_hour                     from the last finished tick's summary
    fleetgate_task_pending{task}, fleetgate_task_running{task},
    fleetgate_task_oldest_pending_seconds{task}, fleetgate_task_forecast{task},
    fleetgate_sensor_state{sensor,state}         the same summary's queue per task, sensors
    fleetgate_lease_live{lease}, fleetgate_lease_seconds_left{lease}
    fleetgate_lease_held{lease}                  1 if the controller scraped holds it (the
                                                 one number that differs between controllers)

Timestamps are the controller's clock (seconds since the epoch). A journal that cannot be read
answers 503, so the scrape fails visibly rather than reporting zeros.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from fastapi import APIRouter, Response
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from controller.store import lease
from controller.store.aggregate import loads
from controller.store.backend import JournalError
from controller.store.journal import Journal
from controller.store.totals import (
    LLM_BUCKETS_S,
    PROPOSERS,
    TICK_BUCKETS_S,
    Totals,
    bound_label,
    name_label,
    proposer_class,
)

log = logging.getLogger(__name__)

__all__ = ["LLM_BUCKETS_S", "PROPOSERS", "TICK_BUCKETS_S", "JournalCollector", "metrics_router",
           "name_label", "proposer_class"]  # fmt: skip


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _labelled(family: GaugeMetricFamily | CounterMetricFamily,
              counts: Counter[Any]) -> GaugeMetricFamily | CounterMetricFamily:  # fmt: skip
    """`family` with one sample per label tuple in `counts`, in order."""
    for key, n in sorted(counts.items()):
        family.add_metric(key if isinstance(key, tuple) else (key,), n)
    return family


def _histogram(name: str, doc: str, buckets: Sequence[float], count_le: Sequence[int],
               count: int, total: float) -> HistogramMetricFamily:  # fmt: skip
    les = [str(floatToGoString(b)) for b in buckets]  # type: ignore[no-untyped-call]
    pairs = [(le, float(n)) for le, n in zip(les, count_le, strict=True)]
    return HistogramMetricFamily(name, doc, buckets=[*pairs, ("+Inf", float(count))],
                                 sum_value=total)  # fmt: skip


def _bucket_sql(expr: str, buckets: Sequence[float]) -> str:
    return ", ".join(f"COALESCE(SUM(CASE WHEN {expr} <= {b!r} THEN 1 ELSE 0 END), 0) AS le{i}"
                     for i, b in enumerate(buckets))  # fmt: skip


class JournalCollector(Collector):
    """Every metric, read from `journal` at collection time."""

    def __init__(self, journal: Journal, lease_name: str = lease.LEADER,
                 holder: str | None = None) -> None:  # fmt: skip
        """`holder`: the serving controller's name on the lease (None: no lease_held)."""
        self.journal = journal
        self.lease_name = lease_name
        self.holder = holder
        self._folded: dict[tuple[str, str], float] = {}

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        return self.journal.store.query(sql, args)

    def _total(self, metric: str, labels: str = "") -> float:
        """What retention deleted of `metric` (controller/store/totals.py)."""
        return self._folded.get((metric, labels), 0.0)

    def _folded_histogram(self, name: str, buckets: Sequence[float], row: dict[str, Any]
                          ) -> tuple[list[int], int, float]:  # fmt: skip
        """A histogram's buckets, count and sum: `row`'s (le0.., n, total) and the totals'."""
        le = [int(row[f"le{i}"]) + int(self._total(f"{name}.le", bound_label(b)))
              for i, b in enumerate(buckets)]  # fmt: skip
        return (le, int(row["n"]) + int(self._total(f"{name}.count")),
                float(row["total"]) + self._total(f"{name}.sum"))  # fmt: skip

    def collect(self) -> Iterator[Metric]:
        # the counters and the totals retention folds deleted rows into, as of one instant (a
        # prune between two reads would count its rows twice, or not at all)
        with self.journal.store.snapshot():
            self._folded = self.journal.totals.read()
            ticks, actions, llm = list(self._ticks()), list(self._actions()), list(self._llm())
        yield from ticks
        yield from actions
        yield from self._escalations()
        yield from llm
        yield from self._fleet()
        yield from self._lease()

    # ---- ticks -----------------------------------------------------------------------------
    def _ticks(self) -> Iterator[Metric]:
        dur = "(finished_at - started_at)"
        row = self._query(
            f"SELECT COUNT(*) AS n, COALESCE(SUM({dur}), 0) AS total, MAX(finished_at) AS last, "
            f"MAX(id) AS last_id, {_bucket_sql(dur, TICK_BUCKETS_S)} "
            "FROM ticks WHERE finished_at IS NOT NULL"
        )[0]
        le, n, total = self._folded_histogram("tick", TICK_BUCKETS_S, row)
        yield _histogram("fleetgate_tick_duration_seconds", "How long each finished tick took.",
                         TICK_BUCKETS_S, le, n, total)  # fmt: skip
        failed = int(self._total("tick.failed"))
        if row["last_id"] is not None:
            failed += int(self._query("SELECT COUNT(*) AS n FROM ticks WHERE finished_at IS NULL "
                                     "AND id < ?", (int(row["last_id"]),))[0]["n"])  # fmt: skip
        yield CounterMetricFamily("fleetgate_tick_failures", "Ticks that started and never "
                                  "finished, older than the last finished tick.",
                                  value=failed)  # fmt: skip
        if row["last"] is not None:
            yield GaugeMetricFamily("fleetgate_last_tick_finished_timestamp_seconds",
                                    "When the last tick finished.",
                                    value=float(row["last"]))  # fmt: skip

    # ---- actions ---------------------------------------------------------------------------
    def _actions(self) -> Iterator[Metric]:
        rows = self._query("SELECT action, status, proposer, COUNT(*) AS n FROM actions "
                           "GROUP BY action, status, proposer")  # fmt: skip
        counts: Counter[tuple[str, str, str]] = Counter()
        open_: Counter[tuple[str, str]] = Counter()
        for r in rows:
            if r["status"] in OPEN_STATUSES:  # it moves to its outcome: not a counter's series
                open_[(name_label(r["action"]), str(r["status"]))] += int(r["n"])
                continue
            key = (name_label(r["action"]), name_label(r["status"]),
                   proposer_class(r["proposer"]))  # fmt: skip
            counts[key] += int(r["n"])
        for (metric, labels), value in self._folded.items():
            folded = Totals.action_labels(labels) if metric == "actions" else None
            if folded is not None:
                counts[folded] += int(value)
        yield _labelled(CounterMetricFamily("fleetgate_actions", "Actions with an outcome by "
                                            "kind, status and proposer class.",
                                            labels=("action", "status", "proposer")),
                        counts)  # fmt: skip
        yield _labelled(GaugeMetricFamily("fleetgate_actions_open", "Actions under way "
                                          "(intent) or of unknown outcome, by kind.",
                                          labels=("action", "status")), open_)  # fmt: skip

    # ---- escalations -----------------------------------------------------------------------
    def _escalations(self) -> Iterator[Metric]:
        rows = self._query("SELECT kind, status, COUNT(*) AS n FROM escalations "
                           "GROUP BY kind, status")  # fmt: skip
        counts: Counter[tuple[str, str]] = Counter()
        for r in rows:
            counts[(name_label(r["kind"]), name_label(r["status"]))] += int(r["n"])
        yield _labelled(GaugeMetricFamily("fleetgate_escalations", "Escalations in the journal "
                                          "by kind and status.", labels=("kind", "status")),
                        counts)  # fmt: skip
        oldest = self._query("SELECT MIN(created_at) AS t FROM escalations "
                             "WHERE status = 'pending'")[0]["t"]  # fmt: skip
        if oldest is not None:
            yield GaugeMetricFamily("fleetgate_escalation_oldest_pending_timestamp_seconds",
                                    "When the oldest pending escalation was raised.",
                                    value=float(oldest))  # fmt: skip

    # ---- LLM -------------------------------------------------------------------------------
    def _llm(self) -> Iterator[Metric]:
        rows = self._query("SELECT status, COUNT(*) AS n, COALESCE(SUM(tokens), 0) AS tokens "
                           "FROM llm_calls GROUP BY status")  # fmt: skip
        calls: Counter[str] = Counter()
        for r in rows:
            calls[name_label(r["status"])] += int(r["n"])
        for (metric, status), value in self._folded.items():
            if metric == "llm.calls":
                calls[name_label(status)] += int(value)
        yield _labelled(CounterMetricFamily("fleetgate_llm_calls", "LLM calls by status.",
                                            labels=("status",)), calls)  # fmt: skip
        tokens = sum(int(r["tokens"]) for r in rows) + int(self._total("llm.tokens"))
        yield CounterMetricFamily("fleetgate_llm_tokens", "Tokens the LLM calls used.",
                                  value=tokens)  # fmt: skip
        secs = "(latency_ms / 1000.0)"
        row = self._query(
            f"SELECT COUNT(*) AS n, COALESCE(SUM({secs}), 0) AS total, "
            f"{_bucket_sql(secs, LLM_BUCKETS_S)} FROM llm_calls WHERE latency_ms IS NOT NULL"
        )[0]
        le, n, total = self._folded_histogram("llm.latency", LLM_BUCKETS_S, row)
        yield _histogram("fleetgate_llm_latency_seconds", "How long each LLM call took.",
                         LLM_BUCKETS_S, le, n, total)  # fmt: skip

    # ---- fleet -----------------------------------------------------------------------------
    def _fleet(self) -> Iterator[Metric]:
        tracks = self.journal.fleet.tracks().values()
        counts = Counter((name_label(t.stage), _known(t.status, INSTANCE_STATUSES))
                         for t in tracks)  # fmt: skip
        yield _labelled(GaugeMetricFamily("fleetgate_instances", "Tracked instances by stage "
                                          "and status.", labels=("stage", "status")),
                        counts)  # fmt: skip
        last = self._query("SELECT summary FROM ticks WHERE finished_at IS NOT NULL "
                           "ORDER BY id DESC LIMIT 1")  # fmt: skip
        summary = loads(last[0]["summary"], {}) if last else {}
        if not isinstance(summary, dict):
            summary = {}
        for field, name, doc in (
            ("instances", "fleetgate_fleet_instances", "Instances, as of the last tick."),
            ("pending", "fleetgate_pending_tasks", "Tasks queued, as of the last tick."),
            ("running_tasks", "fleetgate_running_tasks", "Tasks running, as of the last tick."),
            ("spend_per_h", "fleetgate_spend_per_hour", "Spend per hour, as of the last tick."),
        ):  # fmt: skip
            value = _number(summary.get(field))
            if value is not None:
                yield GaugeMetricFamily(name, doc, value=value)
        yield from _per_task(summary.get("demand"))
        yield from _sensors(summary.get("sensors"))

    # ---- leadership ------------------------------------------------------------------------
    def _lease(self) -> Iterator[Metric]:
        state = lease.read(self.journal, self.lease_name)
        live = GaugeMetricFamily("fleetgate_lease_live", "1 while some controller holds the "
                                 "leader lease unexpired.", labels=("lease",))  # fmt: skip
        live.add_metric((self.lease_name,), 1.0 if state.live else 0.0)
        yield live
        left = GaugeMetricFamily("fleetgate_lease_seconds_left", "Seconds until the leader "
                                 "lease expires (0 once expired).", labels=("lease",))  # fmt: skip
        left.add_metric((self.lease_name,), max(0.0, state.expires_in_s) if state.live else 0.0)
        yield left
        if self.holder is not None:
            held = GaugeMetricFamily("fleetgate_lease_held", "1 while the controller serving "
                                     "this scrape holds the leader lease unexpired.",
                                     labels=("lease",))  # fmt: skip
            mine = state.live and state.holder == self.holder
            held.add_metric((self.lease_name,), 1.0 if mine else 0.0)
            yield held


PER_TASK = (
    ("pending", "fleetgate_task_pending", "Tasks of this name queued, as of the last tick."),
    ("running", "fleetgate_task_running", "Tasks of this name running, as of the last tick."),
    ("oldest_pending_s", "fleetgate_task_oldest_pending_seconds",
     "Age of the oldest queued task of this name, as of the last tick (0: none queued)."),
    ("forecast_pending", "fleetgate_task_forecast",
     "Pending + running forecast one boot time ahead, as of the last tick."),
)  # fmt: skip
SENSOR_STATES = ("ok", "stale", "failed")
OPEN_STATUSES = ("intent", "unknown")  # an action's status that later moves to its outcome
# vast's actual_status values (provisioning: none yet); the provider's text, so any other -> other
INSTANCE_STATUSES = ("provisioning", "created", "scheduling", "loading", "running", "rebooting",
                     "stopped", "frozen", "exited", "offline", "unknown")  # fmt: skip


def _known(value: Any, names: Sequence[str]) -> str:
    """`value` if it is one of `names` (a bounded set), else other."""
    return value if isinstance(value, str) and value in names else "other"


def _per_task(queues: Any) -> Iterator[Metric]:
    """The last tick's queue per task name (`task="all"` is the total)."""
    rows = [q for q in queues if isinstance(q, dict)] if isinstance(queues, list) else []
    for field, name, doc in PER_TASK:
        family = GaugeMetricFamily(name, doc, labels=("task",))
        values: dict[str, float] = {}  # names that are not label values all become `other`
        for q in rows:
            value = _number(q.get(field))
            if value is not None:
                label = name_label(q.get("task"))
                was = values.get(label)
                if was is None:
                    values[label] = value
                elif field == "oldest_pending_s":
                    values[label] = max(was, value)
                else:
                    values[label] = was + value
        for label, value in sorted(values.items()):
            family.add_metric((label,), value)
        yield family


def _sensors(states: Any) -> Iterator[Metric]:
    """One series per sensor and state, 1 for the state it was in at the last tick."""
    family = GaugeMetricFamily("fleetgate_sensor_state", "1 for the state each sensor was in "
                               "at the last tick.", labels=("sensor", "state"))  # fmt: skip
    if isinstance(states, dict):
        for sensor, state in sorted(states.items()):
            for known in SENSOR_STATES:
                family.add_metric((name_label(sensor), known), 1.0 if state == known else 0.0)
    yield family


def metrics_router(journal: Journal, holder: str | None = None) -> APIRouter:
    """GET /metrics: the journal's metrics in Prometheus's text format (`holder`: the serving
    controller's name on the lease)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JournalCollector(journal, holder=holder))
    router = APIRouter()

    @router.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        try:
            body = generate_latest(registry)
        except JournalError as exc:
            log.warning("/metrics: the journal could not be read: %s", exc)
            return Response("the journal could not be read\n", status_code=503,
                            media_type="text/plain")  # fmt: skip
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return router

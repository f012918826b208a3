"""Gather: the first step of a tick. Read the journal once, then sense, into a frozen snapshot.

Nothing here writes: `fleetgate explain` is gather + plan on a store opened read-only. A failed
sensor is a failed reading in the observation, never "zero instances".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any

from controller.core import forecast
from controller.core.fields import is_digits
from controller.core.model import Observation, Proposal, SensorStatus
from controller.core.reconcile import VETO_REPEAT_S, veto_key
from controller.core.sanity import check_listing
from controller.core.track import History, Measured
from controller.fleet.base import DemandSensor, ProviderError, Sensed, SensorError, StaleReading
from controller.store.demand import Window
from controller.store.journal import Journal
from escalation import approvals

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gathered:
    """What one tick knows before deciding: the journal's rows and what was sensed."""

    now: float
    history: History
    observation: Observation
    intents: tuple[dict[str, Any], ...]  # actions left at `intent`
    launches: tuple[dict[str, Any], ...]  # single launches still open or recently done
    seen: frozenset[str]  # launched instance ids listed since the pending window began
    replacements: tuple[dict[str, Any], ...]
    approved: tuple[Proposal, ...]  # approved answers not yet carried out
    pending: tuple[dict[str, Any], ...]  # pending escalations (some may be past deadline)
    vetoes: frozenset[tuple[str, ...]]  # vetoes journaled within VETO_REPEAT_S
    paused: bool
    # approved escalations whose answer a run set out to carry out but did not mark: (escalation
    # id, action id, the action's status); they are closed, never carried out again
    carried: tuple[tuple[int, int, str], ...] = ()


FORECAST_EVERY_S = 300.0  # a forecast is made again at least this often, or when demand moves


@dataclass
class ForecastCache:
    """The last forecasts made, and what they were made from: while the demand read, the
    horizon and the 5-minute slot stay the same, the tick reuses them rather than read the
    demand history again (the forecast one boot time ahead moves by minutes, not by ticks)."""

    key: tuple[Any, ...] = ()
    value: dict[str, Any] = field(default_factory=dict)
    window: Window = field(default_factory=Window)  # the history's rows the forecasts read


def gather(journal: Journal, provider: Sensed, demand: DemandSensor, now: float, *,
           pending_s: float, boot_s: float = forecast.DEFAULT_BOOT_S,
           tasks_per_instance: float = 2,
           cache: ForecastCache | None = None,
           measured_cache: MeasuredCache | None = None) -> Gathered:  # fmt: skip
    """One read of history, then sensing (`sense`), then the listing's sanity check; then
    the demand forecast one boot time ahead (`boot_s` until the fleet's own boots say),
    reused from `cache` while what it is made from is unchanged."""
    with journal.store.snapshot():  # one read: every row as of one moment
        replacements = tuple(journal.actions.replacements())
        hist = journal.fleet.history(now, replacements)
        horizon = forecast.boot_horizon(forecast.boot_samples(hist.instances.values()), boot_s)
        destroyed = journal.actions.destroyed_since(now - 3600)
        launches = journal.actions.recent_launches(now - pending_s)
        ours = [str(r["result"]["instance"]) for r in launches if r["result"].get("instance")]
        seen = journal.fleet.seen_instances(now - pending_s, ours)
        intents = tuple(journal.actions.in_flight())
        open_ = journal.escalations.by_status(("approved", "pending"))
        acted = journal.actions.acted_on([int(e["id"]) for e in open_["approved"]])
        approved = tuple(approvals.approved_proposals(
            journal, [e for e in open_["approved"] if int(e["id"]) not in acted]))  # fmt: skip
        pending = tuple(open_["pending"])
        vetoes = recent_vetoes(journal, now)
        measured = recent_measured(journal, now, measured_cache)
        paused = bool(journal.meta.get("paused", False))
    sensed = sense(provider, demand, now, hist.instances, destroyed)
    # rates Curio measured: data for the plan (journaled as `measured` events by `advance`)
    learned: dict[str, Any] = {"measured": measured,
                               "measured_now": dict(getattr(provider, "measured", {})),
                               "task_s": dict(getattr(provider, "task_seconds", {}))}  # fmt: skip
    obs = check_listing(sensed, hist.instances, [*destroyed, *sensed.confirmed_gone])
    if obs.sensor_ok("demand"):
        current = {d.task: float(d.pending + d.running) for d in obs.demand}
        key = (horizon, tasks_per_instance, int(now // FORECAST_EVERY_S),
               tuple(sorted(current.items())))  # fmt: skip
        if cache is not None and cache.key == key:
            forecasts = cache.value
        else:  # the demand history is written by the leader's own ticks alone, after gather
            spans = forecast.spans(now, horizon)
            series = journal.demand.series(spans, cache.window if cache is not None else None)
            forecasts = forecast.by_task(series, current, now, horizon, tasks_per_instance)
            if cache is not None:
                cache.key, cache.value = key, forecasts
        learned["forecasts"] = forecasts
    hist = replace(hist, **learned)
    carried = tuple((e, a, status) for e, (a, status) in sorted(acted.items()))
    return Gathered(now, hist, obs, intents, tuple(launches), frozenset(seen), replacements,
                    approved, pending, vetoes, paused, carried)  # fmt: skip


def recent_vetoes(journal: Journal, now: float) -> frozenset[tuple[str, ...]]:
    """The vetoes journaled within VETO_REPEAT_S (not answers to escalations), by `veto_key`."""
    rows = journal.store.query(
        "SELECT action, target, guard, params FROM actions WHERE verdict = 'veto' AND at > ? "
        "AND escalation_id IS NULL", (now - VETO_REPEAT_S,))  # fmt: skip
    return frozenset(veto_key(str(r["action"]), str(r["target"]), str(r["guard"] or ""),
                              json.loads(r["params"])) for r in rows)  # fmt: skip


MEASURED_KEEP_S = 7 * 86_400.0  # a host's last measurement ranks it this long after


@dataclass
class MeasuredCache:
    """The hosts' latest `measured` events read so far, and the last event id read: a tick
    reads only the events journaled since (a week of them is thousands of rows)."""

    last_id: int = 0
    latest: dict[str, tuple[float, int, Measured]] = field(default_factory=dict)


def recent_measured(journal: Journal, now: float,
                    cache: MeasuredCache | None = None) -> dict[str, Measured]:  # fmt: skip
    """Each host's latest `measured` event within MEASURED_KEEP_S, by machine id; with
    `cache`, from the events after the last one it read (ids only grow)."""
    cache = cache if cache is not None else MeasuredCache()
    since = now - MEASURED_KEEP_S
    if cache.last_id:  # the events after the last read, by id (not a scan of a week's)
        rows = journal.store.query(
            "SELECT id, instance_id, at, detail FROM events WHERE id > ? "
            "AND kind || '' = 'measured' AND at >= ? ORDER BY id",
            (cache.last_id, since),
        )
        rows.sort(key=lambda r: (float(r["at"]), int(r["id"])))
    else:
        rows = journal.store.query(
            "SELECT id, instance_id, at, detail FROM events WHERE kind = 'measured' AND at >= ? "
            "ORDER BY at, id", (since,))  # fmt: skip
    for r in rows:
        m = Measured.of_event(str(r["instance_id"]), float(r["at"]), json.loads(r["detail"]))
        key = (float(r["at"]), int(r["id"]))
        held = cache.latest.get(m.machine_id)
        if held is None or key >= held[:2]:
            cache.latest[m.machine_id] = (*key, m)
        cache.last_id = max(cache.last_id, int(r["id"]))
    for machine in [k for k, (at, _, _) in cache.latest.items() if at < since]:
        del cache.latest[machine]
    return {machine: m for machine, (_, _, m) in cache.latest.items()}


def sense(provider: Sensed, demand: DemandSensor, now: float,
          tracked: Collection[str] = (),
          destroyed: Collection[str] = ()) -> Observation:  # fmt: skip
    """Each sensor independently; a failure is recorded, never read as zero.

    Tracked instances that a good listing lacks (and that we did not destroy) are looked up
    one by one where the provider can (`confirm_gone`): vast's listing has answered empty while
    instances billed, and an instance destroyed in vast's console, or by a destroy whose answer
    timed out, is gone only when vast says so. The rest stay `unconfirmed`."""
    sensors: list[SensorStatus] = []
    instances = _read("provider", provider.list_instances, sensors)
    queue = _read("demand", demand.demand, sensors)
    foreign = tuple(getattr(provider, "foreign", ()))
    obs = Observation(now, tuple(instances), tuple(queue), tuple(sensors), foreign)
    confirm = getattr(provider, "confirm_gone", None)
    if confirm is None or not obs.sensor_ok("provider"):
        return obs
    # one listed as not fleetgate's (relabelled: by a person, or by whatever holds a key to
    # it) did not vanish: it left the fleet, and is gone from it; it still bills, so say so
    relabelled = set(tracked) & {i.id for i in foreign}
    for f in foreign:
        if f.id in relabelled:
            log.warning("instance %s left the fleet: vast lists it with the label %r, not its "
                        "launch's; it is left alone and still bills until someone destroys "
                        "it", f.id, f.label)  # fmt: skip
    listed = {i.id for i in instances} | {i.id for i in foreign}
    missing = sorted(set(tracked) - listed - set(destroyed), key=_numeric)
    if not missing:
        return obs
    try:
        gone = set(confirm(missing))
    except (ProviderError, SensorError) as exc:
        log.warning("sensing: cannot confirm %d missing instance(s): %s", len(missing), exc)
        gone = set()
    return replace(obs, confirmed_gone=tuple(i for i in missing if i in gone),
                   unconfirmed=tuple(i for i in missing if i not in gone))  # fmt: skip


def _numeric(instance_id: str) -> tuple[int, str]:
    return (int(instance_id), "") if is_digits(instance_id) else (0, instance_id)


def _read(name: str, read: Callable[[], list[Any]], sensors: list[SensorStatus]) -> list[Any]:
    try:
        values = read()
    except StaleReading as exc:
        sensors.append(SensorStatus(name, "stale", str(exc)[:300]))
        log.error("sensing: %s is stale: %s", name, exc)
        return []
    except (ProviderError, SensorError) as exc:
        sensors.append(SensorStatus(name, "failed", str(exc)[:300]))
        log.error("sensing: %s failed: %s", name, exc)
        return []
    sensors.append(SensorStatus(name, "ok"))
    return values

"""Facts: the flat JSON objects rules match, built from an observation and tracked history.

Pure: no I/O, no clock. Temporal fields (`stage_age_s`, `down_for_s`, `restarts_1h`, ...) come
from the tracked history (`controller.core.track`), so every tick's matching is a fresh pass.
"""

from __future__ import annotations

from typing import Any

from controller.core.model import STAGES, Observation
from controller.core.track import History

# Every field a rule may name, per fact kind (a typo in a rules file is an error, not a no-op).
FIELDS: dict[str, frozenset[str]] = {
    "instance": frozenset(
        {
            "id", "label", "machine_id", "host_id", "status", "stage", "daemon", "sidecar",
            "gpu_name", "num_gpus", "dph", "tasks_running", "drained", "bench_rate",
            "daemon_uptime_s", "status_msg", "age_s", "stage_age_s", "status_for_s",
            "down_for_s", "restarts_1h", "deaths_1h", "idle_for_s", "host_blocked", "host_rate",
            "replacing", "retiring", "command_overdue_s", "parked", "parked_for_s",
            "starting_for_s",
        }
    ),
    "demand": frozenset({"id", "task", "pending", "running", "oldest_pending_s", "max_retries",
                         "forecast_pending", "forecast_horizon_s", "forecast_instances",
                         "task_s", "backlog_slots"}),
    "fleet": frozenset(
        {
            "id", "instances", "active", "serving", "booting", "dead", "drained",
            "pending_launches", "parked",
            "spend_per_h", "launches_1h", "starts_1h", "pending", "running_tasks",
            "hour_utc", "weekday_utc",
        }
    ),
    "sensor": frozenset({"id", "name", "state", "detail"}),
}  # fmt: skip

DEAD_STATUSES = frozenset({"exited", "offline", "unknown"})

# The values a field takes, where they are a closed set: a rule naming another (`status:
# froze`) would never match, so `check` refuses it. `status` is vast's `actual_status`
# (`provisioning` for its null), as its API and console show them.
VALUES: dict[str, dict[str, tuple[str, ...]]] = {
    "instance": {
        "status": ("provisioning", "created", "loading", "scheduling", "running", "stopped",
                   "frozen", "exited", "rebooting", "restarting", "recycling", "unknown",
                   "offline"),
        "stage": STAGES,
        "daemon": ("up", "down", "unknown"),
        "sidecar": ("up", "down", "unknown"),
    },
    "sensor": {"state": ("ok", "stale", "failed")},
}  # fmt: skip


def _instance_fact(inst: Any, hist: History, now: float) -> dict[str, Any]:
    st = hist.instances.get(inst.id)
    fact: dict[str, Any] = {
        "kind": "instance",
        "id": inst.id,
        "label": inst.label,
        "machine_id": inst.machine_id,
        "host_id": inst.host_id,
        "status": inst.status,
        "stage": inst.stage,
        "daemon": inst.daemon,
        "sidecar": inst.sidecar,
        "gpu_name": inst.gpu_name,
        "num_gpus": inst.num_gpus,
        "dph": inst.dph,
        "tasks_running": inst.tasks_running,
        "drained": inst.drained,
        "status_msg": inst.status_msg,
        "age_s": now - st.first_seen if st else 0.0,
        "stage_age_s": now - st.stage_since if st else 0.0,
        "status_for_s": now - st.status_since if st else 0.0,
        "down_for_s": now - st.daemon_since if st and inst.daemon != "up" else 0.0,
        "restarts_1h": hist.count(inst.id, "restart", now - 3600),
        "deaths_1h": hist.count(inst.id, "death", now - 3600),
        "idle_for_s": now - st.idle_since if st and st.idle_since is not None else 0.0,
        "host_blocked": hist.host_blocked(inst.machine_id, now),
        "replacing": inst.id in hist.replacing,
        "retiring": inst.id in hist.retiring,
        "parked": st is not None and st.parked_since is not None,
    }
    if st is not None and st.parked_since is not None:  # stopped by fleetgate's own `stop`
        fact["parked_for_s"] = now - st.parked_since
        if st.start_asked is not None:
            fact["starting_for_s"] = now - st.start_asked
    if inst.command_overdue_s:  # rare: only then asserted (every field costs the engine)
        fact["command_overdue_s"] = inst.command_overdue_s
    if inst.bench_rate is not None:
        fact["bench_rate"] = inst.bench_rate
    if inst.daemon_uptime_s is not None:
        fact["daemon_uptime_s"] = inst.daemon_uptime_s
    rate = hist.host_rates.get(inst.machine_id)
    if rate is not None:
        fact["host_rate"] = rate
    return fact


def fleet_fact(obs: Observation, hist: History, now: float) -> dict[str, Any]:
    inst = obs.instances
    dead = {i.id for i in inst if i.status in DEAD_STATUSES}
    # A drained instance that runs takes no new task: it is on its way out, not capacity (the
    # shipped rules undrain it when tasks wait again). One still booting counts as on its way:
    # its node may have inherited an old cordon on the same host, and it is undrained alike.
    # parked (stopped by fleetgate, no start asked): neither capacity nor booting; one whose
    # start was asked counts as capacity on its way, as a launch does
    tracks = hist.instances
    parked = {i.id for i in inst if (t := tracks.get(i.id)) is not None
              and t.parked_since is not None and t.start_asked is None}  # fmt: skip
    serving = sum(1 for i in inst if i.stage == "running" and i.status == "running"
                  and not i.drained)  # fmt: skip
    starting = {i.id for i in inst if (t := tracks.get(i.id)) is not None
                and t.start_asked is not None}  # fmt: skip
    active = sum(1 for i in inst if i.id not in hist.retiring and i.id not in dead
                 and i.id not in parked
                 and (i.id in starting or not (i.drained and i.stage == "running")))  # fmt: skip
    total = next((d for d in obs.demand if d.task == "all"), None)
    # parked instances the fleet started in the last hour: the warm pool served demand
    starts = sum(1 for key, at in hist.last_acted.items()
                 if key.startswith("start:") and at >= now - 3600)  # fmt: skip
    return {
        "kind": "fleet",
        "id": "fleet",
        "instances": len(inst),
        "active": active + hist.pending_launches,
        "pending_launches": hist.pending_launches,
        "serving": serving,
        "booting": sum(
            1 for i in inst if i.stage != "running" and i.id not in dead and i.id not in parked
        ),
        "parked": len(parked),
        "dead": len(dead),
        "drained": sum(1 for i in inst if i.drained),
        "spend_per_h": round(sum(i.dph for i in inst), 4),
        "launches_1h": hist.launches_since(now - 3600),
        "starts_1h": starts,
        "pending": total.pending if total else 0,
        # tasks on the fleet's own nodes: Curio's other nodes (the operator's own) may run
        # proving tasks too, and those are not this fleet's capacity in use
        "running_tasks": sum(i.tasks_running for i in inst),
        # the tick's hour and day of the week (UTC, Monday 0), for a fleet kept by the clock:
        # `fleet: {hour_utc: {gte: 8, lt: 18}, weekday_utc: {lte: 4}}`
        "hour_utc": int(now // 3600 % 24),
        "weekday_utc": int((now // 86400 + 3) % 7),  # (1 January 1970 was a Thursday)
    }


def _backlog(d: Any, task_s: float | None, f: Any) -> dict[str, Any]:
    """`task_s`, once Curio has timed the fleet's runs, and `backlog_slots`: the task slots
    that would finish the pending tasks within one boot time (the forecast's horizon), so
    pending x min(1, task_s / horizon). Capacity rented now serves only after a boot: a
    backlog that fewer slots clear within it gains nothing from more. Until the tasks are
    timed (or without a horizon), one slot per pending task, as if every task outlasted a boot."""
    if task_s is None or f is None or f.horizon_s <= 0:
        return {"backlog_slots": float(d.pending)}
    share = min(1.0, task_s / f.horizon_s)
    return {"task_s": round(task_s, 3), "backlog_slots": round(d.pending * share, 3)}


def build_facts(obs: Observation, hist: History, now: float) -> list[dict[str, Any]]:
    """All facts of one tick. Ids are unique within the tick; the engine adds `sid`."""
    facts: list[dict[str, Any]] = [fleet_fact(obs, hist, now)]
    for s in obs.sensors:
        facts.append(
            {"kind": "sensor", "id": f"sensor:{s.name}", "name": s.name, "state": s.state,
             "detail": s.detail}
        )  # fmt: skip
    for d in obs.demand:
        facts.append(
            {"kind": "demand", "id": f"demand:{d.task}", "task": d.task, "pending": d.pending,
             "running": d.running, "oldest_pending_s": d.oldest_pending_s,
             "max_retries": d.max_retries}
        )  # fmt: skip
        # demand one boot time ahead (`controller.core.forecast`), set in gather; the count
        # of instances is at `settings.tasks_per_instance`
        f = hist.forecasts.get(d.task)
        if f is not None:
            facts[-1].update(forecast_pending=round(f.pending, 3), forecast_horizon_s=f.horizon_s,
                             forecast_instances=f.count)  # fmt: skip
        facts[-1].update(_backlog(d, hist.task_s.get(d.task), f))
    facts.extend(_instance_fact(i, hist, now) for i in obs.instances)
    return facts

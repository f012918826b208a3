"""What `fleetgate status` shows, from the journal: the fleet as the last tick saw it, the
queue, the last tick, what waits on people, instances on the account fleetgate does not manage.

One document whether a running controller answers (`App.status`) or the journal is read alone
(`controller/service/offline.py`, with broken rules or an unset secret).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from controller.service import autonomy
from controller.store import lease
from controller.store.aggregate import loads
from controller.store.journal import Journal
from escalation.router import STANDING


def status_doc(journal: Journal, *, now: float, provider: str, paused: bool, rules: Any,
               ttl_s: float, sim: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """`paused`: the config's own pause (the journal's is read here); `rules`: the digest of
    the rules in force; `sim`: the simulated world's stats, if any."""
    last = journal.meta.ticks(1)
    tracks = list(journal.fleet.history(now).instances.values())
    by_stage: dict[str, int] = {}
    for t in tracks:
        key = t.stage if t.status == "running" else t.status
        by_stage[key] = by_stage.get(key, 0) + 1
    summary = (last[0].get("summary") or {}) if last else {}
    return {
        "provider": provider,
        "paused": bool(journal.meta.get("paused", False)) or paused,
        "rules": rules,
        "last_tick": last[0] if last else None,
        "instances": len(tracks),
        "by_stage": by_stage,
        "foreign": summary.get("foreign", []),
        "foreign_total": summary.get("foreign_total"),
        "spend_per_h": summary.get("spend_per_h"),
        "demand": {
            "all": {"pending": summary.get("pending"), "running": summary.get("running_tasks")}
        },  # fmt: skip
        "pending_launches": summary.get("pending_launches") or 0,
        "pending_escalations": len(journal.escalations.recent(status="pending")),
        # answered yes, carried out by the controller's next tick
        "approved_escalations": len(journal.escalations.recent(status="approved")),
        "unanswered": unanswered(journal),
        "leader": lease.read(journal, ttl_s=ttl_s).as_dict(),
        "sim": sim,
        "autonomy": autonomy.status_part(journal),  # the track record: suggestions, demotions
    }


def unanswered(journal: Journal) -> list[dict[str, Any]]:
    """The situations that still hold after their last escalation ended without fixing them
    (it expired, was denied, or its action did not clear them), and why none is raised now:
    not pending, yet not over. Oldest first."""
    standing = journal.meta.get(STANDING, None) or {}
    out = []
    for entry in standing.values():
        last = journal.escalations.escalation(int(entry["last"]))
        if last is None or last["status"] in ("pending", "approved", "resolved"):
            continue  # waiting on people, about to act, or over
        out.append({"escalation": int(last["id"]), "subject": last["subject"],
                    "status": last["status"], "asks": int(entry["asks"]),
                    "since": float(entry["since"]), "why": entry.get("why", "")})  # fmt: skip
    return sorted(out, key=lambda u: (u["since"], u["escalation"]))


# ---- in words (`fleetgate status` without --json) ----------------------------------------
VERDICT_WORDS = (("act", "acted on"), ("ask", "awaiting approval"), ("veto", "vetoed"),
                 ("noop", "already so"), ("superseded", "superseded"),
                 ("observe", "observed"))  # fmt: skip


def status_lines(st: dict[str, Any]) -> list[str]:
    """`fleetgate status` in words, from the document `--json` prints."""
    lines = [f"provider {st['provider']}  rules {st['rules']}  paused {st['paused']}"]
    last = st["last_tick"]
    if last:
        lines.append(f"last tick #{last['id']} at {_when(last['started_at'])}: "
                     f"{_tick_words(last.get('summary') or {})}")  # fmt: skip
    stages = ", ".join(f"{k} {v}" for k, v in sorted(st["by_stage"].items()))
    spend = st["spend_per_h"]
    on_way = st.get("pending_launches") or 0
    rented = f"; {on_way} rented, not listed yet" if on_way else ""
    lines.append(f"instances {st['instances']} ({stages or 'none'}{rented}), spend "
                 f"{'-' if spend is None else f'${round(spend, 4)}/h'}")  # fmt: skip
    lines.append(_demand_words(st, (last or {}).get("summary") or {}))
    foreign = st.get("foreign") or []
    if foreign:
        shown = ", ".join(f"{f.get('id')} ({f.get('label') or 'no label'}, {f.get('status')})"
                          for f in foreign)  # fmt: skip
        more = (st.get("foreign_total") or 0) - len(foreign)
        shown += f", and {more} more" if more > 0 else ""
        lines.append(f"not fleetgate's (left alone): {shown}")
    approved = st.get("approved_escalations") or 0
    lines.append(f"pending escalations: {st['pending_escalations']}"
                 + (f"; approved, carried out at the next tick: {approved}" if approved
                    else ""))  # fmt: skip
    for u in st.get("unanswered", []):
        lines.append(f"still holds, not asked now: {u['subject']} (asked {u['asks']} "
                     f"time{'s' if u['asks'] != 1 else ''} since {_when(u['since'])}: "
                     f"{u['why']})")  # fmt: skip
    for line in [s["text"] for s in st.get("autonomy", {}).get("suggestions", [])]:
        lines.append(f"autonomy suggestion: {line}")
    for d in st.get("autonomy", {}).get("demoted", []):
        lines.append(f"autonomy: {d['action']} ({d['kind']}) demoted to propose: {d['why']}")
    lead = st["leader"]
    if lead["live"]:
        lines.append(f"leader: {lead['holder']} (token {lead['token']}, lease "
                     f"{lead['expires_in_s']:.0f} s left)")  # fmt: skip
    else:
        lines.append("leader: none" + (f" (last {lead['holder']}, token {lead['token']})"
                                       if lead["holder"] else ""))  # fmt: skip
    return lines


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _tick_words(summary: dict[str, Any]) -> str:
    """A tick's summary in words: what became of its decisions, or why it held."""
    if summary.get("held"):
        return (f"held, acting on nothing: {summary['held']} "
                f"({summary.get('escalated', 0)} escalated)")  # fmt: skip
    done = [f"{summary[key]} {words}" for key, words in VERDICT_WORDS if summary.get(key)]
    parts = [
        f"decisions {', '.join(done) or 'none'}",
        f"{summary.get('doubts', 0)} doubts, {summary.get('escalated', 0)} escalated",
    ]
    sensors = summary.get("sensors") or {}
    if sensors:
        parts.append("sensors " + ", ".join(f"{k} {v}" for k, v in sorted(sensors.items())))
    return "; ".join(parts)


def _demand_words(st: dict[str, Any], summary: dict[str, Any]) -> str:
    """The queue per task as the last tick read it (pending/running, and the forecast of both
    one boot ahead where there is one); tasks with nothing in the queue are left out."""
    queues = [q for q in summary.get("demand") or [] if isinstance(q, dict)]
    if not queues:
        sensed = (summary.get("sensors") or {}).get("demand")
        if sensed not in (None, "ok"):
            return f"demand: unknown (the queue read {sensed} at the last tick)"
        total = st["demand"]["all"]
        if total["pending"] is None and total["running"] is None:
            return "demand: not read yet"
        known = {k: "-" if v is None else v for k, v in total.items()}
        return f"demand: all {known['pending']} pending/{known['running']} running"
    queues.sort(key=lambda q: (q.get("task") != "all", str(q.get("task"))))
    shown, horizons = [], set()
    for q in queues:
        ahead = q.get("forecast_pending")
        expected = ahead is not None and round(float(ahead), 1) > 0  # as shown, to 0.1
        if not (q.get("pending") or q.get("running") or expected) and q.get("task") != "all":
            continue
        text = f"{q.get('task')} {q.get('pending')}/{q.get('running')}"
        if ahead is not None:
            text += f" ({float(ahead):.1f})"
            horizons.add(round(float(q.get("forecast_horizon_s") or 0.0) / 60.0))
        shown.append(text)
    ahead_words = (f" (forecast of the two together in {horizons.pop()} min)"
                   if len(horizons) == 1 else " (forecast of the two together one boot ahead)"
                   if horizons else "")  # fmt: skip
    return f"demand, pending/running{ahead_words}: " + ", ".join(shown)


# ---- readiness (GET /readyz) ---------------------------------------------------------------
STALL_TICKS = 3  # the last tick finished this many intervals ago: the ticks have stalled
STALL_SLACK_S = 30.0  # ... and at least this long ago (a slow tick on a short interval is not)


def last_finished_tick(journal: Journal) -> dict[str, Any] | None:
    """The newest tick that finished, its summary decoded (a tick under way has none yet)."""
    rows = journal.store.query(
        "SELECT * FROM ticks WHERE finished_at IS NOT NULL ORDER BY id DESC LIMIT 1", ()
    )
    if not rows:
        return None
    row = dict(rows[0])
    summary = loads(row.get("summary"), {})
    row["summary"] = summary if isinstance(summary, dict) else {}
    return row


def stall_after_s(interval_s: float) -> float:
    """How old the last finished tick may be before the controller counts as stalled."""
    return max(STALL_TICKS * interval_s, interval_s + STALL_SLACK_S)


def readiness(last: dict[str, Any] | None, *, now: float, interval_s: float | None,
              leader: lease.LeaseState, holder: str | None) -> dict[str, Any]:  # fmt: skip
    """Whether the controller is doing its work, from the journal alone: `ready` and, when it
    is not, the `reasons` in words. `last`: the last finished tick; `interval_s`: the configured
    interval (None: the age is shown, not judged); `leader`: the lease as the store sees it;
    `holder`: this controller's name on the lease (None: unknown). Pure."""
    reasons: list[str] = []
    if holder is not None and leader.live and leader.holder == holder:
        role = "leader"
    elif leader.live:
        role = "standby"
    else:
        role = "none"
        reasons.append("no controller holds the leader lease")
    doc: dict[str, Any] = {"role": role, "leader": leader.holder if leader.live else None}
    if last is None:
        reasons.append("no tick has finished yet")
        sensors: dict[str, Any] = {}
    else:
        age = max(0.0, now - float(last["finished_at"]))
        summary = last.get("summary") or {}
        sensors = summary.get("sensors") or {}
        doc["last_tick"] = {"id": last["id"], "finished_at": last["finished_at"],
                            "age_s": round(age, 1)}  # fmt: skip
        if interval_s is not None:
            limit = stall_after_s(interval_s)
            doc["interval_s"], doc["stall_after_s"] = interval_s, limit
            if age > limit:
                reasons.append(f"the last tick finished {age:.0f} s ago (interval "
                               f"{interval_s:g} s; stalled after {limit:g} s)")  # fmt: skip
        if summary.get("held"):
            reasons.append("the last tick held: it acted on nothing (see the escalations)")
        for name, state in sorted(sensors.items()):
            if state != "ok":
                reasons.append(f"sensor {name} was {state} at the last tick")
    doc["sensors"] = sensors
    doc["ready"] = not reasons
    doc["status"] = "ready" if not reasons else "not ready"
    if reasons:
        doc["reasons"] = reasons
    return doc

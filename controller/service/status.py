"""What `fleetgate status` shows, from the journal: the fleet as the last tick saw it, the
queue, the last tick, what waits on people, instances on the account fleetgate does not manage.

One document whether a running controller answers (`App.status`) or the journal is read alone
(`controller/service/offline.py`, with broken rules or an unset secret).
"""

from __future__ import annotations

from typing import Any

from controller.store import lease
from controller.store.journal import Journal


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
        "spend_per_h": summary.get("spend_per_h"),
        "demand": {
            "all": {"pending": summary.get("pending"), "running": summary.get("running_tasks")}
        },  # fmt: skip
        "pending_escalations": len(journal.escalations.recent(status="pending")),
        "leader": lease.read(journal, ttl_s=ttl_s).as_dict(),
        "sim": sim,
    }

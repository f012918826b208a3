"""Running totals of a simulation and their summary (spend, GPU hours, tasks, queue waits), and
how often each distinct situation was escalated, read by the LLM and sent to people."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Stats:
    """Counters kept as the world moves; live instances' billing is added at summary time."""

    spend_closed_usd: float = 0.0  # spend of destroyed instances
    storage_closed_usd: float = 0.0  # of which their storage while stopped
    gpu_hours_closed: float = 0.0
    tasks_arrived: int = 0
    tasks_completed: int = 0
    tasks_released: int = 0  # times a task went back to pending (retries)
    instances_launched: int = 0
    instances_destroyed: int = 0
    waits: list[float] = field(default_factory=list)  # claim - posted of completed tasks

    def close_billing(self, dph: float, num_gpus: int, billed_s: float,
                      storage_usd: float = 0.0) -> None:  # fmt: skip
        """Add a destroyed instance's bill (`storage_usd`: its disk's while it was stopped)."""
        self.spend_closed_usd += dph * billed_s / 3600.0 + storage_usd
        self.storage_closed_usd += storage_usd
        self.gpu_hours_closed += num_gpus * billed_s / 3600.0

    def summary(self, live_bills: list[tuple[float, int, float]], live_storage_usd: float = 0.0
                ) -> dict[str, Any]:  # fmt: skip
        """The stats dict; `live_bills` is (dph, num_gpus, billed_s) per live instance, and
        `live_storage_usd` what live instances' disks billed while stopped. `spend_usd`
        includes storage; `storage_usd` is that part alone (GPU-hours exclude stopped time)."""
        storage = self.storage_closed_usd + live_storage_usd
        spend = self.spend_closed_usd + sum(d * s / 3600.0 for d, _, s in live_bills)
        spend += live_storage_usd
        gpu_hours = self.gpu_hours_closed + sum(g * s / 3600.0 for _, g, s in live_bills)
        return {
            "spend_usd": spend,
            "storage_usd": storage,
            "gpu_hours": gpu_hours,
            "tasks_arrived": self.tasks_arrived,
            "tasks_completed": self.tasks_completed,
            "tasks_released": self.tasks_released,
            "waits_s": wait_summary(self.waits),
            "instances_launched": self.instances_launched,
            "instances_destroyed": self.instances_destroyed,
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Stats:
        return cls(**{**data, "waits": list(data["waits"])})


def wait_summary(waits: list[float]) -> dict[str, float | int]:
    """count, p50, p95 and max (nearest rank); zeros when there are none."""
    if not waits:
        return {"count": 0, "p50": 0.0, "p95": 0.0, "max": 0.0}
    ordered = sorted(waits)
    return {
        "count": len(ordered),
        "p50": _nearest_rank(ordered, 0.50),
        "p95": _nearest_rank(ordered, 0.95),
        "max": ordered[-1],
    }


def _nearest_rank(ordered: list[float], q: float) -> float:
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def per_situation(
    escalations: Iterable[Mapping[str, Any]],
    llm_calls: Iterable[Mapping[str, Any]],
    jobs: Iterable[Mapping[str, Any]],
) -> dict[str, Any]:
    """Escalations, LLM calls and deliveries to people per distinct situation (fingerprint).

    `escalations`, `llm_calls` and `jobs` are journal rows (the escalation outbox's jobs: a
    `read_and_deliver` job whose outcome is "delivered ..." reached people). Totals, and the
    most any one situation had."""
    fp_of = {int(e["id"]): str(e["fingerprint"]) for e in escalations}
    counts: dict[str, Counter[str]] = {
        "escalations": Counter(fp_of.values()),
        "llm_calls": Counter(fp_of[int(c["escalation_id"])] for c in llm_calls
                             if c.get("escalation_id") is not None
                             and int(c["escalation_id"]) in fp_of),
        "to_people": Counter(fp_of[int(j["escalation_id"])] for j in jobs
                             if j.get("kind") == "read_and_deliver"
                             and str(j.get("outcome") or "").startswith("delivered")
                             and int(j["escalation_id"]) in fp_of),
    }  # fmt: skip
    out: dict[str, Any] = {"situations": len(set(fp_of.values()))}
    for name, counter in counts.items():
        out[name] = sum(counter.values())
        out[f"most_{name}"] = max(counter.values(), default=0)
    return out


def per_situation_line(p: Mapping[str, Any]) -> str:
    """The report's line for `per_situation`'s result."""
    n = int(p["situations"])
    if n == 0:
        return "per distinct situation: none was escalated"
    parts = [f"{label} {p[name] / n:.2f} (at most {p[f'most_{name}']})" for name, label in
             (("escalations", "escalations"), ("llm_calls", "LLM calls"),
              ("to_people", "sent to people"))]  # fmt: skip
    return f"per distinct situation ({n}): " + ", ".join(parts)

"""What each fact field holds, for checks that a condition can match at all.

`controller.core.facts.FIELDS` names the fields; this says their type (`number`, `text`,
`bool`) and, for numbers, the range they take: counts and ages are never negative, counts are
whole numbers, and a benchmark rate is at most 1,000 proofs an hour (the instance API refuses
more). Every field of `controller.core.facts.FIELDS` is here (a test keeps the two equal).

Pure data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Type = Literal["number", "text", "bool"]


@dataclass(frozen=True)
class FieldInfo:
    type: Type
    lo: float = -math.inf
    hi: float = math.inf
    integer: bool = False


TEXT = FieldInfo("text")
BOOL = FieldInfo("bool")
COUNT = FieldInfo("number", 0, math.inf, integer=True)
SECONDS = FieldInfo("number", 0)  # an age or a duration
RATE = FieldInfo("number", 0, 1000)  # proofs an hour
MONEY = FieldInfo("number", 0)  # dollars an hour

INFO: dict[str, dict[str, FieldInfo]] = {
    "instance": {
        **dict.fromkeys(("id", "label", "machine_id", "host_id", "status", "stage", "daemon",
                         "sidecar", "gpu_name", "status_msg"), TEXT),
        **dict.fromkeys(("drained", "host_blocked", "replacing", "retiring", "parked"), BOOL),
        **dict.fromkeys(("num_gpus", "tasks_running", "restarts_1h", "deaths_1h"), COUNT),
        **dict.fromkeys(("daemon_uptime_s", "age_s", "stage_age_s", "status_for_s",
                         "down_for_s", "idle_for_s", "command_overdue_s", "parked_for_s",
                         "starting_for_s"), SECONDS),
        "bench_rate": RATE,
        "host_rate": RATE,
        "dph": MONEY,
    },
    "demand": {
        "id": TEXT,
        "task": TEXT,
        **dict.fromkeys(("pending", "running", "max_retries", "forecast_instances"), COUNT),
        **dict.fromkeys(("oldest_pending_s", "forecast_horizon_s", "task_s"), SECONDS),
        **dict.fromkeys(("forecast_pending", "backlog_slots"), FieldInfo("number", 0)),
    },
    "fleet": {
        "id": TEXT,
        **dict.fromkeys(("instances", "active", "serving", "booting", "dead", "drained",
                         "pending_launches", "launches_1h", "pending", "running_tasks", "parked",
                         "starts_1h"), COUNT),
        "spend_per_h": MONEY,
        "hour_utc": FieldInfo("number", 0, 23, integer=True),
        "weekday_utc": FieldInfo("number", 0, 6, integer=True),
    },
    "sensor": dict.fromkeys(("id", "name", "state", "detail"), TEXT),
}  # fmt: skip


def info(kind: str, fld: str) -> FieldInfo | None:
    return INFO.get(kind, {}).get(fld)


def type_of(value: object) -> Type:
    """The field type a plain value fits (YAML booleans are not numbers)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return "text"

"""A replaced instance goes once its replacement runs, or at once when it serves nothing.

The old instance is kept while the new one boots only as capacity: one stuck in a boot stage,
frozen or with its daemon down is none, and was billed for the whole boot of its replacement.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.core.model import Instance, Observation, SensorStatus
from controller.core.reconcile import followups
from controller.store.journal import Journal

OK = (SensorStatus("provider", "ok"), SensorStatus("demand", "ok"))
NOW = 10_000.0


def inst(id: str, label: str, **kw: Any) -> Instance:
    base = dict(machine_id=f"m{id}", host_id=f"h{id}", status="running", stage="running",
                daemon="up", sidecar="up")  # fmt: skip
    return Instance(id=id, label=label, **{**base, **kw})


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    j = Journal(tmp_path / "j.db")
    j.actions.add_replacement("1", "new-1", NOW - 600, NOW + 3000, 1)  # deadline not reached
    return j


def destroys(journal: Journal, *instances: Instance) -> list[tuple[str, str]]:
    obs = Observation(NOW, tuple(instances), (), OK)
    proposals, _ = followups(journal.actions.replacements(), obs, NOW)
    return [(p.params["instance"], p.reason) for p in proposals if p.action == "destroy"]


@pytest.mark.parametrize(
    "old",
    [
        {"stage": "params"},  # stuck fetching parameters
        {"stage": "bench", "daemon": "down"},  # crash-looping in its benchmark
        {"status": "frozen", "daemon": "unknown", "sidecar": "unknown"},
        {"daemon": "down"},  # serving stage, daemon dead
    ],
)
def test_an_old_instance_that_serves_nothing_goes_at_once(
    journal: Journal, old: dict[str, Any]
) -> None:
    booting = inst("2", "new-1", status="loading", stage="loading", daemon="down")
    [(target, why)] = destroys(journal, inst("1", "old", **old), booting)
    assert target == "1" and "serves nothing while its replacement boots" in why


def test_a_serving_old_instance_stays_until_its_replacement_runs(journal: Journal) -> None:
    old = inst("1", "old", bench_rate=9.0)  # slow, but proving
    booting = inst("2", "new-1", status="loading", stage="loading", daemon="down")
    assert destroys(journal, old, booting) == []
    [(target, why)] = destroys(journal, old, inst("2", "new-1"))
    assert target == "1" and "its replacement 2 is running" in why

"""A drained instance never stalls the queue: it is not serving capacity, and it is undrained
when demand comes back before it is gone.

End to end on the fault-free example world, through the replay `fleetgate simulate` runs (the
production tick on the simulator's wire): one instance serves a first task, goes idle and is
drained to scale down, then stays (the config keeps one instance: min_instances 1, as the
scale-down delay after a launch keeps one too); a second task arrives long after. The fleet
must start it within a few ticks, on the instance it has, without renting another.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support import fact

from controller.core import guards
from controller.core.facts import fleet_fact
from controller.core.model import Decision, Instance, Observation, Proposal
from controller.core.policy import Guards
from controller.core.reconcile import serving
from controller.core.track import History
from controller.service.cli import main
from controller.service.config import load_config
from controller.sim.trace import TraceTask
from controller.tools.replay.run import RunSpec, run_fleetgate, ticks_for

ROOT = Path(__file__).resolve().parents[1]
NO_FAULTS = ROOT / "controller" / "examples" / "simulate-no-faults.yaml"

pytestmark = pytest.mark.usefixtures("restore_logging")  # `main` re-points the root logger

SECOND_AT = 3 * 3600.0  # long after the first instance went idle (600 s) and was drained
HORIZON_S = 6 * 3600.0
NOW = 100_000.0
BOUND_S = 300.0  # five ticks of 60 s: seen pending, undrained, claimed on the node's next poll


def _keep_one(tmp_path: Path) -> Path:
    """The fault-free example with one instance kept: it is drained, never destroyed."""
    path = tmp_path / "keep-one.yaml"
    path.write_text(NO_FAULTS.read_text() + "guards:\n  min_instances: 1\n")
    return path


def test_a_task_after_a_scale_down_drain_starts_on_the_drained_instance(tmp_path: Path) -> None:
    config = load_config(str(_keep_one(tmp_path)))
    tasks = [TraceTask(0.0, 600.0), TraceTask(SECOND_AT, 600.0)]
    ticks = ticks_for(HORIZON_S, config.sim.seconds_per_tick)
    run = run_fleetgate(config, RunSpec(tasks, ticks, tmp_path / "state", seed=3))
    acted = run.journal["actions"]
    # the scale-down happened: the idle instance was drained before the second task came
    assert acted.get("drain", 0) >= 1, acted
    # every task started (none still waiting at the horizon); completed ones come first, in
    # order, so the second task's wait is the second
    assert run.outcome.censored == 0 and len(run.outcome.waits) == 2, run.outcome.waits
    assert run.outcome.waits[1] <= BOUND_S, run.outcome.waits
    # on the instance the fleet had: undrained, not a second rental
    assert acted.get("undrain", 0) >= 1, acted
    assert run.journal["instance_launches"] == 1 and run.sim["instances_launched"] == 1


def test_the_simulate_command_reports_no_stall(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "two.csv"
    trace.write_text(f"queued_at,proving_s\n0,600\n{SECOND_AT:.0f},600\n")
    out = tmp_path / "report"
    argv = ["simulate", "--config", str(_keep_one(tmp_path)), "--trace", str(trace),
            "--arrival-col", "queued_at", "--service-col", "proving_s", "--gpu-col", "",
            "--days", "0.25", "--report", str(out), "--seed", "3"]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    doc = json.loads((out / "report.json").read_text())
    waits = doc["policies"]["fleetgate"]["waits_s"]
    # the first task waits for the one boot; the second must not wait for the horizon
    assert waits["count"] == 2 and waits["max"] < SECOND_AT / 2, waits
    assert doc["fleetgate"]["actions"].get("undrain", 0) >= 1


# --- the pieces: facts, serving, the guards


def _inst(id: str, **changes: object) -> Instance:
    base = Instance(id=id, label=f"fg-{id}", machine_id="m", host_id="h", status="running",
                    stage="running", daemon="up", sidecar="up")  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


def test_a_drained_instance_is_neither_active_nor_serving() -> None:
    # c boots on a host whose Curio row is still cordoned: on its way, undrained once it runs
    booting = _inst("c", drained=True, stage="params", status="running")
    obs = Observation(now=NOW, instances=(_inst("a"), _inst("b", drained=True), booting),
                      demand=(), sensors=())  # fmt: skip
    fleet = fleet_fact(obs, History(), NOW)
    assert (fleet["instances"], fleet["active"], fleet["serving"], fleet["drained"]) == (3, 2, 1, 2)
    assert serving(_inst("a")) and not serving(_inst("b", drained=True))


def _plan(*proposals: Proposal, **instances: dict[str, Any]) -> list[Decision]:
    facts = [fact("fleet", instances=1, active=0, serving=0, drained=1),
             *(fact("instance", id, **f) for id, f in instances.items())]  # fmt: skip
    by_id = {str(f["id"]): f for f in facts}
    decisions = [Decision(p, "act", "matched") for p in proposals]
    out, _ = guards.check(decisions, guards.Context(by_id, History(), Guards(), NOW))
    return out


SCALE = Proposal("scale_to", {"count": 1}, "rule:burst", "r", 0.9)
UNDRAIN = Proposal("undrain", {"instance": "i1"}, "rule:undrain", "r", 0.9)


@pytest.mark.parametrize("order", ["scale first", "undrain first"])
def test_an_undrain_counts_as_capacity_for_scale_to_in_the_same_tick(order: str) -> None:
    first, second = (SCALE, UNDRAIN) if order == "scale first" else (UNDRAIN, SCALE)
    out = {d.proposal.action: d for d in _plan(first, second, i1={"drained": True})}
    assert out["undrain"].verdict == "act"
    assert out["scale_to"].verdict == "noop" and "1 undrained" in out["scale_to"].why


def test_without_an_undrain_the_drained_instance_does_not_count() -> None:
    [d] = _plan(SCALE, i1={"drained": True})
    assert d.effective_action == "launch" and d.effective_params == {"count": 1}


def test_an_undrain_of_an_instance_not_drained_or_being_replaced_is_a_noop() -> None:
    [d, s] = _plan(UNDRAIN, SCALE, i1={"drained": False})
    assert d.verdict == "noop" and "not drained" in d.why and s.effective_action == "launch"
    [d, s] = _plan(UNDRAIN, SCALE, i1={"drained": True, "retiring": True})
    assert d.verdict == "noop" and "replaced" in d.why and s.effective_action == "launch"

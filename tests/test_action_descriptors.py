"""The action descriptors are the policy: the guards, the actuator and the LLM's tools follow
them, action by action, and nothing else lists actions."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest
from support import fact

from controller.core import guards
from controller.core.actions import ACTIONS, DESCRIPTORS, ActionName, Executor
from controller.core.model import Decision, Instance, Proposal
from controller.core.policy import Guards
from controller.core.track import History
from controller.fleet.actuator import Actuator, Job
from controller.fleet.base import LaunchRequest
from controller.store.journal import Journal
from escalation.llm_request import ESCALATE, describe, offered_actions
from escalation.situation import Situation

NOW = 100_000.0
PARAMS: dict[str, dict[str, Any]] = {
    "launch": {"count": 1}, "scale_to": {"count": 3}, "destroy": {"instance": "i1"},
    "replace": {"instance": "i1"}, "drain": {"instance": "i1"}, "undrain": {"instance": "i1"},
    "stop": {"instance": "i1"}, "start": {"instance": "i1"},
    "restart_daemon": {"instance": "i1"}, "reboot": {"instance": "i1"},
    "block_host": {"machine": "m1", "for": 60.0}, "notify": {"message": "look"},
    "escalate": {"reason": "look"}, "hold": {"reason": "wait"},
}  # fmt: skip


def test_every_action_has_one_descriptor_and_sample_params() -> None:
    assert tuple(DESCRIPTORS) == get_args(ActionName) == tuple(ACTIONS) == tuple(PARAMS)
    assert all(d.name == n and d.params is ACTIONS[n] for n, d in DESCRIPTORS.items())
    assert set(get_args(Executor)) == {d.executor for d in DESCRIPTORS.values()} - {None}


def guarded(action: str, *facts: dict[str, Any], **limits: Any) -> Decision:
    d = Decision(Proposal(action, PARAMS[action], "rule:r", "because", 0.9), "act", "matched")
    by_id = {str(f["id"]): f for f in (fact("fleet", instances=4, active=4), *facts)}
    [out], _ = guards.check([d], guards.Context(by_id, History(), Guards(**limits), NOW))
    return out


@pytest.mark.parametrize("action", list(DESCRIPTORS))
def test_the_pause_switch_holds_what_is_not_pause_exempt(action: str) -> None:
    d = guarded(action, fact("instance", "i1"), paused=True)
    assert (d.guard == "paused") is not DESCRIPTORS[action].pause_exempt


@pytest.mark.parametrize("sensor", ["provider", "demand"])
@pytest.mark.parametrize("action", list(DESCRIPTORS))
def test_a_failed_sensor_holds_what_its_descriptor_says(action: str, sensor: str) -> None:
    for state in ("failed", "stale"):
        d = guarded(action, fact("instance", "i1"), fact("sensor", name=sensor, state=state))
        assert (d.guard == "sensing") is (sensor in DESCRIPTORS[action].held_on_sensing_failure)


def situation(allowed: tuple[str, ...]) -> Situation:
    return Situation(kind="unmatched", subject="fleet", summary="s", facts=(), key={},
                     proposals=(), recent_actions=(), fleet={}, budget={},
                     allowed_actions=allowed, default_action={"action": "hold"},
                     created_at=NOW)  # fmt: skip


def test_the_llm_is_offered_exactly_the_actions_whose_descriptors_say_so() -> None:
    offered = offered_actions(situation(tuple(DESCRIPTORS)))
    assert offered == (*(n for n, d in DESCRIPTORS.items() if d.offered_to_llm), ESCALATE)
    assert "escalate" not in offered
    assert all(describe(n) == DESCRIPTORS[n].summary for n in offered if n != ESCALATE)


class Fleet:
    """A provider that keeps what was done to it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def list_instances(self) -> list[Instance]:
        return []

    def launch(self, request: LaunchRequest) -> str:
        self.calls.append(("launch", request.label))
        return f"new-{len(self.calls)}"

    def find_by_label(self, label: str) -> Instance | None:
        return None

    def destroy(self, instance_id: str) -> None:
        self.calls.append(("destroy", instance_id))

    def reboot(self, instance_id: str) -> None:
        self.calls.append(("reboot", instance_id))

    def restart_daemon(self, instance_id: str) -> None:
        self.calls.append(("restart_daemon", instance_id))

    def drain(self, instance_id: str) -> None:
        self.calls.append(("drain", instance_id))

    def undrain(self, instance_id: str) -> None:
        self.calls.append(("undrain", instance_id))

    def stop(self, instance_id: str) -> None:
        self.calls.append(("stop", instance_id))

    def start(self, instance_id: str) -> None:
        self.calls.append(("start", instance_id))


def carried_out(tmp_path: Path, action: str) -> tuple[str, list[tuple[str, str]]]:
    journal, fleet = Journal(tmp_path / f"{action}.db"), Fleet()
    p = Proposal(action, PARAMS[action], "rule:r", "because", 0.9)
    row = journal.actions.record(tick_id=1, now=NOW, action=action, target=p.target,
                                 params=p.params, proposer=p.proposer, reason=p.reason,
                                 confidence=p.confidence, verdict="act", why="w",
                                 status="intent")  # fmt: skip
    job = Job(Decision(p, "act", "w"), row, 1, History(), NOW, {"i1": fact("instance", "i1")})
    outcome = Actuator(fleet, journal, Guards()).execute(job)
    journal.close()
    return outcome.status, fleet.calls


@pytest.mark.parametrize("action", list(DESCRIPTORS))
def test_the_actuator_dispatches_on_the_descriptors_executor(tmp_path: Path, action: str) -> None:
    status, calls = carried_out(tmp_path, action)
    executor = DESCRIPTORS[action].executor
    if executor is None:  # scale_to becomes launches in the guards; escalate a doubt in decide
        assert (status, calls) == ("failed", [])
    elif executor == "provider_call":
        assert (status, calls) == ("ok", [(action, "i1")])
    elif executor in ("launch", "replace"):
        assert status == "ok" and [c[0] for c in calls] == ["launch"]
    else:
        assert (status, calls) == ("ok", [])

"""A create whose answer is lost is never repeated; capacity on its way counts; late creates
are confirmed by their label; a failed or empty listing launches nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.core import guards
from controller.core.model import Decision, Demand, Instance, Proposal
from controller.core.policy import Guards
from controller.core.track import History
from controller.fleet.actuator import Actuator, Job
from controller.fleet.base import (
    CreateOutcomeUnknown,
    LaunchRequest,
    PermanentProviderError,
    SensorError,
)
from controller.rules.source import RulesSource
from controller.service.app import decide_settings
from controller.service.config import Config
from controller.service.tick import Controller
from controller.store.journal import Journal
from escalation.notify import Notifier, ended
from escalation.render import Renderer
from escalation.router import Escalator

ROOT = Path(__file__).resolve().parent.parent


class LateFleet:
    """An in-memory provider whose creates lose their answer and appear `late` listings later."""

    def __init__(self, late: int = 3) -> None:
        self.late = late
        self.creates: list[str] = []
        self.hidden: dict[str, int] = {}  # label -> listings to stay invisible
        self.listed: dict[str, Instance] = {}
        self.fail_listing = False
        self.pending = 8

    def list_instances(self) -> list[Instance]:
        if self.fail_listing:
            raise SensorError("listing failed: 503")
        for label in list(self.hidden):
            self.hidden[label] -= 1
            if self.hidden[label] <= 0:
                del self.hidden[label]
                n = str(1000 + len(self.listed))
                self.listed[label] = Instance(n, label, f"m{n}", f"h{n}", "loading", "loading",
                                              "down", "down", dph=0.5)  # fmt: skip
        return list(self.listed.values())

    def launch(self, request: LaunchRequest) -> str:
        self.creates.append(request.label)
        self.hidden[request.label] = self.late
        raise CreateOutcomeUnknown(request.label, "connection reset after the request was sent")

    def find_by_label(self, label: str) -> Instance | None:
        return self.listed.get(label)

    def destroy(self, instance_id: str) -> None:
        self.listed = {k: v for k, v in self.listed.items() if v.id != instance_id}

    def reboot(self, instance_id: str) -> None: ...

    def restart_daemon(self, instance_id: str) -> None: ...

    def drain(self, instance_id: str) -> None: ...

    def undrain(self, instance_id: str) -> None: ...

    def demand(self) -> list[Demand]:
        return [Demand("PoRep", self.pending, 0), Demand("all", self.pending, 0)]


def controller(tmp_path: Path, fleet: LateFleet, **guards: Any
               ) -> tuple[Controller, Journal, list[float]]:  # fmt: skip
    journal = Journal(tmp_path / "j.db")
    clock = [10_000.0]
    esc = Escalator(journal, Notifier([], Renderer()), window_s=3600, deadline_s=1800)
    config = Config.model_validate({"guards": guards})
    c = Controller(journal=journal, provider=fleet, demand=fleet,
                   rules=RulesSource([ROOT / "rules"]), settings=decide_settings(config),
                   escalator=esc, clock=lambda: clock[0])  # fmt: skip
    return c, journal, clock


def run(c: Controller, clock: list[float], ticks: int) -> None:
    for _ in range(ticks):
        clock[0] += 60
        c.tick()


def test_lost_create_answers_are_never_repeated_and_late_creates_are_confirmed(
    tmp_path: Path,
) -> None:
    fleet = LateFleet(late=3)
    c, journal, clock = controller(tmp_path, fleet)
    run(c, clock, 8)
    # 8 pending tasks / 2 per instance = 4 instances wanted: exactly 4 creates, never more
    assert len(fleet.creates) == 4 and len(set(fleet.creates)) == 4
    assert len(fleet.listed) == 4
    rows = [r for r in journal.actions.recent(1000) if r["action"] == "launch" and r["parent_id"]]
    assert sorted(r["status"] for r in rows) == ["ok"] * 4
    assert all(r["result"]["confirmed_late"] for r in rows)
    # the log's line for each says what became of it ("action #4: ok " said nothing)
    assert all(r["result"]["note"] == f"instance {r['result']['instance']} listed with its "
               "label after the create's answer said nothing clear" for r in rows)  # fmt: skip


def test_a_failed_listing_launches_nothing_and_escalates_once(tmp_path: Path) -> None:
    fleet = LateFleet(late=1)
    c, journal, clock = controller(tmp_path, fleet)
    fleet.fail_listing = True
    run(c, clock, 5)
    assert fleet.creates == []
    esc = [e for e in journal.escalations.recent() if e["kind"] == "sensing_failure"]
    assert len(esc) == 1 and esc[0]["subject"] == "sensor:provider"
    vetoed = [
        r for r in journal.actions.recent(1000, executed_only=False) if r["verdict"] == "veto"
    ]
    assert vetoed and all(r["guard"] == "sensing" for r in vetoed)


def test_launches_on_their_way_count_while_the_listing_is_down(tmp_path: Path) -> None:
    fleet = LateFleet(late=50)
    c, _journal, clock = controller(tmp_path, fleet, launch_unknown_s=3600)
    run(c, clock, 1)
    assert len(fleet.creates) == 1  # an unanswered create ends this tick's launching
    run(c, clock, 5)
    assert len(fleet.creates) == 4
    fleet.fail_listing = True
    run(c, clock, 3)
    fleet.fail_listing = False
    run(c, clock, 3)
    assert len(fleet.creates) == 4  # still invisible, still counted as on their way


def test_actions_a_crashed_run_left_unfinished_are_closed_and_decided_again(
    tmp_path: Path,
) -> None:
    fleet = LateFleet(late=1)
    c, journal, clock = controller(tmp_path, fleet)
    run(c, clock, 3)
    stale = journal.actions.record(tick_id=None, now=clock[0], action="destroy",
                                   target="instance:1000", params={"instance": "1000"},
                                   proposer="rule:x", reason="r", confidence=1, verdict="act",
                                   why="w", status="intent")  # fmt: skip
    done = journal.actions.record(tick_id=None, now=clock[0], action="destroy",
                                  target="instance:999", params={"instance": "999"},
                                  proposer="rule:x", reason="r", confidence=1, verdict="act",
                                  why="w", status="intent")  # fmt: skip
    run(c, clock, 1)
    [row] = [r for r in journal.actions.recent(1000) if r["id"] == stale]
    assert row["status"] == "interrupted" and "decide again" in row["result"]["note"]
    [row] = [r for r in journal.actions.recent(1000) if r["id"] == done]  # not listed: it is gone
    assert row["status"] == "ok" and row["result"]["confirmed_by"] == "listing"
    assert journal.actions.in_flight() == []


def test_a_create_that_rented_nothing_stops_counting_once_good_listings_lack_it(
    tmp_path: Path,
) -> None:
    """A 5xx create that rented nothing counts as capacity only for `launch_unknown_s` of good
    listings; then it is lost and the tasks get an instance (before: 30 min of waiting)."""
    fleet = LateFleet(late=10_000)  # never listed: nothing was rented
    c, journal, clock = controller(tmp_path, fleet)  # launch_unknown_s: 300 by default
    run(c, clock, 1)
    assert len(fleet.creates) == 1
    run(c, clock, 4)  # 240 s after the first create: all four still counted
    assert len(fleet.creates) == 4
    run(c, clock, 1)  # 300 s: the first is lost, one more launch for its share
    assert len(fleet.creates) == 5
    lost = [
        r for r in journal.actions.recent(1000) if r["action"] == "launch" and r["status"] == "lost"
    ]
    assert [r["key"] for r in lost] == fleet.creates[:1]
    assert "never listed in 300s" in lost[0]["result"]["note"]


class Killed(BaseException):
    """The process died here (SIGKILL): nothing after this point of the tick ran."""


class KilledFleet(LateFleet):
    """Creates list at once; the process dies just after create number `kill_at` rented."""

    def __init__(self, kill_at: int) -> None:
        super().__init__(late=0)
        self.kill_at = kill_at
        self.pending = 0

    def launch(self, request: LaunchRequest) -> str:
        self.creates.append(request.label)
        n = str(1000 + len(self.listed))
        self.listed[request.label] = Instance(n, request.label, f"m{n}", f"h{n}", "loading",
                                              "loading", "down", "down", dph=0.5)  # fmt: skip
        if len(self.creates) == self.kill_at:
            raise Killed
        return n


def _approved_launch(journal: Journal, now: float, count: int) -> int:
    esc = journal.escalations.add_escalation(
        fingerprint="fp", kind="unmatched", subject="fleet", summary="more capacity?",
        now=now, deadline=now + 3600, situation={}, default_action=None)  # fmt: skip
    journal.escalations.answer(esc, status="approved", by="alice", now=now,
                               answer={"action": "launch", "params": {"count": count}})  # fmt: skip
    return esc


@pytest.mark.parametrize("kill_at", [1, 2])
def test_an_approved_launch_the_process_died_carrying_out_is_not_carried_out_again(
    tmp_path: Path, kill_at: int
) -> None:
    """A person approved `launch count=2`; the process died after one or both creates rented,
    before the escalation was marked carried out: the restarted controller rents nothing more
    (it rented them again, the approval carried out twice) and closes the escalation."""
    fleet = KilledFleet(kill_at=kill_at)
    c, journal, clock = controller(tmp_path, fleet)
    esc = _approved_launch(journal, clock[0], 2)
    clock[0] += 60
    with pytest.raises(Killed):
        c.tick()
    assert len(fleet.creates) == kill_at
    c2, journal2, _ = controller(tmp_path, fleet)  # the restarted controller, the same journal
    run(c2, clock, 3)
    assert len(fleet.creates) == kill_at
    row = journal2.escalations.escalation(esc) or {}
    assert row["status"] == "interrupted"
    assert "not carried out again" in ended(row)
    assert journal2.actions.in_flight() == []


def test_an_approved_answer_carried_out_before_a_crash_is_closed_as_executed(
    tmp_path: Path,
) -> None:
    """The action finished and was journaled, the process died before marking the escalation:
    the next tick marks it carried out with that action, and does not act again."""
    fleet = KilledFleet(kill_at=0)
    c, journal, clock = controller(tmp_path, fleet)
    esc = _approved_launch(journal, clock[0], 1)
    run(c, clock, 1)
    assert len(fleet.creates) == 1
    journal.escalations.set_escalation_status(esc, "approved")  # as a run killed before it left it
    run(c, clock, 2)
    assert len(fleet.creates) == 1
    row = journal.escalations.escalation(esc) or {}
    [act] = [r for r in journal.actions.actions_for_escalation(esc) if r["parent_id"] is None]
    assert (row["status"], row["executed_action_id"]) == ("executed", act["id"])


def _replace_job(journal: Journal, now: float, old: str) -> Job:
    p = Proposal("replace", {"instance": old}, "rule:r", "stuck", 0.9)
    row = journal.actions.record(tick_id=1, now=now, action="replace", target=p.target,
                                 params=p.params, proposer=p.proposer, reason=p.reason,
                                 confidence=0.9, verdict="act", why="w",
                                 status="intent")  # fmt: skip
    return Job(Decision(p, "act", "matched"), row, 1, History(), now, {})


def test_a_replacement_the_process_died_renting_is_still_the_one_under_way(
    tmp_path: Path,
) -> None:
    """The replacement's create rented and the process died before the replacement was
    recorded: the old instance was not `retiring` after the restart, so it was replaced again
    (a third rental), and the first replacement never made it go. Recorded before the create,
    the replacement is under way: a second replace finds nothing to do, and the old instance
    goes once the new one runs."""
    journal = Journal(tmp_path / "j.db")
    fleet = KilledFleet(kill_at=1)
    with pytest.raises(Killed):
        Actuator(fleet, journal, Guards()).execute(_replace_job(journal, 10_000.0, "7"))
    [new] = fleet.creates
    [rep] = journal.actions.replacements()
    assert (rep["old_id"], rep["new_label"], rep["state"]) == ("7", new, "waiting")
    hist = journal.fleet.history(10_060.0)
    assert "7" in hist.retiring
    ctx = guards.Context({"7": {"kind": "instance", "id": "7", "retiring": True},
                          "fleet": {"kind": "fleet", "id": "fleet"}}, hist, Guards(),
                         10_060.0)  # fmt: skip
    p = Proposal("replace", {"instance": "7"}, "rule:r", "stuck", 0.9)
    [again], _ = guards.check([Decision(p, "act", "matched")], ctx)
    assert again.verdict == "noop" and "already under way" in again.why
    journal.close()


def test_a_replacement_whose_create_was_refused_is_not_under_way(tmp_path: Path) -> None:
    """A create vast refused rented nothing: the old instance is not left `retiring`."""
    journal = Journal(tmp_path / "j.db")
    fleet = RefusingFleet()
    out = Actuator(fleet, journal, Guards()).execute(_replace_job(journal, 10_000.0, "7"))
    assert out.status == "failed"
    assert journal.actions.replacements() == []
    assert "7" not in journal.fleet.history(10_060.0).retiring
    journal.close()


class RefusingFleet(LateFleet):
    def launch(self, request: LaunchRequest) -> str:
        self.creates.append(request.label)
        raise PermanentProviderError("vast refused: no_such_ask")

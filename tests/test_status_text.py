"""`fleetgate status`, the facts `explain` shows and `escalations show`: each said plainly."""

from __future__ import annotations

from typing import Any

from controller.service.status import status_lines


def doc(summary: dict[str, Any] | None, **over: Any) -> dict[str, Any]:
    st: dict[str, Any] = {
        "provider": "vast", "rules": "abc123", "paused": False,
        "last_tick": None if summary is None else {"id": 12, "started_at": 0.0,
                                                   "summary": summary},
        "instances": 3, "by_stage": {"running": 2, "params": 1}, "spend_per_h": 1.5,
        "demand": {"all": {"pending": (summary or {}).get("pending"),
                           "running": (summary or {}).get("running_tasks")}},
        "foreign": (summary or {}).get("foreign", []), "pending_escalations": 1,
        "leader": {"live": True, "holder": "vm:1", "token": 4, "expires_in_s": 41.6},
    }  # fmt: skip
    return st | over


def queue(task: str, pending: int, running: int, ahead: float | None = None) -> dict[str, Any]:
    q: dict[str, Any] = {"task": task, "pending": pending, "running": running,
                         "oldest_pending_s": 0.0}  # fmt: skip
    if ahead is not None:
        q |= {"forecast_pending": ahead, "forecast_horizon_s": 1740.0}
    return q


def test_a_tick_that_acted_says_what_became_of_its_decisions_and_its_sensors() -> None:
    summary = {"act": 2, "veto": 1, "doubts": 1, "escalated": 1, "instances": 3, "pending": 5,
               "running_tasks": 3, "spend_per_h": 1.5,
               "sensors": {"provider": "ok", "demand": "stale"},
               "demand": [queue("PoRep", 4, 2, 5.5), queue("WinPost", 0, 0, 0.04),
                          queue("all", 5, 3, 7.25), queue("WdPost", 1, 1, 1.75)],
               "foreign": [{"id": "777", "label": "", "status": "stopped"}]}  # fmt: skip
    lines = status_lines(doc(summary))
    assert lines[1] == ("last tick #12 at 1970-01-01 00:00:00: decisions 2 acted on, 1 vetoed; "
                        "1 doubts, 1 escalated; sensors demand stale, provider ok")  # fmt: skip
    assert lines[2] == "instances 3 (params 1, running 2), spend $1.5/h"
    # the total first, then each task with anything queued or expected (WinPost: 0.04 shows as 0)
    assert lines[3] == ("demand, pending/running (forecast of the two together in 29 min): "
                        "all 5/3 (7.2), PoRep 4/2 (5.5), WdPost 1/1 (1.8)")  # fmt: skip
    assert lines[4] == "not fleetgate's (left alone): 777 (no label, stopped)"
    assert lines[5:] == ["pending escalations: 1", "leader: vm:1 (token 4, lease 42 s left)"]


def test_a_held_tick_says_why_it_acted_on_nothing() -> None:
    summary = {"held": "the clock jumped 3600 s ahead", "escalated": 1, "instances": 3,
               "pending": 0}  # fmt: skip
    lines = status_lines(doc(summary))
    assert lines[1].endswith(": held, acting on nothing: the clock jumped 3600 s ahead "
                             "(1 escalated)")  # fmt: skip
    assert lines[3] == "demand: all 0 pending/- running"  # a held tick counts no running task


def test_a_quiet_tick_and_a_journal_with_no_tick_yet() -> None:
    quiet = status_lines(doc({"doubts": 0, "escalated": 0, "pending": 0, "running_tasks": 0,
                              "demand": [queue("all", 0, 0)]}))  # fmt: skip
    assert quiet[1].endswith(": decisions none; 0 doubts, 0 escalated")
    assert quiet[3] == "demand, pending/running: all 0/0"
    fresh = status_lines(
        doc(
            None,
            spend_per_h=None,
            instances=0,
            by_stage={},
            leader={"live": False, "holder": None, "token": None},
        )
    )
    assert fresh[1] == "instances 0 (none), spend -"
    assert fresh[2] == "demand: not read yet"
    assert fresh[-1] == "leader: none"


def test_explain_shows_only_fields_rules_can_name() -> None:
    from controller.core.facts import FIELDS
    from controller.service.commands import EXPLAIN_FIELDS

    assert set(EXPLAIN_FIELDS) == set(FIELDS)
    for kind, names in EXPLAIN_FIELDS.items():
        assert set(names) <= FIELDS[kind], (kind, set(names) - FIELDS[kind])


def escalation(status: str, answer: Any, by: str | None = "operator") -> dict[str, Any]:
    return {
        "id": 7, "status": status, "kind": "unmatched", "subject": "instance:10004",
        "summary": "instance 10004 is outside the declared steady state", "created_at": 0.0,
        "deadline": 1800.0, "answered_by": by, "answered_at": 600.0, "answer": answer,
        "default_action": {"action": "hold", "params": {"reason": "no answer"}},
        "deliveries": [], "llm_calls": [], "actions": [], "outbox": [],
    }  # fmt: skip


def test_escalations_show_says_the_default_and_the_answer_as_actions() -> None:
    from controller.service.offline import render_escalation

    def lines(esc: dict[str, Any]) -> list[str]:
        return render_escalation(esc, lambda t: "-" if t is None else f"t{t:g}")

    approved = {"action": "replace", "params": {"instance": "10004", "block_host": True},
                "override": ["max_launches_per_hour"]}  # fmt: skip
    first = lines(escalation("approved", approved))
    assert first[2] == "  raised t0, deadline t1800, default hold reason=no answer"
    assert first[3] == ("  answered by operator at t600: replace instance=10004 block_host=True "
                        "(overriding max_launches_per_hour)")  # fmt: skip
    note = {"note": "the situation no longer holds"}
    resolved = lines(escalation("resolved", note, "controller"))
    assert resolved[3] == "  answered by controller at t600: the situation no longer holds"
    assert lines(escalation("denied", None))[3] == "  answered by operator at t600: denied"
    expired = lines(escalation("expired", None, "deadline"))
    assert expired[3] == ("  answered by deadline at t600: none before the deadline (the default "
                          "action applies)")  # fmt: skip
    assert not any("{'" in line for line in first + resolved + expired)
    assert len(lines(escalation("pending", None, None))) == 4  # no answer line yet


def test_launches_on_their_way_are_said_beside_the_instances() -> None:
    lines = status_lines(doc({"pending": 4}, instances=0, by_stage={}, pending_launches=2))
    assert lines[2] == "instances 0 (none; 2 rented, not listed yet), spend $1.5/h"


def test_spend_is_said_as_dollars_not_as_a_floats_digits() -> None:
    # a sum of prices: 0.1 + 0.31 is 0.41000000000000003
    lines = status_lines(doc({"pending": 0}, spend_per_h=0.1 + 0.31))
    assert lines[2].endswith("spend $0.41/h"), lines[2]

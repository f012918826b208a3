"""Answers are scoped: a real API on loopback over the real journal.

A button's capability gives one answer to one escalation of one journal, until its deadline;
who answered comes from the credential; Approve runs the proposal the message showed; an LLM
answer about another instance or host is refused; a bad answer is a 4xx with a sentence."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from pydantic import SecretStr
from support import served

from controller.service.api import create_app
from controller.store.journal import Journal
from escalation import approvals
from escalation.capabilities import answer_capability
from escalation.notify import Notifier
from escalation.render import Renderer
from escalation.router import Escalator
from escalation.situation import from_dict

TOKEN = SecretStr("operator-token-for-answers")
NOW = 500.0
FACTS = [{"id": "10001", "machine_id": "m-1", "status": "frozen"}]
DESTROY = {"action": "destroy", "params": {"instance": "10001"}, "proposer": "rule:r",
           "confidence": 0.5, "reason": "frozen"}  # fmt: skip
ALLOWED = ["hold", "notify", "reboot", "destroy", "drain", "replace", "block_host", "launch"]


HOLD = {"action": "hold", "params": {}}
DEADLINE = 4_000_000_000.0  # the CLI answers on the simulator's clock (its virtual 2025)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[str, Journal]]:
    journal = Journal(tmp_path / "j.db")
    with served(create_app(journal, TOKEN, clock=lambda: NOW), journal) as base:
        yield base, journal


def escalate(j: Journal, proposals: list[dict[str, Any]] | None = None) -> int:
    situation = {
        "kind": "unmatched",
        "subject": "instance:10001",
        "summary": "frozen",
        "facts": FACTS,
        "key": {},
        "proposals": proposals or [DESTROY],
        "recent_actions": [],
        "fleet": {},
        "budget": {},
        "allowed_actions": ALLOWED,
        "default_action": {"action": "hold", "params": {}},
        "created_at": 100.0,
    }
    return j.escalations.add_escalation(fingerprint="fp", kind="unmatched",
                                        subject="instance:10001", summary="frozen", now=100.0,
                                        deadline=2000.0, situation=situation,
                                        default_action=HOLD)  # fmt: skip


def button(j: Journal, esc: int, choice: str = "approve") -> str:
    return answer_capability(TOKEN, esc, journal_id=j.meta.identity(), choice=choice,
                             expires=2000.0)  # fmt: skip


def post(base: str, esc: int, body: dict[str, Any], bearer: str) -> requests.Response:
    return requests.post(f"{base}/v1/escalations/{esc}/answer", json=body, timeout=10,
                         headers={"Authorization": f"Bearer {bearer}"})  # fmt: skip


def test_a_button_carries_no_action_no_overrides_and_no_name(api: tuple[str, Journal]) -> None:
    base, j = api
    esc = escalate(j)
    forged = {"decision": "approve", "action": "launch", "params": {"count": 40}, "by": "alice",
              "override": ["max_instances", "launches_per_hour", "spend_per_hour",
                           "destroys_per_hour"]}  # fmt: skip
    r = post(base, esc, forged, button(j, esc))
    assert r.status_code == 403 and "operator's token" in r.json()["detail"]
    assert j.escalations.escalation(esc)["status"] == "pending"
    assert approvals.approved_proposals(j) == []
    # the plain button press approves what it was made for, recorded as the button
    ok = post(base, esc, {"decision": "approve", "by": "alice"}, button(j, esc))
    assert ok.status_code == 200 and ok.json()["by"] == "button"
    [p] = approvals.approved_proposals(j)
    assert (p.action, p.params["instance"], p.proposer, p.overrides) == (
        "destroy",
        "10001",
        "human:button",
        (),
    )


def test_a_deny_button_cannot_approve(api: tuple[str, Journal]) -> None:
    base, j = api
    esc = escalate(j)
    r = post(base, esc, {"decision": "approve"}, button(j, esc, "deny"))
    assert r.status_code == 403 and j.escalations.escalation(esc)["status"] == "pending"


def test_an_old_button_does_not_answer_another_journals_escalation(
    api: tuple[str, Journal], tmp_path: Path
) -> None:
    base, j = api
    esc = escalate(j)
    old = Journal(tmp_path / "old.db")  # an earlier journal: the same escalation id
    assert escalate(old) == esc
    stale = button(old, esc)
    old.close()
    assert post(base, esc, {"decision": "approve"}, stale).status_code == 401
    assert j.escalations.escalation(esc)["status"] == "pending"


def test_an_expired_button_is_refused(api: tuple[str, Journal]) -> None:
    base, j = api
    esc = escalate(j)
    gone = answer_capability(TOKEN, esc, journal_id=j.meta.identity(), choice="approve",
                             expires=NOW - 1)  # fmt: skip
    r = post(base, esc, {"decision": "approve"}, gone)
    assert r.status_code == 403 and "expired" in r.json()["detail"]


def test_approve_runs_the_proposal_the_message_showed(api: tuple[str, Journal]) -> None:
    base, j = api
    esc = escalate(j)
    e = Escalator(j, Notifier([], Renderer()), window_s=60, deadline_s=1900)
    s = from_dict(j.escalations.escalation(esc)["situation"])
    reboot = {"action": "reboot", "params": {"instance": "10001"}, "proposer": "llm:m",
              "confidence": 0.6, "reason": "stuck"}  # fmt: skip
    routed = SimpleNamespace(proposal=reboot, why="unsure")
    shown = Escalator.shown(s, routed)  # type: ignore[arg-type]
    e.deliver(esc, shown, "fp", 100.0, NOW, "unsure", [])
    text = Renderer().render("message.txt.j2", esc=dict(shown.__dict__, id=esc, fingerprint="fp",
                             created_at_iso="x", deadline_iso="y", facts=list(shown.facts),
                             proposals=list(shown.proposals)), how=e.how(esc))  # fmt: skip
    assert "1. reboot" in text
    assert post(base, esc, {"decision": "approve"}, button(j, esc)).status_code == 200
    [p] = approvals.approved_proposals(j)
    assert (p.action, p.params["instance"]) == ("reboot", "10001")


class _Reader:
    model = "m"

    def __init__(self, action: str, params: dict[str, Any]) -> None:
        self.answer = SimpleNamespace(action=action, params=params, confidence=0.99,
                                      rationale="sure", prompt_digest="d", tokens=1,
                                      latency_s=0.0)  # fmt: skip

    def decide(self, _s: Any, _targets: Any) -> Any:
        return self.answer


@pytest.mark.parametrize("action,params", [
    ("drain", {"instance": "10004"}),
    ("block_host", {"machine": "m-9", "reason": "", "for_s": 3600}),
])  # fmt: skip
def test_an_llm_answer_about_another_instance_or_host_is_refused(
    api: tuple[str, Journal], action: str, params: dict[str, Any]
) -> None:
    _base, j = api
    esc = escalate(j)
    e = Escalator(j, Notifier([], Renderer()), window_s=60, deadline_s=1900,
                  reader=_Reader(action, params))  # fmt: skip
    s = from_dict(j.escalations.escalation(esc)["situation"])
    routed = e.read(esc, s, ["10001", "10004", "m-1", "m-9"], NOW)
    assert not routed.acted and "refused" in routed.why
    [call] = j.llm.llm_calls(esc)
    assert call["status"] == "refused"  # journaled, not acted
    assert j.escalations.escalation(esc)["status"] == "pending"


@pytest.mark.parametrize("action", ["hold", "notify"])
def test_an_llm_hold_or_notify_leaves_it_open_for_people(
    api: tuple[str, Journal], action: str
) -> None:
    _base, j = api
    esc = escalate(j)
    params = {"message": "look at 10001"} if action == "notify" else {"reason": "wait"}
    e = Escalator(j, Notifier([], Renderer()), window_s=60, deadline_s=1900,
                  reader=_Reader(action, params))  # fmt: skip
    routed = e.read(esc, from_dict(j.escalations.escalation(esc)["situation"]), [], NOW)
    assert not routed.acted and "does not resolve" in routed.why


@pytest.mark.parametrize("action,params,said", [
    ("hold", {"reason": "wait for the host to come back"}, "wait for the host to come back"),
    ("notify", {"message": "look at 10001"}, "look at 10001"),
])  # fmt: skip
def test_an_llm_hold_or_notify_is_not_what_a_bare_approve_runs(
    api: tuple[str, Journal], action: str, params: dict[str, Any], said: str
) -> None:
    """The LLM's hold or notify is told in "Why you", not shown as the proposal: the bare
    approve (the Approve button) ran it, closing the escalation with the situation as it was,
    instead of the rule's proposal (here, none: the approve names an action)."""
    _base, j = api
    esc = escalate(j)
    e = Escalator(j, Notifier([], Renderer()), window_s=60, deadline_s=1900,
                  reader=_Reader(action, params))  # fmt: skip
    s = from_dict(j.escalations.escalation(esc)["situation"])
    routed = e.read(esc, s, [], NOW)
    assert said in routed.why and e.shown(s, routed).proposals == s.proposals
    bare = replace(s, proposals=())
    assert e.shown(bare, e.read(esc, bare, [], NOW)).proposals == ()


def test_operator_answers_are_bounded_and_bad_ones_are_4xx(api: tuple[str, Journal]) -> None:
    base, j = api
    esc = escalate(j)
    op = TOKEN.get_secret_value()
    unknown = post(base, esc, {"decision": "approve", "action": "format_disk"}, op)
    assert unknown.status_code == 422 and "not offered" in unknown.json()["detail"]
    other = post(base, esc, {"decision": "approve", "action": "reboot",
                             "params": {"instance": "10004"}}, op)  # fmt: skip
    assert other.status_code == 422 and "10004" in other.json()["detail"]
    host = post(base, esc, {"decision": "approve", "action": "block_host",
                            "params": {"machine": "m-9"}}, op)  # fmt: skip
    assert host.status_code == 422
    big = post(base, esc, {"decision": "approve", "action": "launch",
                           "params": {"count": 100000}}, op)  # fmt: skip
    assert big.status_code == 422
    assert j.escalations.escalation(esc)["status"] == "pending"
    ok = post(base, esc, {"decision": "approve", "action": "reboot", "by": "alice"}, op)
    assert ok.status_code == 200 and j.escalations.escalation(esc)["answered_by"] == "operator"


def escalate_about(j: Journal, subject: str, proposals: list[dict[str, Any]],
                   allowed: list[str]) -> int:  # fmt: skip
    situation = {"kind": "guard_veto" if subject == "fleet" else "low_confidence",
                 "subject": subject, "summary": "s", "facts": [], "key": {},
                 "proposals": proposals, "recent_actions": [], "fleet": {}, "budget": {},
                 "allowed_actions": allowed, "default_action": HOLD,
                 "created_at": 100.0}  # fmt: skip
    return j.escalations.add_escalation(fingerprint=subject, kind=situation["kind"],
                                        subject=subject, summary="s", now=100.0,
                                        deadline=DEADLINE, situation=situation,
                                        default_action=HOLD)  # fmt: skip


BLOCK = {"action": "block_host", "params": {"machine": "1026", "reason": "slow"},
         "proposer": "rule:r", "confidence": 0.5, "reason": "slow"}  # fmt: skip
REPLACE = {"action": "replace", "params": {"instance": "10001"}, "proposer": "rule:r",
           "confidence": 0.9, "reason": "stuck"}  # fmt: skip


@pytest.mark.parametrize(
    ("subject", "proposal", "allowed", "off", "on"),
    [
        # a host's escalation answers for that host, not another one
        ("machine:1026", BLOCK, ["hold", "notify", "block_host"],
         ("block_host", {"machine": "1099", "reason": "x"}),
         ("block_host", {"machine": "1026", "reason": "x"})),
        # a fleet escalation (a launch the guards refused) offers the instance its proposal named
        ("fleet", REPLACE, ["hold", "notify", "replace", "launch", "scale_to"],
         ("replace", {"instance": "10004"}), ("replace", {"instance": "10001"})),
    ],
)  # fmt: skip
def test_an_answer_names_only_what_its_escalation_offered(
    api: tuple[str, Journal], subject: str, proposal: dict[str, Any], allowed: list[str],
    off: tuple[str, dict[str, Any]], on: tuple[str, dict[str, Any]],
) -> None:  # fmt: skip
    base, j = api
    esc = escalate_about(j, subject, [proposal], allowed)
    op = TOKEN.get_secret_value()
    refused = post(base, esc, {"decision": "approve", "action": off[0], "params": off[1]}, op)
    assert refused.status_code == 422, refused.text
    named = off[1].get("machine") or off[1].get("instance")
    assert f"names {'host' if 'machine' in off[1] else 'instance'} {named}, which the " \
           f"escalation about {subject.replace('machine:', 'host ')} did not offer" \
           in refused.json()["detail"]  # fmt: skip
    assert j.escalations.escalation(esc)["status"] == "pending"
    took = post(base, esc, {"decision": "approve", "action": on[0], "params": on[1]}, op)
    assert took.status_code == 200, took.text
    given = j.escalations.escalation(esc)["answer"]["params"]
    assert {k: given[k] for k in on[1]} == on[1]


def test_an_llm_answer_names_only_what_a_host_escalation_offered(
    api: tuple[str, Journal],
) -> None:
    _base, j = api
    esc = escalate_about(j, "machine:1026", [BLOCK], ["hold", "notify", "block_host"])
    e = Escalator(j, Notifier([], Renderer()), window_s=60, deadline_s=1900,
                  reader=_Reader("block_host", {"machine": "1099", "reason": "x"}))  # fmt: skip
    s = from_dict(j.escalations.escalation(esc)["situation"])
    routed = e.read(esc, s, ["1026", "1099"], NOW)
    assert not routed.acted and "which the escalation about host 1026 did not offer" in routed.why
    assert j.llm.llm_calls(esc)[0]["status"] == "refused"


SCALE = {"action": "scale_to", "params": {"count": 3}, "proposer": "rule:r", "confidence": 0.5,
         "reason": "queue"}  # fmt: skip


def test_params_without_an_action_change_the_shown_proposal_as_typed(tmp_path: Path) -> None:
    """`fleetgate escalations approve 1 --param count=1` approves the proposal the message
    showed with count 1: the parameter was dropped before, and scale_to count=3 approved."""
    from test_cli_ops import fg

    j = Journal(tmp_path / "state" / "journal.db")
    try:
        esc = escalate_about(j, "fleet", [SCALE], ["hold", "notify", "launch", "scale_to"])
    finally:
        j.close()
    out = fg("--state", str(tmp_path / "state"), "escalations", "approve", str(esc),
             "--param", "count=1", "--by", "ops")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"escalation #{esc} approved by ops: scale_to count=1 ")
    j = Journal(tmp_path / "state" / "journal.db")
    try:
        assert j.escalations.escalation(esc)["answer"] == {"action": "scale_to",
                                                           "params": {"count": 1}}  # fmt: skip
    finally:
        j.close()


def test_an_escalation_past_its_deadline_takes_no_answer_before_a_tick_expires_it(
    api: tuple[str, Journal],
) -> None:
    """The button refused after the deadline; the API, the dashboard and the CLI approved."""
    base, j = api
    late = j.escalations.add_escalation(fingerprint="late", kind="unmatched",
                                        subject="instance:10001", summary="frozen", now=100.0,
                                        deadline=NOW - 1, situation=j.escalations.escalation(
                                            escalate(j))["situation"],
                                        default_action=HOLD)  # fmt: skip
    op = TOKEN.get_secret_value()
    for decision in ("approve", "deny"):
        refused = post(base, late, {"decision": decision}, op)
        assert refused.status_code == 422 and "passed its deadline" in refused.json()["detail"]
    assert j.escalations.escalation(late)["status"] == "pending"  # the tick expires it
    with pytest.raises(approvals.ApprovalError, match="passed its deadline"):
        approvals.approve(j, late, by="ops", now=NOW, action="hold")


def test_parameters_given_with_an_action_keep_the_subject_as_its_target(tmp_path: Path) -> None:
    """`approve ID --action replace --param block_host=true` on an instance's escalation
    replaces that instance and blocks its host (it was refused: "instance: Field required",
    the subject filled in only when no parameter was given); a named target still wins."""
    j = Journal(tmp_path / "j.db")
    try:
        esc = escalate(j)
        answer = approvals.approve(j, esc, by="ana", now=NOW, action="replace",
                                   params={"block_host": True})  # fmt: skip
        assert answer["params"]["instance"] == "10001" and answer["params"]["block_host"] is True
        other = escalate(j)
        with pytest.raises(approvals.ApprovalError, match="names instance 10002"):
            approvals.approve(j, other, by="ana", now=NOW, action="replace",
                              params={"instance": "10002", "block_host": True})  # fmt: skip
    finally:
        j.close()


def test_block_host_on_an_instances_escalation_blocks_its_host(tmp_path: Path) -> None:
    """`approve ID --action block_host`, an action the message offers on an instance whose
    host is known, blocks that host (it was refused: "machine: Field required")."""
    j = Journal(tmp_path / "j.db")
    try:
        answer = approvals.approve(j, escalate(j), by="ana", now=NOW, action="block_host")
        assert answer["params"]["machine"] == "m-1"
        answer = approvals.approve(j, escalate(j), by="ana", now=NOW, action="block_host",
                                   params={"for": 3600})  # fmt: skip
        assert (answer["params"]["machine"], answer["params"]["for"]) == ("m-1", 3600)
    finally:
        j.close()

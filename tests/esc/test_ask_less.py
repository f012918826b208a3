"""Ask less, better: a situation is asked again only when it changed, or once more when the
answer left it as it was; the LLM is offered only the actions of the situation's subject; and
`fleetgate simulate` counts escalations, LLM calls and messages to people per situation.

The LLM is the fake OpenAI-compatible server on loopback (tests/fakes/openai_server.py).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from fakes.openai_server import FakeOpenAI, ToolCall
from support import rules_leaving_frozen_to_people

from controller.core.decide import Doubt, unmatched
from controller.core.matches import Match
from controller.core.model import Proposal
from controller.rules.source import shipped_rules
from controller.service.cli import main
from controller.service.status import status_doc, status_lines
from controller.store.journal import Journal
from escalation.llm import LLMClient, LLMInvalidAnswer, LLMSettings, MemoryUsage
from escalation.llm_request import ESCALATE, offered_actions
from escalation.notify import Notifier
from escalation.outbox import Outbox
from escalation.render import Renderer
from escalation.router import STANDING, Escalator, allowed_actions, ask_key, reask

WINDOW, DEADLINE = 3600.0, 1800.0
T0 = 1_767_225_600.0
SLICE = Path(__file__).resolve().parents[1] / "data" / "simulate_slice.csv"

pytestmark = pytest.mark.usefixtures("restore_logging")  # `main` re-points the root logger


def frozen(ident: str = "10007", stage: str = "running") -> dict[str, Any]:
    return {"kind": "instance", "id": ident, "machine_id": "m1", "status": "frozen",
            "stage": stage, "daemon": "down", "sidecar": "down", "tasks_running": 0}  # fmt: skip


def doubt_of(fact: dict[str, Any]) -> Doubt:
    [d] = unmatched([Match("abnormal:instance", {"i": str(fact["id"])})], {str(fact["id"]): fact})
    return d


def row(status: str, kind: str = "unmatched", at: float = 0.0, n: int = 1) -> dict[str, Any]:
    return {"id": n, "status": status, "kind": kind, "created_at": at,
            "default_action": json.dumps({"action": "hold", "params": {}})}  # fmt: skip


# ---- the re-ask rule, pure ------------------------------------------------------------------


def test_a_situation_never_raised_is_asked() -> None:
    r = reask(None, "unmatched", None, T0, WINDOW)
    assert r.ask and r.fresh


@pytest.mark.parametrize("status", ["pending", "approved"])
def test_one_waiting_for_its_answer_is_not_asked_again_however_long(status: str) -> None:
    r = reask(row(status), "unmatched", 1, 100 * WINDOW, WINDOW)
    assert not r.ask and "#1" in r.why


def test_an_expired_default_that_left_it_is_asked_once_more_after_the_window() -> None:
    assert not reask(row("expired"), "unmatched", 1, WINDOW - 1, WINDOW).ask
    again = reask(row("expired"), "unmatched", 1, WINDOW, WINDOW)
    assert again.ask and not again.fresh
    assert "expired" in again.why and "default (hold) did not resolve it" in again.why


@pytest.mark.parametrize("status", ["expired", "denied", "executed", "failed"])
def test_after_two_asks_it_is_quiet_until_it_changes(status: str) -> None:
    for later in (WINDOW, 10 * WINDOW, 1000 * WINDOW):
        r = reask(row(status), "unmatched", 2, later, WINDOW)
        assert not r.ask and "asked 2 times since it last changed" in r.why


@pytest.mark.parametrize("asks", [None, 1, 2, 5])
def test_one_that_cleared_and_came_back_is_new(asks: int | None) -> None:
    r = reask(row("resolved"), "unmatched", asks, 60.0, WINDOW)
    assert r.ask and r.fresh
    # no longer counted as standing (it cleared while its escalation was already closed)
    r = reask(row("expired"), "unmatched", None, 60.0, WINDOW)
    assert r.ask and r.fresh and "came back" in r.why


def test_a_new_request_after_the_approved_action_ran_is_new() -> None:
    r = reask(row("executed"), "approval", 2, 60.0, WINDOW)
    assert r.ask and r.fresh
    assert not reask(row("denied"), "approval", 2, 10 * WINDOW, WINDOW).ask


# ---- the re-ask rule in the router, with the LLM on loopback ------------------------------


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "j.db")
    yield j
    j.close()


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(default="escalate") as server:
        yield server


@pytest.fixture
def reader(fake: FakeOpenAI) -> Iterator[LLMClient]:
    http = requests.Session()
    http.trust_env = False
    settings = LLMSettings(base_url=fake.url, model="fake-model", timeout_s=5, retries=0)
    with http:
        yield LLMClient(settings, Renderer(), MemoryUsage(), http, clock=lambda: T0)


class Ticks:
    """Raise, work the outbox, close what cleared: what a tick does with its doubts."""

    def __init__(self, journal: Journal, reader: LLMClient) -> None:
        self.journal = journal
        self.esc = Escalator(journal, Notifier([], Renderer()), window_s=WINDOW,
                             deadline_s=DEADLINE, reader=reader)  # fmt: skip
        self.outbox = Outbox(self.esc)

    def __call__(self, now: float, *doubts: Doubt) -> list[int]:
        raised = self.esc.raise_all(doubts, {}, {}, now, targets={"10007", "10008", "m1"})
        self.outbox.work(now)
        self.esc.resolve_cleared(doubts, {}, now)
        return raised

    def expire(self, esc_id: int, now: float) -> None:
        assert self.journal.escalations.answer(esc_id, status="expired", by="deadline", now=now,
                                               answer=None)  # fmt: skip

    def outcome(self, esc_id: int) -> str:
        [job] = [j for j in self.esc.jobs.jobs(esc_id) if j["kind"] == "read_and_deliver"]
        return str(job["outcome"])


def test_status_names_a_situation_that_still_holds_when_no_escalation_is_pending(
    journal: Journal, reader: LLMClient
) -> None:
    def status(now: float) -> list[str]:
        st = status_doc(journal, now=now, provider="sim", paused=False, rules="r", ttl_s=60,
                        sim=None)  # fmt: skip
        return [line for line in status_lines(st) if "escalation" in line or "still" in line]

    tick = Ticks(journal, reader)
    d = doubt_of(frozen())
    tick(T0, d)
    assert status(T0 + 60) == ["pending escalations: 1"]  # waiting on people: pending says so
    tick.expire(1, T0 + DEADLINE)
    tick(T0 + DEADLINE + 60, d)  # the default left it frozen; the window keeps it quiet
    assert status(T0 + DEADLINE + 60) == [
        "pending escalations: 0",
        "still holds, not asked now: instance:10007 (asked 1 time since 2026-01-01 00:00:00: "
        "escalation #1 expired and its default (hold) did not resolve it; the dedup window "
        "(3600 s) has not passed)",
    ]
    tick(T0 + DEADLINE + 120)  # it cleared: nothing stands
    assert status(T0 + DEADLINE + 120) == ["pending escalations: 0"]


def test_an_unanswered_situation_is_asked_twice_then_not_until_it_changes(
    journal: Journal, reader: LLMClient, fake: FakeOpenAI
) -> None:
    tick = Ticks(journal, reader)
    d = doubt_of(frozen())
    assert tick(T0, d) == [1]
    assert len(fake.chat_bodies) == 1 and tick.outcome(1).startswith("delivered")
    assert journal.meta.get(ask_key(1)) == {"ask": 1, "why": "first seen"}
    for t in range(60, int(DEADLINE), 60):  # waiting on people: never again
        assert tick(T0 + t, d) == []
    tick.expire(1, T0 + DEADLINE)  # the default, hold, leaves the instance frozen
    for t in range(int(DEADLINE), int(WINDOW), 60):
        assert tick(T0 + t, d) == []
    assert tick(T0 + WINDOW, d) == [2]  # once more: to people, the LLM is not asked again
    assert len(fake.chat_bodies) == 1 and tick.outcome(2).startswith("delivered")
    again = journal.meta.get(ask_key(2))
    assert again["ask"] == 2 and "#1 expired" in again["why"]
    routed = next(j for j in tick.esc.jobs.jobs(2) if j["kind"] == "read_and_deliver")["routed"]
    assert routed["acted"] is False and "asked once more" in routed["why"]
    tick.expire(2, T0 + WINDOW + DEADLINE)
    for t in range(int(WINDOW) + 60, int(30 * WINDOW), 600):  # a day and more: quiet
        assert tick(T0 + t, d) == []
    [fp] = journal.meta.get(STANDING)
    assert "asked 2 times since it last changed" in journal.meta.get(STANDING)[fp]["why"]
    assert [e["id"] for e in journal.escalations.recent()] == [1, 2]

    # its key facts change (another stage): a new situation, asked at once, the LLM first
    moved = doubt_of(frozen(stage="params"))
    now = T0 + 30 * WINDOW
    assert tick(now, moved) == [3] and len(fake.chat_bodies) == 2
    # the first one cleared meanwhile; when it comes back it is new again
    assert tick(now + 60, d) == [4] and len(fake.chat_bodies) == 3
    back = journal.meta.get(ask_key(4))
    assert back["ask"] == 1 and "#2" in back["why"] and "came back" in back["why"]


def test_health_probes_of_an_instance_that_does_not_run_are_not_a_change() -> None:
    # a frozen container's heartbeats go stale one after the other: the same situation
    keys = {json.dumps(doubt_of({**frozen(), "daemon": d, "sidecar": s}).key)
            for d, s in (("up", "up"), ("down", "up"), ("down", "down"))}  # fmt: skip
    assert keys == {json.dumps({"status": "frozen", "stage": "running"})}
    running = [doubt_of({**frozen(), "status": "running", "daemon": d}).key for d in ("up", "down")]
    assert running[0] != running[1]  # on a running instance the daemon going down is news


def test_an_approved_answer_that_ran_and_did_not_fix_it_is_asked_once_more(
    journal: Journal, reader: LLMClient, fake: FakeOpenAI
) -> None:
    tick = Ticks(journal, reader)
    d = doubt_of(frozen())
    assert tick(T0, d) == [1]
    answer = {"action": "replace", "params": {"instance": "10007"}}
    journal.escalations.answer(1, status="approved", by="human:ana", now=T0 + 60, answer=answer)
    journal.escalations.set_escalation_status(1, "failed")
    assert tick(T0 + 120, d) == []  # the action gets the window to take effect
    assert tick(T0 + WINDOW, d) == [2]
    assert "was answered and the action was failed" in journal.meta.get(ask_key(2))["why"]
    journal.escalations.answer(2, status="denied", by="human:ana", now=T0 + WINDOW, answer=None)
    assert tick(T0 + 10 * WINDOW, d) == []
    assert len(fake.chat_bodies) == 1


# ---- tools by subject ----------------------------------------------------------------------


def test_a_frozen_instance_is_offered_its_own_actions_only() -> None:
    assert allowed_actions("instance:10007", [frozen()]) == (
        "destroy", "replace", "block_host", "notify", "hold")  # fmt: skip


def test_a_running_instance_gets_the_actions_its_stage_allows() -> None:
    bench = {**frozen(), "status": "running", "stage": "bench", "daemon": "down"}
    assert allowed_actions("instance:10007", [bench]) == (
        "destroy", "replace", "drain", "restart_daemon", "reboot", "block_host", "notify",
        "hold")  # fmt: skip
    params = {**bench, "stage": "params", "drained": True}
    assert allowed_actions("instance:10007", [params]) == (
        "destroy", "replace", "undrain", "reboot", "block_host", "notify", "hold")  # fmt: skip


def test_fleet_sensor_and_host_subjects() -> None:
    assert allowed_actions("fleet", []) == ("launch", "scale_to", "notify", "hold")
    assert allowed_actions("demand:all", []) == ("launch", "scale_to", "notify", "hold")
    assert allowed_actions("sensor:provider", []) == ("notify", "hold")
    assert allowed_actions("machine:m1", []) == ("block_host", "notify", "hold")


def test_what_a_proposal_asks_for_is_allowed_but_never_escalate() -> None:
    asks = Proposal("restart_daemon", {"instance": "10007"}, "rule:r", "why", 0.5)
    ask = Proposal("escalate", {"reason": "look"}, "rule:r", "why", 0.9)
    assert allowed_actions("instance:10007", [frozen()], [asks, ask]) == (
        "destroy", "replace", "restart_daemon", "block_host", "notify", "hold")  # fmt: skip


def test_the_situation_the_prompt_and_the_tools_agree_and_an_answer_outside_is_refused(
    journal: Journal, reader: LLMClient, fake: FakeOpenAI
) -> None:
    esc = Escalator(journal, Notifier([], Renderer()), window_s=WINDOW, deadline_s=DEADLINE)
    s = esc.situation(doubt_of(frozen()), {}, {}, T0)
    assert s.allowed_actions == ("destroy", "replace", "block_host", "notify", "hold")
    assert offered_actions(s) == (*s.allowed_actions, ESCALATE)
    fake.script(ToolCall("restart_daemon", {"instance": "10007", "confidence": 0.9,
                                            "rationale": "restart it"}))  # fmt: skip
    with pytest.raises(LLMInvalidAnswer, match="not offered here"):
        reader.decide(s, {"10007", "m1"})
    tools = {t["function"]["name"] for t in fake.chat_bodies[-1]["tools"]}
    assert tools == set(offered_actions(s))
    [user] = [m["content"] for m in fake.chat_bodies[-1]["messages"] if m["role"] == "user"]
    offered = user.split("Offered actions:", 1)[1].split("If nobody answers", 1)[0]
    assert tuple(re.findall(r"^- (\w+): ", offered, re.MULTILINE)) == offered_actions(s)


# ---- `fleetgate simulate` with the fake LLM ------------------------------------------------


def simulate(tmp_path: Path, url: str, rules: Path, *extra: str) -> tuple[dict[str, Any], Path]:
    cfg = tmp_path / "simulate.yaml"
    cfg.write_text(
        "provider: sim\ndemand: sim\n"
        f"rules: ['{rules}']\n"
        "sim: {seed: 7, world: {odd_status_per_h: 1.5}}\n"  # a freeze every 40 min
        "escalation:\n  channels: [console]\n"
        f"  llm: {{base_url: '{url}', model: fake-model, retries: 0, timeout_s: 5, "
        "require_check: false}\n"
    )
    out = tmp_path / "report"
    assert main(["simulate", "--config", str(cfg), "--trace", str(SLICE), "--days", "0.3",
                 "--report", str(out), *extra]) == 0  # fmt: skip
    return json.loads((out / "report.json").read_text()), out / "state" / "journal.db"


def test_simulate_asks_the_llm_once_per_situation_and_people_once_per_change(
    tmp_path: Path, fake: FakeOpenAI, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = rules_leaving_frozen_to_people(tmp_path / "rules")
    doc, db = simulate(tmp_path, fake.url, rules)
    p = doc["fleetgate"]["per_situation"]
    printed = capsys.readouterr().out
    assert p["situations"] >= 3  # frozen instances, each left to escalation
    assert p["llm_calls"] <= p["situations"] and p["most_llm_calls"] == 1
    assert p["llm_calls"] == doc["fleetgate"]["llm_calls"] == len(fake.chat_bodies)
    assert p["escalations"] == doc["fleetgate"]["escalations"] > p["situations"]
    assert f"per distinct situation ({p['situations']}): escalations " in printed
    assert f"LLM calls {p['llm_calls'] / p['situations']:.2f} (at most 1)" in printed

    journal = Journal(db, read_only=True)
    try:
        by_fp: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
        for e in journal.escalations.recent(limit=10_000):
            by_fp[e["fingerprint"]].append(e)
        for fp, escs in by_fp.items():
            asks = [journal.meta.get(ask_key(int(e["id"]))) for e in escs]
            # the first ask, then at most one more, after the first expired a window earlier
            assert [a["ask"] for a in asks] in ([1], [1, 2]), (fp, asks)
            if len(escs) == 2:
                first, second = escs
                assert first["status"] == "expired"
                assert second["created_at"] - first["created_at"] >= WINDOW
            calls = Counter(c["escalation_id"] for c in journal.llm.llm_calls())
            assert [calls[int(e["id"])] for e in escs] in ([1], [1, 0])
    finally:
        journal.close()

    # with simulated answers (replace, 10 min after each is raised) each reaches people once
    with FakeOpenAI(default="escalate") as answered:
        (tmp_path / "answered").mkdir()
        doc, _ = simulate(tmp_path / "answered", answered.url, rules, "--answer-after-s", "600")
    p = doc["fleetgate"]["per_situation"]
    assert p["situations"] >= 3 and p["most_to_people"] == 1 and p["most_llm_calls"] == 1
    # answered and replaced, none is asked twice (the last ones may be raised too late to answer)
    assert p["escalations"] == p["situations"] and doc["fleetgate"]["answers"]["approved"] >= 3


def test_simulate_with_the_shipped_rules_replaces_frozen_instances_without_asking(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    doc, db = simulate(tmp_path, fake.url, shipped_rules())
    journal = Journal(db, read_only=True)
    try:
        by_rule = [a for a in journal.actions.recent(limit=10_000)
                   if a["proposer"] == "rule:replace-frozen-instance"]  # fmt: skip
        escalated = journal.escalations.recent(limit=10_000)
    finally:
        journal.close()
    # nothing is unmatched: what reaches people is a rule's own doubt (say, two replaces at once
    # in a small fleet, a large change), never a frozen instance
    assert doc["fleetgate"]["escalations"] == len(escalated)
    assert not [e for e in escalated if e["kind"] == "unmatched" or "frozen" in e["summary"]]
    assert len(fake.chat_bodies) <= len(escalated)
    acted = [a for a in by_rule if a["verdict"] == "act" and a["parent_id"] is None]
    assert acted and all(a["status"] == "ok" for a in acted)
    # the same replacement proposed again while it runs is the controller's to finish
    assert {a["verdict"] for a in by_rule} <= {"act", "superseded"}

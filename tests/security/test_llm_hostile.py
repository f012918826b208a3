"""A hostile or broken LLM endpoint, end to end on the simulator with a real fake
OpenAI-compatible server on loopback: whatever it answers, the escalation reaches people and
the call is journaled."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from fakes.openai_server import FakeOpenAI, RawBody, ToolCall
from support import SimApps, first_escalation

from controller.service.app import App
from controller.service.config import parse_config

DEEP = "[" * 50_000 + "]" * 50_000  # 100 kB, far under the reply cap, far over any parser's depth


@pytest.fixture
def app_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("FG_TEST_LLM_KEY", "sk-test-hostile")
    apps = SimApps(tmp_path)

    def make(url: str) -> App:
        return cast(App, apps.make(parse_config("test.yaml", (
            "interval_s: 0.01\n"
            "escalation:\n"
            f"  llm: {{base_url: '{url}', model: fake-model, api_key: {{env: FG_TEST_LLM_KEY}},\n"
            "        retries: 0, timeout_s: 5, require_check: false}\n"
            "  deadline_s: 864000\n"
        ))))  # fmt: skip

    yield make
    apps.close()


@pytest.mark.parametrize("reply", [
    RawBody(DEEP),  # the whole body nested past the JSON parser's depth
    ToolCall("replace", DEEP),  # a tool call whose arguments are
    ToolCall("replace", '{"instance": "x", "confidence": 0.9, "rationale": "r", "n": '
             + DEEP + "}"),
], ids=["body", "arguments", "one-argument"])  # fmt: skip
def test_an_answer_nested_past_the_parsers_depth_goes_to_people_at_once(
    app_for: Any, reply: Any
) -> None:
    with FakeOpenAI(*([reply] * 50)) as fake:
        app = app_for(fake.url)
        esc = first_escalation(app, "unmatched")
        for _ in range(3):  # the worker runs inline after each tick
            app.controller.tick()
        [call] = app.journal.llm.llm_calls(esc["id"])
        assert call["status"] in ("invalid", "unavailable") and call["routed"] == "people"
        assert "recursion" not in (call["error"] or "").lower()
        assert app.journal.escalations.deliveries(esc["id"]), "people were never told"
        assert app.journal.escalations.escalation(esc["id"])["status"] == "pending"


@pytest.mark.parametrize("reply", [
    ToolCall("escalate_to_human", {"reason": "sent sk-test-hostile", "confidence": 0.3,
                                   "rationale": "my key is sk-test-hostile"}),
    ToolCall("replace", {"instance": "sk-test-hostile", "confidence": 0.9, "rationale": "r"}),
    ToolCall("notify", '{"message": "sk\\u002dtest\\u002dhostile", "confidence": 0.9, '
                       '"rationale": "escaped"}'),
], ids=["rationale", "invalid", "escaped"])  # fmt: skip
def test_an_endpoint_echoing_its_key_puts_it_in_no_message_nor_the_journal(
    app_for: Any, reply: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The key the LLM was sent, echoed in its answer (its rationale, a parameter escaped in a
    tool call's arguments, an invalid call the error quotes): people read the answer and the
    journal keeps it, so the key is taken out first (it was printed in "Why you" and
    journaled)."""
    with FakeOpenAI(*([reply] * 50)) as fake:
        app = app_for(fake.url)
        esc = first_escalation(app, "unmatched")
        for _ in range(3):
            app.controller.tick()
        [call] = app.journal.llm.llm_calls(esc["id"])
        assert app.journal.escalations.deliveries(esc["id"])
        shown = repr(call) + capsys.readouterr().out
        shown += "".join(p.read_text() for p in tmp_path.rglob("*.jsonl"))
        assert "***" in shown and "hostile" not in shown

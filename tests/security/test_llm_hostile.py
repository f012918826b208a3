"""A hostile or broken LLM endpoint, end to end on the simulator with a real fake
OpenAI-compatible server on loopback: whatever it answers, the escalation reaches people and
the call is journaled."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.openai_server import FakeOpenAI, RawBody, ToolCall
from support import rules_leaving_frozen_to_people

from controller.service.app import App
from controller.service.assemble import assemble
from controller.service.config import parse_config

DEEP = "[" * 50_000 + "]" * 50_000  # 100 kB, far under the reply cap, far over any parser's depth


@pytest.fixture
def app_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("FG_TEST_LLM_KEY", "sk-test-hostile")
    apps: list[App] = []

    def make(url: str) -> App:
        rules = rules_leaving_frozen_to_people(tmp_path / "rules")
        cfg = parse_config("test.yaml", (
            "interval_s: 0.01\n"
            f"rules: ['{rules}']\n"
            "escalation:\n"
            f"  llm: {{base_url: '{url}', model: fake-model, api_key: {{env: FG_TEST_LLM_KEY}},\n"
            "        retries: 0, timeout_s: 5, require_check: false}\n"
            "  deadline_s: 864000\n"
        ))  # fmt: skip
        app = assemble(cfg, state=tmp_path / "state", clock=time.time, sleep=time.sleep, seed=7)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


def _first_unmatched(app: App) -> dict[str, Any]:
    for _ in range(500):
        app.controller.tick()
        found = [e for e in app.journal.escalations.recent() if e["kind"] == "unmatched"]
        if found:
            return found[0]
    raise AssertionError("no unmatched escalation in 500 ticks")


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
        esc = _first_unmatched(app)
        for _ in range(3):  # the worker runs inline after each tick
            app.controller.tick()
        [call] = app.journal.llm.llm_calls(esc["id"])
        assert call["status"] in ("invalid", "unavailable") and call["routed"] == "people"
        assert "recursion" not in (call["error"] or "").lower()
        assert app.journal.escalations.deliveries(esc["id"]), "people were never told"
        assert app.journal.escalations.escalation(esc["id"])["status"] == "pending"

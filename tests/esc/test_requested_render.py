"""A `requested` escalation (a rule's `escalate`) renders in every packaged template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import RAISED_AT, sample_esc

from escalation.llm_request import render_prompt
from escalation.render import Renderer
from escalation.situation import Situation

TEMPLATES = Path(__file__).resolve().parents[2] / "escalation" / "templates"
SUMMARY = "rule:ask-about-it asks a person to decide: instance 10007 reports odd"


def requested() -> dict[str, Any]:
    return sample_esc(kind="requested", summary=SUMMARY, proposals=[])


@pytest.mark.parametrize(
    "name",
    sorted(p.name for p in TEMPLATES.glob("*.j2") if not p.name.startswith(("prompt_", "notice"))),
)
def test_every_message_template_renders_a_requested_escalation(
    name: str, how: dict[str, Any]
) -> None:
    text = Renderer().render(name, esc=requested(), how=how)
    assert "requested" in text and "ask-about-it" in text


def test_the_prompt_tells_the_llm_a_rule_asked_for_it() -> None:
    situation = Situation(kind="requested", subject="instance:10007", summary=SUMMARY,
                          facts=({"kind": "instance", "id": "10007", "status": "odd"},),
                          key={"proposer": "rule:ask-about-it"}, proposals=(), recent_actions=(),
                          fleet={}, budget={}, allowed_actions=("hold", "replace", "escalate"),
                          default_action={"action": "hold"}, created_at=RAISED_AT)  # fmt: skip
    [system, user] = render_prompt(Renderer(), situation)
    assert "Situation kind: requested (a rule asked for this to be escalated)." in user["content"]
    assert SUMMARY in user["content"] and system["content"]

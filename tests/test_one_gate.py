"""One gate: a rule's proposal (through decide) and the LLM's answer (through the router) get
the same verdict, for the same reason, over a matrix of actions, confidences and autonomy."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.core.decide import decide
from controller.core.model import Decision, Proposal
from controller.core.policy import DecideSettings, Gate
from controller.store.journal import Journal
from escalation.llm import LLMAnswer
from escalation.notify import Notifier
from escalation.render import Renderer
from escalation.router import UNRESOLVING, Escalator, Routed

ACTIONS: dict[str, dict[str, Any]] = {
    "replace": {"instance": "i1", "block_host": False, "reason": ""},
    "restart_daemon": {"instance": "i1"},
    "scale_to": {"count": 3},
    "hold": {"reason": "wait"},
}
CONFIDENCES = (0.0, 0.5, 0.8, 0.95, 1.0)
GATES = (
    Gate(),
    Gate(mode="observe"),
    Gate(mode="propose"),
    Gate(actions={"replace": "propose"}),
    Gate(mode="propose", actions={"replace": "act", "hold": "act"}),
    Gate(mode="observe", actions={"replace": "act"}),
    Gate(confidence_threshold=0.95),
    Gate(confidence_threshold=0.0, actions={"scale_to": "propose"}),
)


def by_rule(action: str, confidence: float, gate: Gate) -> Decision:
    p = Proposal(action, ACTIONS[action], "rule:r", "because", confidence)
    [d] = decide([], [], ([p], []), DecideSettings(gate=gate)).decisions
    return d


def by_llm(escalator: Escalator, action: str, confidence: float) -> Routed:
    answer = LLMAnswer(action=action, params=ACTIONS[action], confidence=confidence,
                       rationale="because", tokens=10, latency_s=0.1, prompt_digest="d",
                       raw="")  # fmt: skip
    return escalator._route(answer, "m")


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "j.db")
    yield j
    j.close()


@pytest.mark.parametrize(
    "gate", GATES, ids=lambda g: f"{g.mode}-{dict(g.actions)}-{g.confidence_threshold}"
)
def test_a_rule_and_the_llm_pass_the_same_gate(journal: Journal, gate: Gate) -> None:
    esc = Escalator(journal, Notifier([], Renderer()), window_s=3600, deadline_s=1800, gate=gate)
    for action, confidence in itertools.product(ACTIONS, CONFIDENCES):
        d, routed = by_rule(action, confidence, gate), by_llm(esc, action, confidence)
        where = f"{action} at {confidence} under {gate!r}"
        if action in UNRESOLVING:  # the LLM's hold or notify leaves it to people, gate or not
            assert not routed.acted and "does not resolve the situation" in routed.why, where
            continue
        assert routed.acted is (d.verdict == "act"), where
        # the same reason in words, whoever proposed it
        assert d.why.split(" with confidence")[-1] in routed.why, where
        assert routed.proposal and routed.proposal["proposer"] == "llm:m", where


def test_the_matrix_covers_every_verdict_of_the_gate(journal: Journal) -> None:
    seen = {by_rule(a, c, g).verdict for g in GATES for a in ACTIONS for c in CONFIDENCES}
    assert seen == {"act", "ask", "observe"}


def test_the_llm_handing_a_situation_to_people_is_not_gated(journal: Journal) -> None:
    esc = Escalator(journal, Notifier([], Renderer()), window_s=3600, deadline_s=1800)
    answer = LLMAnswer(action=None, params={"reason": "unsure"}, confidence=1.0,
                       rationale="I cannot tell", tokens=1, latency_s=0.1, prompt_digest="d",
                       raw="")  # fmt: skip
    routed = esc._route(answer, "m")
    assert not routed.acted and routed.proposal is None and "I cannot tell" in routed.why

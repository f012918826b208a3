"""A rule whose action is `escalate`, end to end on the simulator: each tick's plan carries a
`requested` doubt, the tick journals it as an escalation of kind `requested` and tells people,
and nothing is carried out for it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ASKS, NO_FAULTS

from controller.service.app import App
from controller.service.assemble import assemble
from controller.service.config import parse_config

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def app_factory(tmp_path: Path) -> Iterator[Callable[[], App]]:
    """Builds the app when the test asks (after capsys, so the console channel writes to it)."""
    apps: list[App] = []

    def make() -> App:
        asks = tmp_path / "asks.yaml"
        asks.write_text(ASKS)
        faults = ", ".join(f"{k}: {v}" for k, v in NO_FAULTS.items())
        cfg = parse_config("test.yaml", f"interval_s: 0.01\nsim: {{world: {{{faults}}}}}\n")
        rules = [str(ROOT / "rules"), str(asks)]
        apps.append(assemble(cfg, state=tmp_path / "state", clock=time.time, sleep=time.sleep,
                             seed=7, rules=rules))  # fmt: skip
        return apps[-1]

    yield make
    for app in apps:
        app.close()


def requested(app: App) -> list[dict[str, Any]]:
    return [e for e in app.journal.escalations.recent() if e["kind"] == "requested"]


def test_a_rule_that_escalates_is_journaled_as_a_requested_escalation(
    app_factory: Callable[[], App], capsys: pytest.CaptureFixture[str]
) -> None:
    app = app_factory()
    for _ in range(200):
        planned = app.controller.tick()
        if requested(app):
            break
    [esc] = requested(app)
    assert [d.kind for d in planned.doubts].count("requested") == 1
    assert esc["status"] == "pending" and esc["subject"] == "fleet"
    assert esc["summary"].startswith("rule:ask-about-a-grown-fleet asks a person to decide: ")
    assert "instance(s)" in esc["summary"]
    [fleet] = esc["situation"]["facts"]
    assert fleet["kind"] == "fleet" and fleet["instances"] >= 2
    assert esc["situation"]["proposals"] == []  # approving it takes an action a person names
    assert f"ESCALATION #{esc['id']}: requested on fleet" in capsys.readouterr().out
    assert all(d["ok"] for d in app.journal.escalations.deliveries(esc["id"]))
    for _ in range(5):  # it holds every tick, and is raised once
        app.controller.tick()
    assert [e["id"] for e in requested(app)] == [esc["id"]]
    assert not [a for a in app.journal.actions.recent(10_000) if a["action"] == "escalate"]

"""An escalation's open alert, ended through the outbox as a running controller ends it, says
how the escalation ended: the resolve built from the journal's row had no status, and every
Alertmanager alert ended "escalation ended: answered", one nobody answered included."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.receiver import Receiver
from support import ASK_ABOUT_THE_FLEET, NO_FAULTS_YAML, fail_fleet_reads

from controller.service.app import App
from controller.service.assemble import assemble
from controller.service.config import parse_config
from controller.service.tick import FAILURES_TO_ESCALATE
from controller.store.backend import JournalError

ROOT = Path(__file__).resolve().parents[2]
ASKS = ASK_ABOUT_THE_FLEET
FAULTS = NO_FAULTS_YAML


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as rx:
        yield rx


def app_on(tmp_path: Path, rx: Receiver, deadline_s: float, asks: bool) -> App:
    text = (f"sim: {{world: {{{FAULTS}}}}}\nescalation:\n  deadline_s: {deadline_s}\n"
            f"  channels: [{{type: alertmanager, url: '{rx.url}'}}]\n")  # fmt: skip
    rules = [str(ROOT / "rules")]
    if asks:
        (tmp_path / "asks.yaml").write_text(ASKS)
        rules.append(str(tmp_path / "asks.yaml"))
    return assemble(parse_config(str(tmp_path / "test.yaml"), text), state=tmp_path / "state",
                    clock=time.time, sleep=time.sleep, seed=7, rules=rules)  # fmt: skip


def ended_alerts(rx: Receiver, esc_id: int) -> list[dict[str, Any]]:
    """The alerts Alertmanager was sent to end escalation `esc_id` (they carry no startsAt)."""
    return [a for r in rx.requests for a in r.json
            if a["labels"]["escalation_id"] == str(esc_id) and "startsAt" not in a]  # fmt: skip


def test_an_expired_escalations_alert_ends_saying_nobody_answered(
    tmp_path: Path, receiver: Receiver
) -> None:
    app = app_on(tmp_path, receiver, deadline_s=150, asks=True)
    try:
        for _ in range(20):
            app.controller.tick()
            rows = [e for e in app.journal.escalations.recent() if e["kind"] == "requested"]
            if rows and rows[-1]["status"] == "expired":
                break
        esc = rows[-1]
        assert esc["status"] == "expired"
        [alert] = ended_alerts(receiver, esc["id"])
        assert alert["annotations"]["description"] == (
            "escalation ended: nobody answered before the deadline; the default ran: "
            'hold reason="no answer before the deadline"'
        )
    finally:
        app.close()


def test_an_escalation_that_clears_ends_its_alert_saying_so(
    tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = app_on(tmp_path, receiver, deadline_s=1800, asks=False)
    try:
        c = app.controller
        c.tick()
        restore = fail_fleet_reads(monkeypatch, app.journal)
        for _ in range(FAILURES_TO_ESCALATE):
            with pytest.raises(JournalError):
                c.tick()
        restore()
        c.tick()
        [esc] = [e for e in app.journal.escalations.recent() if e["subject"] == "controller"]
        assert esc["status"] == "resolved"
        [alert] = ended_alerts(receiver, esc["id"])
        assert alert["annotations"]["description"] == (
            "escalation ended: cleared: the situation no longer held"
        )
    finally:
        app.close()

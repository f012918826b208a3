"""Launch records a killed or long-stopped controller leaves behind are closed by later ticks.

Both were found by tests/reliability/kill9.py (`stale_intents`, `open_parents`).
"""

from __future__ import annotations

from pathlib import Path

from test_launch_safety import ROOT, LateFleet, run

from controller.rules.source import RulesSource
from controller.service.app import decide_settings
from controller.service.config import parse_config
from controller.service.tick import Controller
from controller.store.journal import Journal
from escalation.notify import Notifier
from escalation.render import Renderer
from escalation.router import Escalator


def controller(
    tmp_path: Path, fleet: LateFleet, window_s: float
) -> tuple[Controller, Journal, list[float]]:
    journal = Journal(tmp_path / "j.db")
    clock = [10_000.0]
    cfg = parse_config("t.yaml", f"guards: {{launch_pending_s: {window_s}}}\n")
    esc = Escalator(journal, Notifier([], Renderer()), window_s=3600, deadline_s=1800)
    c = Controller(journal=journal, provider=fleet, demand=fleet,
                   rules=RulesSource([ROOT / "rules"]), settings=decide_settings(cfg),
                   escalator=esc, clock=lambda: clock[0])  # fmt: skip
    return c, journal, clock


def launches(journal: Journal) -> list[dict[str, object]]:
    return [r for r in journal.actions.recent(1000) if r["action"] == "launch" and r["parent_id"]]


def test_a_launch_never_listed_within_the_pending_window_is_recorded_as_lost(
    tmp_path: Path,
) -> None:
    fleet = LateFleet(late=10**6)  # its creates never show up
    c, journal, clock = controller(tmp_path, fleet, window_s=290)  # not a multiple of 60
    run(c, clock, 10)
    old = [r for r in launches(journal) if clock[0] - float(str(r["at"])) > 290]
    assert old and all(r["status"] == "lost" for r in old), [r["status"] for r in old]


def test_a_launch_action_a_killed_run_left_open_is_closed(tmp_path: Path) -> None:
    fleet = LateFleet(late=1)
    c, journal, clock = controller(tmp_path, fleet, window_s=1800)
    parent = journal.actions.record(tick_id=None, now=clock[0], action="launch",
                                    target="fleet", params={"count": 2}, proposer="rule:x",
                                    reason="r", confidence=1, verdict="act", why="w",
                                    status="intent")  # fmt: skip
    journal.actions.record(tick_id=None, now=clock[0], action="launch", target="fleet",
                           params={"label": "fg-0-1-0-aaaaaa"}, proposer="rule:x", reason="r",
                           confidence=1, verdict="act", why="part of action", status="intent",
                           key="fg-0-1-0-aaaaaa", parent_id=parent)  # fmt: skip
    # the run was killed here: the parent and its one per-label row are open
    run(c, clock, 2)
    [row] = [r for r in journal.actions.recent(1000) if r["id"] == parent]
    assert row["status"] != "intent"

"""`fleetgate pause` given while a tick runs: once the command has returned, the tick in progress
starts nothing more (the switch was read when the tick gathered, seconds of sensing and provider
calls before its actions).

The pause is a real `fleetgate pause` process on the tick's journal (SQLite, PostgreSQL), run
from inside the provider's call (sensing, or the first of two actions): a fixed interleaving,
not a race.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import BACKENDS, PG_DSN, StillFleet, journal_on

from controller.core.model import Demand, Instance
from controller.rules.source import RulesSource
from controller.service.app import decide_settings
from controller.service.config import Config
from controller.service.tick import Controller
from controller.store.journal import Journal
from controller.tools.bench.world import died_after_answering
from escalation.notify import Notifier
from escalation.render import Renderer
from escalation.router import Escalator

ROOT = Path(__file__).resolve().parent.parent
NOW = 100_000.0


def pause(journal: Journal, tmp: Path) -> None:
    """`fleetgate pause` on `journal`, as a person runs it beside the controller."""
    where = ["--state", str(tmp)]
    schema = getattr(journal.store, "schema", None)
    if schema is not None:
        cfg = tmp / "pg.yaml"
        cfg.write_text(f"journal: {{dsn: {{env: FG_TEST_DSN}}, schema_name: {schema}}}\n")
        where = ["--config", str(cfg)]
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from controller.service.cli import main; "
         "sys.exit(main())", *where, "pause"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env=dict(os.environ, FG_TEST_DSN=PG_DSN),
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.startswith("paused"), out.stdout + out.stderr


def listed() -> list[Instance]:
    return [Instance(n, f"fg-{n}", f"m{n}", f"h{n}", "running", "running", "down", "up",
                     dph=0.5) for n in ("101", "102")]  # fmt: skip


class Fleet(StillFleet):
    """Two of the journal's instances whose daemon died (each a `restart_daemon`); `during`
    runs once, inside the listing (`"sense"`) or the first restart (`"act"`)."""

    def __init__(self, journal: Journal, tmp: Path, during: str) -> None:
        self.journal, self.tmp, self.during = journal, tmp, during
        self.restarted: list[str] = []

    def _hook(self, when: str) -> None:
        if self.during == when:
            self.during = ""
            pause(self.journal, self.tmp)

    def list_instances(self) -> list[Instance]:
        self._hook("sense")
        return listed()

    def restart_daemon(self, instance_id: str) -> None:
        self.restarted.append(instance_id)
        self._hook("act")

    def demand(self) -> list[Demand]:
        return [Demand("PoRep", 0, 2), Demand("all", 0, 2)]


@pytest.fixture(params=BACKENDS)
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Journal]:
    with journal_on(request.param, tmp_path) as j:
        yield j


def controller(journal: Journal, fleet: Fleet) -> Controller:
    journal.actions.import_launches([("101", "fg-101"), ("102", "fg-102")], NOW - 86_400, "test")
    died_after_answering(journal, listed(), NOW - 600)  # cuzk ran and answered, then died
    esc = Escalator(journal, Notifier([], Renderer()), window_s=3600, deadline_s=1800)
    return Controller(journal=journal, provider=fleet, demand=fleet,
                      rules=RulesSource([ROOT / "rules"]), settings=decide_settings(Config()),
                      escalator=esc, clock=lambda: NOW)  # fmt: skip


def restarts(journal: Journal) -> list[tuple[str, str, str, str]]:
    rows = [r for r in journal.actions.recent(100) if r["action"] == "restart_daemon"]
    return sorted((r["target"], r["verdict"], r["status"], r["guard"] or "") for r in rows)


def test_a_pause_given_during_sensing_stops_the_tick_from_acting(
    journal: Journal, tmp_path: Path
) -> None:
    fleet = Fleet(journal, tmp_path, during="sense")
    c = controller(journal, fleet)
    c.tick()
    assert fleet.restarted == []
    assert restarts(journal) == [("instance:101", "veto", "vetoed", "paused"),
                                 ("instance:102", "veto", "vetoed", "paused")]  # fmt: skip


def test_a_pause_given_between_two_actions_stops_the_second(
    journal: Journal, tmp_path: Path
) -> None:
    fleet = Fleet(journal, tmp_path, during="act")
    c = controller(journal, fleet)
    planned = c.tick()
    assert len(fleet.restarted) == 1, fleet.restarted
    done, held = sorted(restarts(journal), key=lambda r: r[1])
    assert done == (f"instance:{fleet.restarted[0]}", "act", "ok", "")
    assert held[1:] == ("veto", "vetoed", "paused")
    row = next(r for r in journal.actions.recent(100) if r["target"] == held[0])
    assert "paused after this tick decided" in row["why"]
    summary = journal.meta.ticks(1)[0]["summary"]
    assert (summary.get("act"), summary.get("veto")) == (1, 1), summary
    assert planned.plan.to_act  # the plan itself was to act on both


def test_resumed_the_next_tick_acts_again(journal: Journal, tmp_path: Path) -> None:
    fleet = Fleet(journal, tmp_path, during="act")
    c = controller(journal, fleet)
    c.tick()
    pause_only = list(fleet.restarted)
    journal.meta.put("paused", False)  # `fleetgate resume`
    c.tick()
    assert len(pause_only) == 1 and sorted(fleet.restarted) == ["101", "102"], fleet.restarted

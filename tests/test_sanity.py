"""A listing that lost instances nobody destroyed is doubted: held, kept, escalated once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from controller.core.model import Instance, Observation, SensorStatus
from controller.core.sanity import check_listing
from controller.fleet.base import StaleReading
from controller.service.assemble import assemble
from controller.service.config import Config

OK = (SensorStatus("provider", "ok"), SensorStatus("demand", "ok"))


def obs(*ids: str) -> Observation:
    inst = tuple(Instance(i, i, "m", "h", "running", "running", "up", "up") for i in ids)
    return Observation(0.0, inst, (), OK)


def provider_state(o: Observation) -> str:
    return next(s.state for s in o.sensors if s.name == "provider")


def test_shrinking_by_more_than_half_without_our_destroys_fails_the_listing() -> None:
    tracked = ["1", "2", "3", "4", "5", "6"]
    assert provider_state(check_listing(obs("1", "2", "3"), tracked, [])) == "ok"  # half
    doubted = check_listing(obs("1", "2"), tracked, [])
    assert provider_state(doubted) == "failed"
    assert "shrank from 6 to 2" in next(s.detail for s in doubted.sensors if s.name == "provider")
    assert provider_state(check_listing(obs("1", "2"), tracked, ["3", "4"])) == "ok"  # ours
    assert provider_state(check_listing(obs(), ["1"], [])) == "failed"  # everything vanished
    assert provider_state(check_listing(obs(), ["1"], ["1"])) == "ok"
    assert provider_state(check_listing(obs("1"), ["1", "2", "3"], [])) == "ok"  # small fleet


class Halving:
    """The simulator's provider, whose listing starts dropping half the fleet when told to."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.halve = inner, False

    def list_instances(self) -> list[Instance]:
        got = self.inner.list_instances()
        return got[: len(got) // 3] if self.halve else got

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_fleet_that_vanishes_from_the_listing_is_held_not_replaced(tmp_path: Path) -> None:
    app = assemble(Config(), state=tmp_path / "s", clock=time.time, sleep=time.sleep, seed=7)
    try:
        ctl = app.controller
        for _ in range(40):
            ctl.tick()
        fleet = Halving(ctl.provider)
        ctl.provider = fleet  # the listing (sensing) shrinks; the actions stay as they are
        before = {r["id"] for r in app.journal.actions.recent(10_000)}
        destroyed_before = app.sim.stats["instances_destroyed"] if app.sim else 0
        tracked = set(app.journal.fleet.history(ctl.clock()).instances)
        assert len(tracked) >= 6
        fleet.halve = True
        for _ in range(5):
            ctl.tick()
        new = [r for r in app.journal.actions.recent(10_000) if r["id"] not in before]
        changes = [
            r
            for r in new
            if r["verdict"] == "act"
            and r["action"] in ("launch", "destroy", "replace", "drain", "reboot")
        ]
        assert changes == []
        assert app.sim and app.sim.stats["instances_destroyed"] == destroyed_before
        still = set(app.journal.fleet.history(ctl.clock()).instances)
        assert still >= tracked  # nothing marked gone
        sensing = [e for e in app.journal.escalations.recent() if e["kind"] == "sensing_failure"]
        assert len(sensing) == 1 and "vanished without our actions" in sensing[0]["summary"]
    finally:
        app.close()


class Frozen:
    """The simulator's demand sensor, whose reading goes stale when told to."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.stale = inner, False

    def demand(self) -> list[Any]:
        if self.stale:
            raise StaleReading("Curio's queue looks stale: none of its 3 node(s) has checked in")
        return list(self.inner.demand())


def test_stale_demand_holds_scaling_and_is_escalated_once(tmp_path: Path) -> None:
    app = assemble(Config(), state=tmp_path / "s", clock=time.time, sleep=time.sleep, seed=7)
    try:
        ctl = app.controller
        for _ in range(40):
            ctl.tick()
        demand = Frozen(ctl.demand)
        ctl.demand = demand
        before = {r["id"] for r in app.journal.actions.recent(10_000)}
        demand.stale = True
        for _ in range(8):
            planned = ctl.tick()
        assert [s.state for s in planned.observation.sensors if s.name == "demand"] == ["stale"]
        new = [r for r in app.journal.actions.recent(10_000) if r["id"] not in before]
        destructive = ("launch", "destroy", "replace", "drain", "scale_to")
        assert [r for r in new if r["verdict"] == "act" and r["action"] in destructive] == []
        # what the rules still proposed went to people (weak evidence) or was held, not acted on
        assert any(r["verdict"] in ("ask", "veto") and r["action"] in destructive for r in new)
        sensing = [e for e in app.journal.escalations.recent() if e["kind"] == "sensing_failure"]
        assert len(sensing) == 1 and "demand reading stale" in sensing[0]["summary"]
    finally:
        app.close()

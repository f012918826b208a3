"""/healthz (the process answers and the journal takes a write) and /readyz (the ticks run:
the last one's age against the interval, its sensors, the leader lease) on a real loopback
server, over journals real ticks wrote."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from pydantic import SecretStr
from support import FakeClock, served

from controller.fleet.base import StaleReading
from controller.service.api import HEALTH_KEY, create_app
from controller.service.assemble import assemble
from controller.service.config import Config
from controller.service.dashboard import View
from controller.service.status import stall_after_s
from controller.store.journal import Journal
from controller.store.lease import Lease

TOKEN = "health-token"


def ready(base: str) -> tuple[int, dict[str, Any]]:
    r = requests.get(f"{base}/readyz", timeout=10)
    return r.status_code, r.json()


def test_healthz_writes_the_journal_and_fails_when_it_cannot(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.db")
    with served(create_app(journal, SecretStr(TOKEN), clock=lambda: 1234.5), journal) as base:
        r = requests.get(f"{base}/healthz", timeout=10)
        assert r.status_code == 200 and r.json() == {"status": "ok"}
    again = Journal(tmp_path / "j.db")
    assert again.meta.get(HEALTH_KEY) == 1234.5  # the probe's write landed
    again.close()
    read_only = Journal(tmp_path / "j.db", read_only=True)  # every write fails
    with served(create_app(read_only, SecretStr(TOKEN), clock=lambda: 1.0), read_only) as base:
        r = requests.get(f"{base}/healthz", timeout=10)
        assert r.status_code == 503
        assert r.json() == {"status": "failed", "reason": "the journal cannot be written"}


def test_healthz_fails_once_the_journal_file_is_deleted_or_replaced(tmp_path: Path) -> None:
    """The open connection goes on writing into a deleted file, or the one moved away, which
    nobody reads; every tick holds until a restart, which a liveness probe is there to ask for."""
    journal = Journal(tmp_path / "j.db")
    reason = "the journal this process opened is gone or was replaced: restart it"
    lost = {"status": "failed", "reason": reason}
    with served(create_app(journal, SecretStr(TOKEN), clock=lambda: 1.0), journal) as base:
        assert requests.get(f"{base}/healthz", timeout=10).status_code == 200
        (tmp_path / "j.db").rename(tmp_path / "moved.db")
        r = requests.get(f"{base}/healthz", timeout=10)
        assert r.status_code == 503 and r.json() == lost
        Journal(tmp_path / "j.db").close()  # another journal where it was
        r = requests.get(f"{base}/healthz", timeout=10)
        assert r.status_code == 503 and r.json() == lost


def test_healthz_fails_once_the_journal_write_ahead_log_is_deleted(tmp_path: Path) -> None:
    """The commits since the last checkpoint live in `j.db-wal`: deleted, the connection goes
    on committing into it unseen (other readers get a disk I/O error), and a crash loses them."""
    journal = Journal(tmp_path / "j.db")
    with served(create_app(journal, SecretStr(TOKEN), clock=lambda: 1.0), journal) as base:
        assert requests.get(f"{base}/healthz", timeout=10).status_code == 200
        (tmp_path / "j.db-wal").unlink()
        r = requests.get(f"{base}/healthz", timeout=10)
        reason = "the journal this process opened is gone or was replaced: restart it"
        assert r.status_code == 503 and r.json() == {"status": "failed", "reason": reason}


class Demand:
    """The simulator's demand sensor, whose reading goes stale when told to."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.stale = inner, False

    def demand(self) -> list[Any]:
        if self.stale:
            raise StaleReading("none of Curio's nodes has checked in")
        return list(self.inner.demand())


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Any]:
    app = assemble(Config(), state=tmp_path / "s", clock=time.time, sleep=time.sleep, seed=7)
    yield app
    app.close()


def test_readyz_follows_the_ticks_sensors_and_lease(controller: Any, tmp_path: Path) -> None:
    app = controller
    clock = FakeClock()
    view = View(interval_s=60.0, holder="ctl-a", ttl_s=600)
    api = create_app(app.journal, SecretStr(TOKEN), clock=clock, view=view)
    with served(api, app.journal) as base:
        code, doc = ready(base)
        assert code == 503 and "no tick has finished yet" in doc["reasons"]
        assert "no controller holds the leader lease" in doc["reasons"]

        mine = Lease(app.journal, "ctl-a", ttl_s=600, margin_s=1)
        assert mine.renew()
        app.controller.tick()
        [last] = app.journal.meta.ticks(1)
        clock.now = last["finished_at"] + 5
        code, doc = ready(base)
        assert code == 200, doc
        assert doc["ready"] is True and doc["role"] == "leader" and doc["leader"] == "ctl-a"
        assert doc["sensors"] == {"provider": "ok", "demand": "ok"}
        assert doc["last_tick"]["id"] == last["id"] and doc["last_tick"]["age_s"] == 5.0

        clock.now = last["finished_at"] + stall_after_s(60.0) + 1  # no tick since
        code, doc = ready(base)
        assert code == 503 and doc["role"] == "leader"
        assert any("the last tick finished" in why for why in doc["reasons"]), doc

        stale = Demand(app.controller.demand)
        app.controller.demand = stale
        stale.stale = True
        app.controller.tick()
        [last] = app.journal.meta.ticks(1)
        clock.now = last["finished_at"]
        code, doc = ready(base)
        assert code == 503 and doc["sensors"]["demand"] == "stale"
        assert doc["reasons"] == ["sensor demand was stale at the last tick"]

        stale.stale = False
        app.controller.tick()
        clock.now = app.journal.meta.ticks(1)[0]["finished_at"]
        assert ready(base)[0] == 200


def test_a_standby_is_ready_while_the_leader_ticks(controller: Any) -> None:
    app = controller
    leader = Lease(app.journal, "ctl-a", ttl_s=600, margin_s=1)
    assert leader.renew()
    app.controller.tick()
    finished = app.journal.meta.ticks(1)[0]["finished_at"]
    view = View(interval_s=60.0, holder="ctl-b", ttl_s=600)
    api = create_app(app.journal, SecretStr(TOKEN), clock=lambda: finished + 1, view=view)
    with served(api, app.journal) as base:
        code, doc = ready(base)
        assert code == 200 and doc["role"] == "standby" and doc["leader"] == "ctl-a"
        leader.release()
        code, doc = ready(base)
        assert code == 503 and doc["role"] == "none"
        assert doc["reasons"] == ["no controller holds the leader lease"]


def test_readyz_on_a_running_controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve_api` hands the interval and lease holder to /readyz: on the simulator, whose
    clock is virtual, the interval is the virtual seconds a tick advances (a tick every
    0.01 s that advances 60 s read as stalled half the time, between ticks)."""
    from dash.deck import TOKEN as DASH_TOKEN
    from dash.deck import running

    monkeypatch.setenv("FG_DASH_TOKEN", DASH_TOKEN)
    with running(tmp_path / "state") as deck:
        assert ready(deck.base)[0] == 503  # before the first tick
        deck.app.controller.tick()
        code, doc = ready(deck.base)
        assert code == 200 and doc["role"] == "leader"
        step = deck.app.config.sim.seconds_per_tick
        assert deck.app.config.interval_s < step
        assert doc["interval_s"] == step and doc["stall_after_s"] == stall_after_s(step)
        deck.app.wire.before_tick(step)  # the next tick's world moved on; it has not finished
        code, doc = ready(deck.base)
        assert code == 200 and doc["last_tick"]["age_s"] == step, doc
        deck.app.wire.before_tick(3 * step)  # stalled by the virtual clock: three ticks' worth
        code, doc = ready(deck.base)
        assert code == 503 and "the last tick finished 240 s ago" in doc["reasons"][0], doc

"""Every instance API call authenticates as exactly one instance, and reaches only its records.

One test per attack an instance could make on another (or on the controller) when the fleet
shared one token, each through a real uvicorn server on loopback (`api.Server`) over the real
journal (SQLite in `tmp_path`). Instances are launched as the controller launches them
(`FleetActions.launch`, with a stand-in vast that keeps the create's environment), so each
holds the token its launch gave it and nothing else.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from pydantic import SecretStr

from controller.fleet.actions import FleetActions
from controller.fleet.base import LaunchRequest
from controller.fleet.instance_api import RateLimits, _Buckets, instance_router
from controller.service.api import Server, create_app
from controller.store.instance_tokens import TOKEN_ENV
from controller.store.journal import Journal
from controller.store.records import MAX_LOG_CHARS, MAX_LOG_LINES, LifecycleStore

OPERATOR = "operator-token-identity-tests"
SHARED = "shared-fleet-token-identity-tests"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Vast:
    """A stand-in vast provider: numbers its creates and keeps each one's environment."""

    next_id: int = 5001
    env: dict[str, dict[str, str]] = field(default_factory=dict)  # label -> create's env
    rebooted: list[str] = field(default_factory=list)

    def launch(self, request: LaunchRequest) -> str:
        self.env[request.label] = dict(request.env)
        self.next_id += 1
        return str(self.next_id - 1)

    def reboot(self, instance_id: str) -> None:
        self.rebooted.append(instance_id)


@dataclass
class Fleet:
    base: str
    store: LifecycleStore
    actions: FleetActions
    vast: Vast
    clock: Clock
    journal: Journal
    session: requests.Session
    ids: dict[str, str] = field(default_factory=dict)  # label -> vast id

    def launch(self, label: str) -> str:
        """Launch `label` as the controller does; its instance's token (from its env)."""
        self.ids[label] = self.actions.launch(LaunchRequest(label=label))
        return self.vast.env[label][TOKEN_ENV]

    def boot(self, label: str, host_and_port: str) -> str:
        """Launch and register `label` with its own token, as its agent does."""
        token = self.launch(label)
        r = self.post(token, "register", {"label": label, "host_and_port": host_and_port})
        assert r.status_code == 200, r.text
        return token

    def post(self, token: str, path: str, body: Any = None) -> requests.Response:
        return self.session.post(f"{self.base}/v1/instances/{path}", json=body,
                                 headers={"Authorization": f"Bearer {token}"},
                                 timeout=10)  # fmt: skip

    def journal_bytes(self) -> int:
        path = self.journal.path
        assert path is not None
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def serve(tmp_path: Path, shared: str | None = None) -> Iterator[Fleet]:
    journal = Journal(tmp_path / "journal.db")
    store = LifecycleStore(journal)
    clock = Clock(1_000.0)
    vast = Vast()
    actions = FleetActions(vast=vast, lifecycle=store, curio=None, clock=clock)
    app = create_app(journal, SecretStr(OPERATOR), clock=clock)
    app.include_router(instance_router(store, SecretStr(shared) if shared else None, clock))
    server = Server(app, "127.0.0.1", 0)
    server.start()
    session = requests.Session()
    try:
        yield Fleet(f"http://127.0.0.1:{server.port}", store, actions, vast, clock, journal,
                    session)  # fmt: skip
    finally:
        session.close()
        server.stop()
        journal.close()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    yield from serve(tmp_path)


@pytest.fixture
def shared_fleet(tmp_path: Path) -> Iterator[Fleet]:
    (tmp_path / "shared").mkdir()  # a journal of its own: its fake vast numbers ids from 5001 too
    yield from serve(tmp_path / "shared", shared=SHARED)


# ---- the launch ----------------------------------------------------------------------------------
def test_each_launch_gives_its_instance_a_token_of_its_own_kept_only_hashed(fleet: Fleet) -> None:
    a, b = fleet.launch("fg-a"), fleet.launch("fg-b")
    assert a and b and a != b and len(a) >= 40
    assert fleet.store.tokens.label_for(a) == "fg-a" and fleet.store.tokens.label_for(b) == "fg-b"
    assert fleet.store.tokens.vast_id("fg-a") == fleet.ids["fg-a"]  # bound to its vast id
    fleet.journal.store.query("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = b"".join(p.read_bytes() for p in Path(fleet.journal.path or "").parent.glob("journal*"))
    assert a.encode() not in raw and b.encode() not in raw  # the journal holds hashes only
    assert "fg-a" in repr(LaunchRequest("fg-a", env=((TOKEN_ENV, a),))) and a not in repr(
        LaunchRequest("fg-a", env=((TOKEN_ENV, a),))
    )


# ---- one test per attack -------------------------------------------------------------------------
def test_an_instance_cannot_re_register_another_instances_label(fleet: Fleet) -> None:
    a = fleet.boot("fg-a", "10.0.0.1:12300")
    fleet.boot("fg-b", "10.0.0.2:12300")
    before = fleet.store.record("fg-b")
    r = fleet.post(a, "register", {"label": "fg-b", "host_and_port": "6.6.6.6:12300"})
    assert r.status_code == 403
    r = fleet.post(a, "register", {"label": "fg-a", "vast_id": fleet.ids["fg-b"]})
    assert r.status_code == 409  # nor claim its vast id
    assert fleet.store.record("fg-b") == before
    assert fleet.store.record("fg-b").host_and_port == "10.0.0.2:12300"  # type: ignore[union-attr]


def test_an_instance_whose_create_reply_was_lost_cannot_claim_another_instances_id(
    fleet: Fleet,
) -> None:
    """Its token names no vast id (the launch never learned it), so it gives its own; one that
    a launch rented for another label is refused, before that instance even registers."""
    lost = fleet.store.tokens.issue("fg-lost", fleet.clock())  # as a launch does before create
    fleet.launch("fg-b")  # rented, its id bound to its token; its agent not up yet
    r = fleet.post(lost, "register", {"label": "fg-lost", "vast_id": fleet.ids["fg-b"]})
    assert r.status_code == 409 and "another instance's" in r.json()["detail"]
    assert fleet.store.records() == {}
    r = fleet.post(lost, "register", {"label": "fg-lost", "vast_id": "424242"})  # its own
    assert r.status_code == 200 and fleet.store.record("fg-lost").vast_id == "424242"  # type: ignore[union-attr]


def test_an_instance_cannot_heartbeat_as_another(fleet: Fleet) -> None:
    a = fleet.boot("fg-a", "10.0.0.1:12300")
    fleet.boot("fg-b", "10.0.0.2:12300")
    r = fleet.post(a, "fg-b/heartbeat", {"daemon_uptime_s": 99999, "daemon_state": "RUNNING"})
    assert r.status_code == 403
    b = fleet.store.record("fg-b")
    assert b is not None and b.last_heartbeat is None and b.daemon_state is None


def test_an_instance_cannot_take_another_instances_command_or_report_it_done(
    fleet: Fleet,
) -> None:
    a = fleet.boot("fg-a", "10.0.0.1:12300")
    b = fleet.boot("fg-b", "10.0.0.2:12300")
    fleet.actions.restart_daemon(fleet.ids["fg-b"])  # what the controller does for B
    [cmd] = fleet.store.commands("fg-b")
    assert fleet.post(a, "fg-b/heartbeat").status_code == 403
    done = {"ok": True, "detail": "restarted"}
    assert fleet.post(a, f"fg-b/commands/{cmd.id}/done", done).status_code == 403
    assert fleet.post(a, f"fg-a/commands/{cmd.id}/done", done).status_code == 404
    assert fleet.post(a, "fg-a/heartbeat").json() == {"commands": []}
    still = fleet.store.command(cmd.id)
    assert still is not None and still.picked_at is None and still.done_at is None
    picked = fleet.post(b, "fg-b/heartbeat").json()  # B itself still gets it
    assert picked == {"commands": [{"id": cmd.id, "command": "restart_daemon"}]}


def test_an_instance_cannot_report_a_benchmark_for_another(fleet: Fleet) -> None:
    a = fleet.boot("fg-a", "10.0.0.1:12300")
    b = fleet.boot("fg-b", "10.0.0.2:12300")
    assert fleet.post(b, "fg-b/params-done").status_code == 200
    assert fleet.post(a, "fg-b/bench-done", {"rate": 0}).status_code == 403
    rec = fleet.store.record("fg-b")
    assert rec is not None and (rec.stage, rec.bench_rate) == ("params", None)


def test_an_instance_cannot_push_logs_as_another(fleet: Fleet) -> None:
    a = fleet.boot("fg-a", "10.0.0.1:12300")
    fleet.boot("fg-b", "10.0.0.2:12300")
    r = fleet.post(a, "fg-b/logs", {"lines": ["cuzk: FATAL out of GPU memory"]})
    assert r.status_code == 403
    assert fleet.store.logs("fg-b") == []


def test_a_label_equal_to_another_instances_vast_id_never_gets_its_commands(
    fleet: Fleet,
) -> None:
    b = fleet.boot("fg-b", "10.0.0.2:12300")
    victim = fleet.ids["fg-b"]
    # a made-up label that spells B's vast id: no launch, no token, nothing stored
    junk = fleet.post(secrets.token_urlsafe(32), "register", {"label": victim})
    assert junk.status_code == 401 and fleet.store.record(victim) is None
    # and even a launched instance whose label is B's vast id cannot take B's commands
    a = fleet.launch(victim)
    assert fleet.post(a, "register", {"label": victim}).status_code == 200
    fleet.actions.restart_daemon(victim)  # the controller names instances by vast id
    assert fleet.post(a, f"{victim}/heartbeat").json() == {"commands": []}
    assert fleet.store.commands(victim) == []
    [cmd] = fleet.store.commands("fg-b")
    assert fleet.post(b, "fg-b/heartbeat").json()["commands"] == [
        {"id": cmd.id, "command": "restart_daemon"}
    ]


def test_no_registration_for_a_label_fleetgate_never_launched(
    fleet: Fleet, shared_fleet: Fleet
) -> None:
    a = fleet.launch("fg-a")
    assert fleet.post(a, "register", {"label": "fg-never"}).status_code == 403
    assert fleet.post("made-up-token", "register", {"label": "fg-never"}).status_code == 401
    assert fleet.store.records() == {}
    # the weaker opt-in: the shared fleet token works only for labels fleetgate launched
    shared_fleet.launch("fg-s")
    assert shared_fleet.post(SHARED, "register", {"label": "fg-never"}).status_code == 403
    assert shared_fleet.post(SHARED, "register", {"label": "fg-s"}).status_code == 200
    assert list(shared_fleet.store.records()) == ["fg-s"]


def test_a_burst_of_300_registrations_is_rate_limited(fleet: Fleet) -> None:
    a = fleet.launch("fg-a")
    own = Counter(fleet.post(a, "register", {"label": "fg-a"}).status_code for _ in range(300))
    assert own[200] <= 5 and own[429] >= 295, own
    made_up = Counter(
        fleet.post(a, "register", {"label": f"fg-fake-{n}"}).status_code for n in range(300)
    )
    assert made_up == {403: 300}
    assert list(fleet.store.records()) == ["fg-a"]
    fleet.clock.now += 60  # the bucket refills with time: the agent's retry gets through
    assert fleet.post(a, "register", {"label": "fg-a"}).status_code == 200


def test_a_log_flood_keeps_a_bounded_buffer_and_the_journal_flat(fleet: Fleet) -> None:
    a = fleet.boot("fg-a", "10.0.0.1:12300")
    lines = [f"{n:04d} " + "x" * 495 for n in range(20)]  # 10 KB a push
    before = fleet.journal_bytes()
    seen: Counter[int] = Counter()
    for _ in range(10_000):
        fleet.clock.now += 0.05  # 500 s of virtual time: the bucket refills 500 pushes
        seen[fleet.post(a, "fg-a/logs", {"lines": lines}).status_code] += 1
    after = fleet.journal_bytes()
    assert set(seen) == {200, 429} and seen[200] <= 30 + 500 + 1, seen
    kept = fleet.store.logs("fg-a", limit=10 * MAX_LOG_LINES)
    assert len(kept) <= MAX_LOG_LINES and sum(len(x.line) for x in kept) <= MAX_LOG_CHARS
    assert kept[-1].line == lines[-1]  # the newest lines are the ones kept
    growth = after - before
    print(f"log flood: {seen[200]} pushes taken, {seen[429]} refused (429); journal "
          f"{before} -> {after} bytes (+{growth}); {len(kept)} lines kept")  # fmt: skip
    assert growth < 8 * 2**20, growth  # 100 MB were sent
    fleet.journal.store.query("PRAGMA wal_checkpoint(TRUNCATE)")
    assert fleet.journal_bytes() < 2 * 2**20  # what stays once the write-ahead log is folded in


# ---- records expire with the instance ------------------------------------------------------------
def test_a_forgotten_instances_token_stops_working(fleet: Fleet) -> None:
    b = fleet.boot("fg-b", "10.0.0.2:12300")
    assert fleet.post(b, "fg-b/heartbeat").status_code == 200
    fleet.actions.gone(fleet.ids["fg-b"])  # vast confirmed it destroyed
    assert fleet.post(b, "fg-b/heartbeat").status_code == 401
    assert fleet.post(b, "register", {"label": "fg-b"}).status_code == 401
    assert fleet.store.records() == {} and not fleet.store.tokens.launched("fg-b")


def test_the_buckets_of_instances_that_went_are_dropped_and_a_spent_one_is_kept() -> None:
    """One bucket per (instance, kind) for every label that ever called: full ones are the same
    as none and go, every 10 minutes; one still refilling stays, or its limit would reset."""
    buckets = _Buckets(RateLimits())
    now = 1_000.0
    for n in range(1000):  # a thousand instances heartbeat once, then go
        assert buckets.take(f"fg-{n}", "other", now)
    for _ in range(5):  # one floods its registrations
        buckets.take("fg-flood", "register", now + 570)
    assert not buckets.take("fg-flood", "register", now + 570)
    assert len(buckets) == 1001
    assert buckets.take("fg-live", "other", now + _Buckets.PRUNE_EVERY_S)
    assert len(buckets) == 2  # fg-live's, and fg-flood's: 4 of its 5 tokens still to refill
    assert not buckets.take("fg-flood", "register", now + _Buckets.PRUNE_EVERY_S)

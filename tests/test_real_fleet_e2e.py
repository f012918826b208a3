"""The real fleet end to end: a fake vast API (HTTP), Curio's queue in the real PostgreSQL,
instance agents talking to the controller's HTTP API, and a stand-in cuzk status server per
instance. Tasks arrive → launches; a daemon dies → restart through its agent; a crash loop →
replace and block the host; the queue empties → drain, then destroy. Plus the sensing cases:
429/5xx bursts and late creates never duplicate an instance; an empty or 410 listing changes
nothing and is escalated once."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from fakes.curio_db import CurioDB
from fakes.vast_server import Empty, FakeVast, Lost, Status, offer
from support import FakeClock
from test_cli_ops import fg, ok

from controller.core.track import RESTART_SLACK_S
from controller.service import cli
from controller.service.app import App
from controller.service.assemble import assemble
from controller.service.config import parse_config

ROOT = Path(__file__).resolve().parent.parent
DSN = os.environ.get("FLEETGATE_TEST_PG_DSN", "host=127.0.0.1 port=5432 dbname=test user=postgres")
API_TOKEN = "api-token-e2e-456"


class Cuzk:
    """cuzk's optional status server: `/status` with uptime while alive, 503 when dead."""

    def __init__(self) -> None:
        self.alive, self.started = True, time.time()
        cuzk = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the base's name
                if not cuzk.alive:
                    self.send_response(503)
                    self.end_headers()
                    return
                body = json.dumps({"uptime_secs": time.time() - cuzk.started}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None: ...

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def restart(self) -> None:
        self.alive, self.started = True, time.time()


@dataclass
class World:
    vast: FakeVast
    db: CurioDB
    app: App
    api: str
    clock: FakeClock
    cuzk: dict[int, Cuzk] = field(default_factory=dict)
    machines: dict[int, int] = field(default_factory=dict)  # vast id -> Curio machine id
    registered: set[int] = field(default_factory=set)
    labels: dict[int, str] = field(default_factory=dict)  # the container's (FLEETGATE_LABEL)
    flags: bool = True  # agents started with --vast-id and --host-and-port (False: neither)

    def token(self, label: str) -> str:
        """The instance's own token, from the environment its create gave the container."""
        for fields in self.vast.instances.values():
            env = dict(fields.get("extra_env") or [])
            if env.get("FLEETGATE_LABEL") == label:
                return str(env["FLEETGATE_INSTANCE_TOKEN"])
        raise AssertionError(f"no instance was created with label {label!r}")

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        label = (body or {})["label"] if path == "register" else path.split("/")[0]
        headers = {"Authorization": f"Bearer {self.token(label)}"}
        r = requests.post(f"{self.api}/v1/instances/{path}", json=body or {}, headers=headers,
                          timeout=10)  # fmt: skip
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r.json()

    def agents(self) -> None:
        """Every running instance's agent: register, report milestones, heartbeat, run commands."""
        for iid, fields in self.vast.instances.items():
            if fields.get("actual_status") != "running" or iid not in self.cuzk:
                continue
            label = self.labels.get(iid) or fields["label"]
            if iid not in self.registered:
                node = f"127.0.0.1:{20000 + iid}"
                ids = {"vast_id": str(iid), "host_and_port": node} if self.flags else {}
                self.post("register", {"label": label, **ids})
                self.machines[iid] = self.db.add_machine(node)
                for step in ("params-done", "bench-done", "running"):
                    self.post(f"{label}/{step}", {"rate": 35.0} if step == "bench-done" else None)
                self.registered.add(iid)
            self.db.heartbeat(self.machines[iid])
            for cmd in self.post(f"{label}/heartbeat").get("commands", []):
                assert cmd["command"] == "restart_daemon"
                self.cuzk[iid].restart()
                self.post(f"{label}/commands/{cmd['id']}/done", {"ok": True, "detail": "restarted"})

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.vast.advance(60)
            self.clock.now += 60
            self.agents()
            self.app.controller.tick()
            self.agents()

    def actions(self, action: str) -> list[dict[str, Any]]:
        rows = self.app.journal.actions.recent(10_000)
        return [r for r in rows if r["action"] == action and r["status"] == "ok"
                and r["parent_id"] is None]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    rules = ROOT / "rules"  # the shipped rules as they are; time comes from a fake clock
    monkeypatch.setenv("FG_VAST_KEY", "fake-vast-key-0123456789abcdef")
    monkeypatch.setenv("FG_CURIO_DSN", DSN)
    monkeypatch.setenv("FG_API_TOKEN", API_TOKEN)
    offers = [offer(100 + n, machine_id=n + 1, dph=0.40 + n / 100) for n in range(12)]
    with FakeVast(offers=offers, boot_s=30, load_s=60) as vast, CurioDB(DSN) as db:
        port = free_port()
        cfg = parse_config(
            "e2e.yaml",
            f"""
provider: vast
demand: curio
rules: ['{rules}']
vast:
  api_key: {{env: FG_VAST_KEY}}
  base_url: '{vast.url}'
  image: example/cuzk:latest
  retries: 3
  backoff_s: 0.01
  min_interval_s: {{list: 0, create: 0, destroy: 0, search: 0, other: 0}}
curio: {{dsn: {{env: FG_CURIO_DSN}}, schema_name: '{db.schema}', allow_drain: true}}
instances: {{health_timeout_s: 2, command_deadline_s: 1,
             health_failures_to_down: 2, health_down_after_s: 0}}
api: {{listen: '127.0.0.1:{port}', token: {{env: FG_API_TOKEN}}}}
guards: {{scale_down_delay_after_up_s: 0, cooldowns_s: {{restart_daemon: 0}}}}
escalation: {{channels: [file]}}
""",
        )
        clock = FakeClock()
        # the vast client's pacing and backoff sleep on the fake clock
        app = assemble(cfg, state=tmp_path / "state", clock=clock, sleep=clock.sleep)
        server = app.serve_api()
        w = World(vast, db, app, f"http://127.0.0.1:{port}", clock)

        def on_create(fields: dict[str, Any]) -> None:
            w.labels[fields["id"]] = fields["label"]
            w.cuzk[fields["id"]] = cuzk = Cuzk()
            fields["ports"] = {"9821/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(cuzk.port)}]}

        vast.on_create = on_create
        try:
            yield w
        finally:
            server.stop()
            app.close()
            for c in w.cuzk.values():
                c.server.shutdown()
                c.server.server_close()


def test_tasks_launch_daemons_restart_crash_loops_are_replaced_and_idle_capacity_goes(
    world: World,
) -> None:
    tasks = world.db.post("PoRep", 6)
    world.tick()
    assert sum(world.vast.creates_by_label.values()) == 3  # 6 tasks / 2 per instance
    world.tick(3)  # they boot, register and serve
    assert sum(world.vast.creates_by_label.values()) == 3
    ids = sorted(world.registered)
    assert len(ids) == 3
    for n, iid in enumerate(ids):
        world.db.claim(tasks[2 * n : 2 * n + 2], world.machines[iid])

    a, b = ids[0], ids[1]
    world.cuzk[a].alive = False  # cuzk silently killed, the Curio node still heartbeats
    world.tick(2)
    restarts = world.actions("restart_daemon")
    assert [r["params"]["instance"] for r in restarts] == [str(a)] and world.cuzk[a].alive

    for _ in range(3):  # b's host kills cuzk every time it starts
        world.cuzk[b].alive = False
        world.tick(2)  # two failed probes: down; the agent restarts it
        world.tick(1)  # seen running again: one restart
    world.cuzk[b].alive = False
    world.tick(2)  # two failed probes in a row: dead again, a 4th time
    [replace] = [r for r in world.actions("replace") if r["params"]["instance"] == str(b)]
    assert (
        replace["params"]["block_host"]
        and replace["proposer"] == "rule:replace-crash-looping-instance"
    )
    blocked = {h["machine_id"] for h in world.app.journal.fleet.hosts() if h["blocked_until"]}
    b_machine = str(world.vast.instances[b]["machine_id"])
    assert blocked == {b_machine}
    searches = [json.dumps(r.body) for r in world.vast.of("search")]
    assert b_machine in searches[-1]  # the replacement's offer search excluded b's host

    world.db.finish(tasks)  # the queue drains: 10 idle minutes, then drain and destroy
    world.tick(16)  # (at most one destroy a tick: 10 % of the fleet, at least one)
    drained = world.actions("drain")
    destroyed = {r["params"]["instance"] for r in world.actions("destroy")}
    assert drained and {str(a), str(ids[2])} <= destroyed
    assert all(int(i) not in world.vast.instances for i in destroyed)
    assert max(world.vast.creates_by_label.values()) == 1  # no label was ever created twice


def test_bursts_of_429_and_5xx_and_late_creates_never_duplicate(world: World) -> None:
    world.vast.late_creates = 3  # new instances stay out of the listing for 3 listings
    world.vast.script("create", Lost(Status(500)))  # rents, then the answer is lost
    world.vast.rate_limit("list", 2)
    world.vast.script("list", Status(503), Status(502))
    world.vast.script("search", Status(503))
    world.db.post("PoRep", 4)
    world.tick(6)
    assert sum(world.vast.creates_by_label.values()) == 2
    assert set(world.vast.creates_by_label.values()) == {1}
    launches = [r for r in world.app.journal.actions.recent(1000) if r["action"] == "launch"
                and r["parent_id"] is not None]  # fmt: skip
    assert any(r["result"].get("confirmed_late") for r in launches)


def test_a_status_port_vast_maps_for_two_instances_speaks_for_neither(world: World) -> None:
    """vast lists two instances' status ports at one public address and port: one cuzk
    answers there, and the other instance's dead daemon read as up while it billed. Neither
    answer is counted: both daemons are unknown, and a warning says why."""
    world.db.post("PoRep", 4)
    world.tick(4)
    a, b = sorted(world.registered)
    facts = world.app.controller.provider.list_instances
    assert {i.id: i.daemon for i in facts()} == {str(a): "up", str(b): "up"}
    world.cuzk[b].alive = False
    with world.vast.lock:  # b's status port now maps where a's cuzk answers
        world.vast._instances[b].fields["ports"] = dict(world.vast.instances[a]["ports"])
    daemons = {i.id: i.daemon for i in facts()}
    assert daemons == {str(a): "unknown", str(b): "unknown"}, daemons


def test_a_create_listed_after_it_was_given_up_on_is_the_fleets_and_not_launched_again(
    world: World,
) -> None:
    """A create that answered 502 and rented anyway, listed only after fleetgate gave it up
    as lost (5 minutes of good listings without it): its instance, under the launch's unique
    label, was taken for someone else's, left alone while it billed, and another launched in
    its place for good. It is the fleet's, its launch confirmed late."""
    world.vast.late_creates = 8  # listed 8 listings (minutes) after its create
    world.vast.script("create", Lost(Status(502)))
    world.db.post("PoRep", 2)  # one instance's worth
    world.tick(7)  # 5 minutes: recorded as lost, and one more launched for the tasks
    [first] = [r for r in world.app.journal.actions.recent(1000) if r["action"] == "launch"
               and r["parent_id"] is not None and r["status"] == "lost"]  # fmt: skip
    world.tick(4)  # both are listed now
    listed = {str(i): f["label"] for i, f in world.vast.instances.items()}
    assert first["key"] in listed.values()
    fleet = world.app.controller.provider
    late = next(i for i, label in listed.items() if label == first["key"])
    assert late not in {i.id for i in fleet.foreign}
    [row] = [r for r in world.app.journal.actions.recent(1000) if r["id"] == first["id"]]
    assert row["status"] == "ok" and row["result"]["confirmed_late"], row
    assert max(world.vast.creates_by_label.values()) == 1


def test_a_create_vast_refused_with_an_error_and_rented_anyway_is_the_fleets(world: World) -> None:
    """vast answered a create 400 and rented the instance all the same: listed under the
    launch's unique label, it was read as someone else's, left alone while it billed, and
    another launched in its place. It is the fleet's, its launch confirmed late (its token
    went with the refusal: its agent cannot register, and the lifecycle rules replace it)."""
    refused = '{"success": false, "error": "invalid_args", "msg": "try again"}'
    world.vast.script("create", Lost(Status(400, refused)))
    world.vast.on_create = None  # no agent comes up in it (its token was revoked)
    world.db.post("PoRep", 2)  # one instance's worth
    world.tick(1)
    [failed] = [r for r in world.app.journal.actions.recent(1000) if r["action"] == "launch"
                and r["parent_id"] is not None]  # fmt: skip
    assert failed["status"] == "failed"
    world.tick(3)
    fleet = world.app.controller.provider
    assert not fleet.foreign and len(world.vast.instances) == 1
    [row] = [r for r in world.app.journal.actions.recent(1000) if r["id"] == failed["id"]]
    assert row["status"] == "ok" and "answered the create with an error" in row["result"]["note"]


@pytest.mark.parametrize("fault", [Empty(), Status(410, {"error": "gone"})], ids=["empty", "410"])
def test_an_empty_or_410_listing_changes_nothing_and_is_escalated_once(
    world: World, fault: Any
) -> None:
    tasks = world.db.post("PoRep", 4)
    world.tick(4)
    assert len(world.registered) == 2
    world.db.finish(tasks)
    world.db.post("PoRep", 10)  # more work, and idle... either way nothing may change now
    before = len(world.vast.requests)
    world.vast.script("list", *[fault] * 40)
    world.tick(4)
    changes = [r for r in world.vast.requests[before:] if r.method in ("PUT", "DELETE")]
    assert changes == []
    esc = [e for e in world.app.journal.escalations.recent() if e["kind"] == "sensing_failure"]
    assert len(esc) == 1 and "fleet listing failed" in esc[0]["summary"]
    # not a fleet of none: "instances=0 spend_per_h=0" told people (and the LLM) it was empty
    assert (esc[0]["situation"]["fleet"], esc[0]["situation"]["budget"]) == ({}, {})


def test_status_shows_the_real_fleet_as_the_last_tick_saw_it(world: World) -> None:
    from controller.service.app import status

    world.db.post("PoRep", 4)
    world.tick(4)
    st = status(world.app)
    assert st["provider"] == "vast" and st["instances"] == 2
    assert st["by_stage"] == {"running": 2} and st["demand"]["all"]["pending"] == 4


def test_status_counts_every_instance_on_the_account_that_is_not_the_fleets(
    world: World,
) -> None:
    """An account with other teams' instances: status named the first 20 and said nothing of
    the rest. It names 20 and counts the others."""
    from controller.service.app import status
    from controller.service.status import status_lines

    for n in range(25):
        world.vast.add_instance(label=f"team-b-{n}" if n % 2 else "")
    world.tick(1)
    [line] = [x for x in status_lines(status(world.app)) if x.startswith("not fleetgate's")]
    assert line.endswith(", and 5 more") and line.count(", running)") == 20, line


def test_a_restart_no_agent_picks_up_becomes_a_vast_reboot(world: World) -> None:
    world.db.post("PoRep", 2)
    world.tick(4)
    [iid] = sorted(world.registered)
    world.cuzk[iid].alive = False
    for _ in range(2):  # the second failed probe in a row counts
        world.vast.advance(60)
        world.clock.now += 60
        world.app.controller.tick()  # restart queued for the agent, which stays silent
    assert world.actions("restart_daemon")
    world.clock.now += 1.2  # past the command deadline
    world.vast.advance(60)
    world.app.controller.tick()
    reboots = [r for r in world.vast.requests if r.endpoint == "reboot"]
    assert [r.path for r in reboots] == [f"/api/v0/instances/reboot/{iid}/"]
    [reboot] = world.actions("reboot")  # the shipped rule, on the derived field
    assert reboot["proposer"] == "rule:reboot-when-agent-misses-a-restart"
    store = world.app.controller.provider.lifecycle
    [cmd] = [c for c in store.commands(store.resolve(str(iid)).label)]
    assert cmd.done_at is not None and cmd.result == {  # the reboot closed the command
        "ok": False,
        "detail": "not picked up in time: the instance rebooted",
    }
    world.vast.advance(60)
    world.app.controller.tick()  # nothing overdue any more: no second reboot
    assert len(world.actions("reboot")) == 1


def test_a_drain_the_config_does_not_allow_fails_that_action_only(world: World) -> None:
    from controller.fleet.actions import FleetActions
    from controller.fleet.base import PermanentProviderError

    world.db.post("PoRep", 2)
    world.tick(4)
    [iid] = sorted(world.registered)
    fleet = world.app.controller.actuator.provider  # the acting half of the fleet path
    assert isinstance(fleet, FleetActions)
    fleet.curio.settings = fleet.curio.settings.model_copy(update={"allow_drain": False})
    with pytest.raises(PermanentProviderError, match="not allowed"):
        fleet.drain(str(iid))


def test_one_failed_status_probe_restarts_nothing(world: World) -> None:
    world.db.post("PoRep", 2)
    world.tick(4)
    [iid] = sorted(world.registered)
    world.cuzk[iid].alive = False
    world.tick(1)  # one failed probe
    world.cuzk[iid].alive = True
    world.tick(3)
    assert world.actions("restart_daemon") == []
    track = world.app.journal.fleet.tracks()[str(iid)]
    assert track.daemon == "up" and track.probe_fails == 0  # the blip was counted and forgotten


def test_a_daemon_its_supervisor_restarted_between_two_probes_is_counted(world: World) -> None:
    """supervisord starts cuzk again within a second of its exit, so a probe rarely sees it
    down: a restart between two probes shows only as a later start, even when the uptime has
    grown past the last probe's (the probes are timed by the wall clock, as the uptime is)."""
    world.db.post("PoRep", 2)
    world.tick(4)
    [iid] = sorted(world.registered)
    world.cuzk[iid].restart()
    world.tick(1)  # its uptime went backwards: a restart, as ever
    time.sleep(RESTART_SLACK_S + 0.5)
    world.cuzk[iid].restart()  # exited and started again by its supervisor
    time.sleep(0.2)
    world.tick(1)  # the uptime grew past the last probe's: only the later start shows it
    restarts = [e["detail"] for e in world.app.journal.fleet.events(str(iid))
                if e["kind"] == "restart"]  # fmt: skip
    assert len(restarts) == 2 and "started_later_s" not in restarts[0]
    assert restarts[1]["uptime_now"] > restarts[1]["uptime_before"]
    assert restarts[1]["started_later_s"] > RESTART_SLACK_S
    assert world.actions("restart_daemon") == []  # up all along: nothing to restart


def test_a_daemon_its_supervisor_keeps_restarting_is_replaced_and_its_host_blocked(
    world: World,
) -> None:
    """Up at every probe, restarted by supervisord between them four times in an hour: a
    crash loop the rule for a dead daemon never sees (it is never down)."""
    world.db.post("PoRep", 2)
    world.tick(4)
    [iid] = sorted(world.registered)
    for _ in range(4):
        world.cuzk[iid].started = time.time() - 1000  # has run a while
        world.tick(1)
        world.cuzk[iid].restart()  # exited; its supervisor started it again at once
        world.tick(1)
    [replace] = [r for r in world.actions("replace") if r["params"]["instance"] == str(iid)]
    assert replace["proposer"] == "rule:replace-instance-restarting-on-its-own"
    assert replace["params"]["block_host"] and world.actions("restart_daemon") == []
    blocked = {h["machine_id"] for h in world.app.journal.fleet.hosts() if h["blocked_until"]}
    assert blocked == {str(world.vast.instances[iid]["machine_id"])}


def _changes(world: World) -> list[tuple[str, str]]:
    """The calls that change an instance (not creates): method and path."""
    return [(r.method, r.path) for r in world.vast.requests
            if r.method in ("PUT", "DELETE") and r.endpoint != "create"]  # fmt: skip


def test_a_label_that_looks_like_fleetgates_is_not_fleetgates(world: World) -> None:
    """A person's `fg-box`, another fleetgate's launch label, a bare `fg-`: they were claimed,
    replaced as unregistered and destroyed. Only this journal's launches are its own."""
    ids = [world.vast.add_instance(label=label)
           for label in ("fg-manual-box", "  fg-spaced", "fg-", "fg-9-9-0-abcdef")]  # fmt: skip
    world.tick(18)
    assert _changes(world) == []
    assert not [r for r in world.app.journal.actions.recent(1000) if r["action"] != "launch"]
    foreign = {i.id for i in world.app.controller.provider.foreign}
    assert {str(i) for i in ids} <= foreign


def test_an_instance_relabelled_out_of_the_fleet_is_left_alone(world: World) -> None:
    """The escalation about a stopped instance offers relabelling it out of the fleet; the
    instance was destroyed anyway, its id being one a launch rented."""
    world.db.post("PoRep", 2)
    world.tick(4)
    [iid] = sorted(world.registered)
    with world.vast.lock:
        world.vast._instances[iid].fields["label"] = "keep-me"
    world.vast.set_status(iid, "stopped")
    world.tick(70)
    assert ("DELETE", f"/api/v0/instances/{iid}/") not in _changes(world)
    assert str(iid) in {i.id for i in world.app.controller.provider.foreign}


def test_an_instance_that_relabels_itself_out_of_the_fleet_holds_nothing(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """The only instance of the fleet is relabelled (by a person, or by anything holding a
    key to it, the instance itself among them if its container has one): it was counted as
    vanished from the listing, the provider sensor failed on every tick after, and no launch
    ever answered the queue again. It is listed, so it did not vanish: it left the fleet, as
    one a person relabels does, and the fleet goes on."""
    world.db.post("PoRep", 2)
    world.tick(4)
    [iid] = sorted(world.registered)
    with world.vast.lock:
        world.vast._instances[iid].fields["label"] = "mine-now"
    gone = world.cuzk.pop(iid)  # its agent stops here: it is no longer fleetgate's
    gone.server.shutdown()
    gone.server.server_close()
    with caplog.at_level(logging.WARNING, logger="controller.service.gather"):
        world.tick(2)
    # it still bills: the operator hears of it once, the tick it left
    left = [r.getMessage() for r in caplog.records if "left the fleet" in r.getMessage()]
    assert left == [f"instance {iid} left the fleet: vast lists it with the label 'mine-now', "
                    "not its launch's; it is left alone and still bills until someone "
                    "destroys it"], left  # fmt: skip
    world.db.post("PoRep", 4)
    world.tick(3)
    last = world.app.journal.meta.ticks(1)[0]["summary"]
    assert last["sensors"]["provider"] == "ok"
    assert not [e for e in world.app.journal.escalations.recent()
                if e["kind"] == "sensing_failure"]  # fmt: skip
    assert len(world.actions("launch")) >= 2  # the queue is served by new instances
    assert ("DELETE", f"/api/v0/instances/{iid}/") not in _changes(world)
    assert str(iid) in {i.id for i in world.app.controller.provider.foreign}
    assert str(iid) not in world.app.journal.fleet.tracks()


def test_text_an_instance_controls_starts_no_log_line_and_reaches_no_terminal_raw(
    world: World,
) -> None:
    """The Curio node row an instance's node writes, and its vast label, reached the text log
    and `fleetgate status` raw: a newline in the row forged a log line (a journald entry) of
    its own, an escape sequence in the label set the terminal's title and cleared it, and a
    second line in it read like fleetgate's own."""
    log = io.StringIO()
    cli._logging("INFO", "text")
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(log)
    world.db.post("PoRep", 2)
    world.tick(4)
    [iid] = sorted(world.registered)
    node = world.db.machine(world.machines[iid])["host_and_port"]
    world.db._exec("UPDATE {s}.harmony_machines SET host_and_port = %s WHERE id = %s",
                   [node + "1\nCRITICAL forged by the node", world.machines[iid]])  # fmt: skip
    world.tick(2)
    assert "forged by the node" in log.getvalue()  # it was logged: linked on its own address
    with world.vast.lock:
        world.vast._instances[iid].fields["label"] = "x\x1b]0;owned\x07\x1b[2J\nESCALATION #9"
    gone = world.cuzk.pop(iid)  # relabelled out of the fleet: its agent is not fleetgate's
    gone.server.shutdown()
    gone.server.server_close()
    world.tick(2)
    lines = log.getvalue().splitlines()
    assert not [line for line in lines if line.startswith("CRITICAL")]
    assert "\x1b" not in log.getvalue()
    shown = ok(fg("--state", str(world.app.journal.path.parent), "status")).stdout
    assert "owned" in shown  # the label is shown, escaped
    assert "\x1b" not in shown and "\x07" not in shown
    assert not [line for line in shown.splitlines() if line.startswith("ESCALATION")]


def test_a_nan_price_in_the_listing_fails_no_tick(world: World) -> None:
    """Python's JSON reads NaN: `math.floor` of the spend left raised out of every tick."""
    world.db.post("PoRep", 2)
    world.tick(4)
    [iid] = sorted(world.registered)
    with world.vast.lock:
        world.vast._instances[iid].fields["dph_total"] = float("nan")
    world.db.post("PoRep", 40)
    world.tick(2)  # raised ValueError: cannot convert float NaN to integer
    assert len(world.actions("launch")) >= 2  # the backlog still scales, the instance priced

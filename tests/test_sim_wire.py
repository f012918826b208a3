"""One program: a simulated tick runs the production fleet path, and only the wire is simulated.

`fleetgate run` on the built-in simulator goes through the vast client (HTTP requests answered
by the simulator's transport), the Curio sensor (SQL answered with Curio's rows), the cuzk
health probes and the agents' calls to the instance API, like a real fleet. These tests count
the calls at each seam, and check what a real account holds is handled as on vast.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from support import peer

from controller.fleet.curio import CurioDemand
from controller.fleet.observe import RealFleet
from controller.fleet.vast import VastProvider
from controller.service.app import App, status
from controller.service.assemble import assemble
from controller.service.config import Config
from controller.service.fleet_path import Launched
from controller.store.backend import StaleLeader
from controller.store.lease import Lease
from controller.store.records import LifecycleStore

WORLD = {"boot_s": [30, 30], "pull_s": [30, 30], "register_s": [20, 20],
         "params_s": [60, 60], "bench_s": [60, 60], "stuck_fraction": 0.0,
         "busy_rate_per_h": 120, "quiet_s": 0, "odd_status_per_h": 0.0,
         "daemon_death_per_h": 2.0, "foreign_instances": 3,
         "empty_label_fraction": 0.3}  # fmt: skip


def sim_app(tmp_path: Path, **agents: object) -> App:
    config = Config.model_validate({"sim": {"world": WORLD, "agents": agents},
                                    "escalation": {"channels": []}})  # fmt: skip
    return assemble(config, state=tmp_path / "state", clock=time.time, sleep=time.sleep)


def test_a_simulated_tick_goes_through_every_seam_of_the_real_fleet_path(tmp_path: Path) -> None:
    app = sim_app(tmp_path, vast_id_fraction=0.0, host_and_port_fraction=0.0)
    c, wire = app.controller, app.wire
    assert isinstance(c.provider, RealFleet) and isinstance(c.provider.vast, VastProvider)
    assert isinstance(c.demand, CurioDemand) and isinstance(app.lifecycle, LifecycleStore)
    ticks = 60
    for _ in range(ticks):
        c.tick()
    vast, curio, probes, agents = (wire.vast.calls, wire.curio.calls, wire.probes.calls,
                                   wire.agents.service.calls)  # fmt: skip
    assert vast["list"] >= ticks and vast["search"] >= 1 and vast["create"] >= 2
    assert curio["demand"] == curio["liveness"] == ticks and curio["machines"] == ticks
    assert probes["status"] > 0  # instances past their benchmark are probed every tick
    assert agents["register"] >= 2 and agents["heartbeat"] > ticks and agents["running"] >= 2
    records = app.lifecycle.records()
    listed = {i.id for i in c.provider.list_instances()}
    linked = {r.vast_id for r in records.values()} & listed
    assert linked and all(r.host_and_port for r in records.values() if r.vast_id in linked)
    app.close()


def test_instances_on_the_account_that_fleetgate_did_not_launch_stay_untouched(
    tmp_path: Path,
) -> None:
    app = sim_app(tmp_path)
    for _ in range(90):
        app.controller.tick()
    foreign = status(app)["foreign"]
    assert [f["label"] for f in foreign] == ["jupyter", "", "old-prover"]
    assert {f["status"] for f in foreign} == {"running", "stopped"}
    world = app.sim.world
    assert world.account.foreign_destroyed == 0 and len(world.account.foreign) == 3
    acted = {r["target"] for r in app.journal.actions.recent(10_000, executed_only=False)}
    assert not acted & {f"instance:{f['id']}" for f in foreign} and not acted & {
        f["id"] for f in foreign}  # fmt: skip
    app.close()


def test_a_restart_goes_to_the_agent_not_to_a_vast_reboot(tmp_path: Path) -> None:
    app = sim_app(tmp_path)
    for _ in range(240):
        app.controller.tick()
    restarts = [r for r in app.journal.actions.recent(10_000) if r["action"] == "restart_daemon"]
    assert restarts, "the world's daemons die often enough for a restart in 4 h"
    assert app.wire.agents.service.calls["command_done"] >= 1
    assert app.wire.vast.calls["reboot"] == 0
    app.close()


def test_a_daemon_whose_status_server_never_answers_is_asked_about_not_restarted(
    tmp_path: Path,
) -> None:
    """cuzk's status server is off unless `status_listen` is set (and may listen on 127.0.0.1
    only): its daemon runs and proves, yet never answers the probe. Restarting it used to kill
    its proofs at every cooldown, with no restart ever counted toward the crash-loop limit."""
    world = {**WORLD, "daemon_death_per_h": 0.0, "foreign_instances": 0,
             "status_closed_fraction": 1.0}  # fmt: skip
    config = Config.model_validate({"sim": {"world": world}, "escalation": {"channels": []}})
    app = assemble(config, state=tmp_path / "state", clock=time.time, sleep=time.sleep)
    for _ in range(60):
        app.controller.tick()
    rows = app.journal.actions.recent(10_000)
    assert app.wire.probes.calls["status"] > 0  # probed, and never answered
    assert not [r for r in rows if r["action"] == "restart_daemon" and r["verdict"] == "act"]
    assert [r for r in rows if r["guard"] == "daemon_never_answered"]
    asked = [e for e in app.journal.escalations.recent() if e["kind"] == "guard_veto"]
    assert asked and "never answered GET /status" in asked[0]["summary"]
    assert app.wire.agents.service.calls["command_done"] == 0  # no daemon was killed
    app.close()


def test_an_account_of_more_than_ten_thousand_instances_is_listed_whole() -> None:
    """401 pages of 25: the listing used to stop at 400 pages and fail every tick from then on."""
    import requests
    from pydantic import SecretStr

    from controller.fleet.vast import VastClient, VastSettings
    from controller.sim import SimConfig, Simulation
    from controller.sim.vast_api import SimVastAPI

    sim = Simulation(SimConfig(machines=10_010, foreign_instances=1), seed=3)
    free = sorted(set(sim.world.machines) - sim.world.busy_machines())
    for n, machine in enumerate(free[:10_000]):
        sim.world.launch_on(machine, f"fg-{n}", sim.now())
    session = requests.Session()
    api = SimVastAPI(sim, "key")
    api.mount(session, "https://console.vast.ai")
    settings = VastSettings(api_key=SecretStr("key"), image="img",
                            min_interval_s=dict.fromkeys(("list", "other"), 0.0))  # fmt: skip
    client = VastClient(settings, session, clock=sim.now, sleep=lambda s: None)
    listed = VastProvider(client, settings).list_instances()
    assert len(listed) == 10_001 and api.calls["list"] == 401


def test_launches_of_instances_long_gone_are_forgotten_and_every_live_one_stays_owned(
    tmp_path: Path,
) -> None:
    """Every label shows empty in vast's listing (the account's view): the launches the journal
    holds are all that make an instance fleetgate's. Instances that went more than a day ago
    leave that map, in service and on a restart; every live one stays in it."""
    world = {**WORLD, "empty_label_fraction": 1.0, "busy_s": 7200, "quiet_s": 7200}
    config = Config.model_validate({"sim": {"world": world, "seconds_per_tick": 300},
                                    "escalation": {"channels": []}})  # fmt: skip
    state = tmp_path / "state"
    app = assemble(config, state=state, clock=time.time, sleep=time.sleep)
    for _ in range(480):  # 40 h of virtual time
        app.controller.tick()
    fleet = app.controller.provider
    assert isinstance(fleet, RealFleet)
    launched = fleet.launched()
    ever = {r[1] for r in app.journal.actions.launched_after(0)}
    live = {i.id for i in app.sim.world.live_instances()}
    gone_long_ago = app.journal.fleet.gone_before(app.sim.now() - Launched.FORGET_AFTER_S)
    assert len(ever) > 2 * len(live) and gone_long_ago  # the world churned
    assert live <= set(launched) and not set(launched) & gone_long_ago
    assert {i.id for i in fleet.list_instances()} == live  # each one fleetgate's, by launch alone
    assert all(f["id"] not in live for f in status(app)["foreign"])
    app.controller.after_tick()  # save the world, as `run` does after every tick
    app.close()

    again = assemble(config, state=state, clock=time.time, sleep=time.sleep)
    fleet = again.controller.provider
    assert isinstance(fleet, RealFleet)
    listed = {i.id for i in fleet.list_instances()}
    assert listed == live and not set(fleet.launched()) & gone_long_ago
    again.close()


def test_a_create_confirmed_late_is_owned_by_its_id_even_when_vast_shows_no_label(
    tmp_path: Path,
) -> None:
    """A launch whose create said nothing clear is fleetgate's by its label while it is open;
    once a listing confirms it, by the instance's id, whatever label vast shows from then on
    (it was read only once, as open, and fell out of the fleet when vast dropped the label)."""
    from support import record_action

    from controller.service.fleet_path import Launched
    from controller.store.journal import Journal

    j = Journal(tmp_path / "j.db")
    try:
        parent = record_action(j, 0.0, action="launch", target="fleet", status="ok")
        row = record_action(j, 0.0, action="launch", target="fleet", key="fg-late",
                            parent_id=parent)  # fmt: skip
        j.actions.finish(row, 1.0, "unknown", {"error": "timeout", "label": "fg-late"})
        launched = Launched(j, lambda: 100.0)
        assert (launched(), launched.open_labels()) == ({}, {"fg-late"})
        j.actions.finish(row, 2.0, "ok", {"instance": "77", "label": "fg-late",
                                          "confirmed_late": True})  # fmt: skip
        assert (launched(), launched.open_labels()) == ({"77": "fg-late"}, set())
    finally:
        j.close()


def test_a_controller_that_stood_by_goes_on_from_the_world_the_leader_saved(
    tmp_path: Path,
) -> None:
    """Two controllers on one journal (high availability on the simulator): the one that takes
    over ticks the leader's world on. It ticked the world it had read when it started: the
    virtual clock went back, the leader's instances were gone, and their vast ids were rented
    again for other labels."""
    leader, standby = sim_app(tmp_path), sim_app(tmp_path)
    try:
        for _ in range(15):
            leader.controller.tick()
        assert leader.sim is not None and standby.sim is not None
        ahead = leader.sim.now()
        theirs = {i.id for i in leader.sim.world.live_instances()}
        assert theirs, "the leader launched nothing to take over"
        standby.controller.tick()
        assert standby.sim.now() == ahead + standby.config.sim.seconds_per_tick
        assert theirs <= {i.id for i in standby.sim.world.live_instances()}
        launched = [
            i
            for a in standby.journal.actions.recent(1000, executed_only=True)
            if a["action"] == "launch" and isinstance(a["result"], dict)
            for i in a["result"].get("launched") or []
        ]
        assert launched and len(launched) == len(set(launched))  # no vast id rented twice
        leader.controller.tick()  # and back: the first leader goes on from the other's world
        assert leader.sim.now() == ahead + 2 * leader.config.sim.seconds_per_tick
    finally:
        leader.close()
        standby.close()


def lead_as_a(app: Any, ticks: int) -> None:
    """`app` takes the leader lease as "a" (30 s) and ticks `ticks` times under it."""
    assert Lease(app.journal, "a", ttl_s=30).renew()
    for _ in range(ticks):
        app.controller.tick()


def stall_past_lease(journal_db: Path) -> None:
    """Every lease in the SQLite journal at `journal_db` expired: its holder stalled past it."""
    import sqlite3

    db = sqlite3.connect(journal_db)
    db.execute("UPDATE leases SET expires_at = 0")
    db.commit()
    db.close()


def test_a_leader_that_loses_the_lease_after_writing_its_intents_carries_none_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tick's intents are written (fenced) in one transaction, then carried out one by
    one: a leader paused between the two (SIGSTOP, a VM stall) past its lease, woken after
    another took over, called the provider for them anyway (only a launch's own row was
    fenced, so a restart, a drain or a destroy went out under a lost term)."""
    from controller.service import apply
    from escalation import approvals

    app = sim_app(tmp_path)
    try:
        lead_as_a(app, ticks=12)
        assert app.sim is not None
        target = sorted(i.id for i in app.sim.world.live_instances())[0]
        esc = app.journal.escalations.add_escalation(
            fingerprint="fp", kind="unmatched", subject=f"instance:{target}", summary="odd",
            now=app.sim.now(), deadline=app.sim.now() + 3600,
            situation={"instance": {"id": target}}, default_action={"action": "hold", "params": {}},
        )  # fmt: skip
        approvals.approve(app.journal, esc, by="ops", now=app.sim.now(), action="restart_daemon",
                          params={"instance": target})  # fmt: skip
        written = apply.write

        def then_taken_over(*args: Any, **kw: Any) -> Any:
            out = written(*args, **kw)  # the intents, under a's lease
            stall_past_lease(tmp_path / "state" / "journal.db")  # a stalls past its lease...
            other = peer(app.journal)
            assert Lease(other, "b", ttl_s=30).renew()  # ...and b takes over
            other.close()
            return out

        monkeypatch.setattr(apply, "write", then_taken_over)
        with pytest.raises(StaleLeader, match="held by b"):
            app.controller.tick()
        [row] = app.journal.actions.actions_for_escalation(esc)
        assert row["action"] == "restart_daemon" and row["status"] == "intent", row
    finally:
        app.close()


def test_a_leader_stalled_after_its_plan_writes_nothing_once_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader stalled (SIGSTOP, a VM stall) between reading the journal and writing its tick,
    past its lease, woken after another took over: a tick that carried nothing out (paused, or
    nothing to do) wrote its row and its tracks, read before the stall, over the new leader's
    (only an action's own row was fenced)."""
    leader = sim_app(tmp_path)
    successor = sim_app(tmp_path)
    try:
        lead_as_a(leader, ticks=12)
        leader.journal.meta.put("paused", True)  # its next tick carries nothing out
        reader = peer(leader.journal)  # another process's view of the journal
        planned = leader.controller.plan
        seen: dict[str, Any] = {}

        def then_taken_over(*args: Any, **kw: Any) -> Any:
            out = planned(*args, **kw)  # read and sensed under a's lease
            stall_past_lease(tmp_path / "state" / "journal.db")  # a stalls past its lease...
            assert Lease(successor.journal, "b", ttl_s=30).renew()  # ...b takes over
            successor.controller.tick()
            seen["ticks"] = [t["id"] for t in successor.journal.meta.ticks(100)]
            seen["tracks"] = reader.fleet.tracks()
            return out

        monkeypatch.setattr(leader.controller, "plan", then_taken_over)
        with pytest.raises(StaleLeader, match="held by b"):
            leader.controller.tick()
        monkeypatch.undo()
        assert [t["id"] for t in reader.meta.ticks(100)] == seen["ticks"]  # no row of a's
        assert reader.fleet.tracks() == seen["tracks"]  # b's uptimes, not a's older ones
        reader.close()
    finally:
        leader.close()
        successor.close()


def test_a_leader_stalled_before_its_escalations_raises_and_resolves_none_once_taken_over(
    tmp_path: Path,
) -> None:
    """Stalled past its lease between acting and escalating, a leader woken after another took
    over raised escalations from its old view, or resolved the new leader's."""
    from controller.core.decide import Doubt

    leader = sim_app(tmp_path)
    successor = sim_app(tmp_path)
    try:
        lead_as_a(leader, ticks=2)
        odd = Doubt("unmatched", "instance:odd", "an instance no rule matches", key={"n": 1})
        now = time.time()
        [raised] = leader.controller.escalator.raise_all([odd], {}, {}, now)  # while it leads
        stall_past_lease(tmp_path / "state" / "journal.db")
        assert Lease(successor.journal, "b", ttl_s=30).renew()
        other = Doubt("unmatched", "instance:other", "another no rule matches", key={"n": 2})
        with pytest.raises(StaleLeader, match="held by b"):
            leader.controller.escalator.raise_all([other], {}, {}, now + 60)
        escalator = leader.controller.escalator
        with pytest.raises(StaleLeader, match="held by b"):
            escalator.resolve_cleared([], {}, now + 60)  # to a, odd no longer holds
        pending = successor.journal.escalations.recent(status="pending")
        assert [e["id"] for e in pending] == [raised]  # nothing raised, nothing resolved
    finally:
        leader.close()
        successor.close()

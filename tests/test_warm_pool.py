"""The warm pool: vast's stop and start in the simulator, the client, the guards and the facts.

The simulator bills a stopped instance's storage only and keeps its boot progress; a start may
wait for its host's GPUs; a stopped machine may be lost. The real client sends vast's documented
`PUT /api/v0/instances/{id}/ {"state": ...}` (to the fake vast server and to the simulator's
API); the guards refuse a stop on an instance with tasks and cap the parked ones; the facts read
`parked` from fleetgate's own journaled stop only; a parked instance started beside a `scale_to`
is the capacity that tick rents no new instance for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from support import NO_FAULTS, fact

from controller.core import guards
from controller.core.facts import build_facts
from controller.core.model import Decision, Instance, Observation, Proposal
from controller.core.policy import Guards
from controller.core.track import STOP_TAKES_S, History, advance
from controller.fleet.actuator import Actuator, Job
from controller.fleet.base import NotDone
from controller.fleet.vast import VastProvider, VastSettings
from controller.fleet.vast_client import VastClient
from controller.fleet.vast_instances import to_instance
from controller.sim import SimConfig, Simulation
from controller.sim.vast_api import SimVastAPI
from controller.store.journal import Journal
from controller.tools.replay.run import fleet_states
from tests.fakes.vast_server import Close, FakeVast, Lost

NOW = 200_000.0


def sim(**overrides: Any) -> Simulation:
    config = SimConfig(machines=4, busy_rate_per_h=0.0, **{**NO_FAULTS, **overrides})
    return Simulation(config, seed=3)


def booted(s: Simulation) -> str:
    iid = s.world.launch("fg-a", s.now())
    s.advance(4 * 3600)
    assert (s.world.get(iid).status, s.world.get(iid).stage) == ("running", "running")
    return iid


# ---- the simulator ---------------------------------------------------------------------


def test_a_stopped_instance_counts_as_parked_in_the_report_hours() -> None:
    s = sim()
    iid = booted(s)
    assert fleet_states(s) == {"idle": 1}
    s.world.set_state(iid, "stopped", s.now())
    assert fleet_states(s) == {"parked": 1}  # storage only: not a drained or idle machine


def test_a_stopped_instance_bills_its_storage_only() -> None:
    s = sim()
    iid = booted(s)
    before = s.stats
    s.world.set_state(iid, "stopped", s.now())
    s.advance(10 * 3600)
    after = s.stats
    machine = s.world.machines[s.world.get(iid).machine_id]
    storage = machine.storage_per_gb_h * s.config.disk_gb * 10
    assert after["gpu_hours"] == pytest.approx(before["gpu_hours"])
    assert after["storage_usd"] == pytest.approx(storage)
    assert after["spend_usd"] - before["spend_usd"] == pytest.approx(storage)
    assert 0 < storage / 10 < machine.dph / 3  # an hour stopped costs a fraction of one running


def test_a_start_skips_the_boot_and_serves_in_minutes() -> None:
    s = sim(start_wait_per_h=0.0)
    iid = booted(s)
    rate = s.world.get(iid).bench_rate
    s.world.set_state(iid, "stopped", s.now())
    s.advance(3600)
    s.world.set_state(iid, "running", s.now())
    inst = s.world.get(iid)
    assert (inst.status, inst.stage) == ("loading", "running")  # no pull, params or bench
    s.advance(s.config.start_s[1] + 1)
    inst = s.world.get(iid)
    assert (inst.status, inst.stage, inst.daemon, inst.bench_rate) == ("running", "running", "up",
                                                                       rate)  # fmt: skip
    assert s.stats["instances_launched"] == 1


def test_a_start_waits_while_someone_else_holds_the_hosts_gpus() -> None:
    s = sim(start_wait_per_h=1000.0, start_wait_s=(1800.0, 1800.0))
    iid = booted(s)
    s.world.set_state(iid, "stopped", s.now())
    s.advance(600)
    s.world.set_state(iid, "running", s.now())
    inst = s.world.get(iid)
    assert (inst.status, inst.status_msg.split(":")[0]) == ("stopped", "scheduling")
    gpu_hours = s.stats["gpu_hours"]
    s.advance(1700)
    assert s.world.get(iid).status == "stopped"
    assert s.stats["gpu_hours"] == pytest.approx(gpu_hours)  # waiting bills no GPU
    s.advance(100 + s.config.start_s[1] + 1)
    assert s.world.get(iid).status == "running"


def test_a_stopped_machine_can_be_lost() -> None:
    s = sim(stopped_loss_per_h=50.0)
    iid = booted(s)
    s.world.set_state(iid, "stopped", s.now())
    s.advance(3600)
    assert s.world.get(iid).status == "exited"


def test_without_stops_nothing_changes_and_nothing_bills_storage() -> None:
    s = sim()
    booted(s)
    assert s.stats["storage_usd"] == 0.0


# ---- the client: vast's documented call -------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeVast]:
    with FakeVast(api_key="vast-test-key-warm") as server:
        yield server


def journaled(journal: Journal, action: str, iid: str, at: float) -> tuple[Decision, int]:
    """`action` on `iid` as a tick journals it before acting: its intent row."""
    d = act(action, instance=iid)
    return d, journal.actions.record(
        tick_id=1, now=at, action=action, target=d.proposal.target,
        params=d.effective_params, proposer="rule:warm", reason="r", confidence=0.9,
        verdict="act", why="w", status="intent",
    )  # fmt: skip


def vast_provider(fake: FakeVast, session: requests.Session) -> VastProvider:
    settings = VastSettings(base_url=fake.url, api_key="vast-test-key-warm", image="img:1",
                            timeout_s=2.0)  # fmt: skip
    return VastProvider(VastClient(settings, session, sleep=lambda s: None), settings)


def test_stop_and_start_send_vasts_put_state(fake: FakeVast) -> None:
    iid = fake.add_instance(status="running", label="fg-x")
    with requests.Session() as session:
        provider = vast_provider(fake, session)
        provider.stop(str(iid))
        assert fake.instances[iid]["actual_status"] == "stopped"
        provider.start(str(iid))
    sent = [(q.method, q.path, q.body) for q in fake.requests if q.endpoint == "update"]
    assert sent == [("PUT", f"/api/v0/instances/{iid}/", {"state": "stopped"}),
                    ("PUT", f"/api/v0/instances/{iid}/", {"state": "running"})]  # fmt: skip


def parked_on_the_fleet_path(tmp_path: Path) -> tuple[Any, str, Journal, Any]:
    """A booted simulated instance, parked through the real fleet path (no start waits)."""
    from sim_support import sim_fleet

    s = sim(start_wait_per_h=0.0)
    iid = booted(s)
    journal = Journal(tmp_path / "j.db")
    fleet, _, _ = sim_fleet(s, journal)
    fleet.stop(iid)
    return s, iid, journal, fleet


def test_the_fleet_path_parks_and_starts_through_the_simulated_api(tmp_path: Path) -> None:
    s, iid, journal, fleet = parked_on_the_fleet_path(tmp_path)
    listed = {i.id: i for i in fleet.list_instances()}
    assert listed[iid].status == "stopped"
    assert listed[iid].dph < s.world.machines[s.world.get(iid).machine_id].dph  # storage only
    fleet.start(iid)
    s.advance(s.config.start_s[1] + 1)
    assert s.world.get(iid).status == "running"
    journal.close()


# ---- guards ------------------------------------------------------------------------------


def check(*decisions: Decision, facts: list[dict[str, Any]], **limits: Any) -> list[Decision]:
    by_id = {str(f["id"]): f for f in facts}
    out, _ = guards.check(list(decisions), guards.Context(by_id, History(), Guards(**limits), NOW))
    return out


def act(action: str, **params: Any) -> Decision:
    return Decision(Proposal(action, params, "rule:r", "because", 0.9), "act", "matched")


def test_a_stop_on_an_instance_with_tasks_is_vetoed() -> None:
    facts = [fact("fleet"), fact("instance", "i1", tasks_running=1, drained=False, parked=False)]
    [d] = check(act("stop", instance="i1"), facts=facts)
    assert (d.verdict, d.guard) == ("veto", "drain_before_stop")


def test_a_stop_on_an_undrained_idle_instance_drains_it_first() -> None:
    facts = [fact("fleet"), fact("instance", "i1", tasks_running=0, drained=False, parked=False)]
    [d] = check(act("stop", instance="i1"), facts=facts)
    assert (d.verdict, d.effective_action) == ("act", "drain")


def test_a_drained_idle_instance_is_stopped_within_max_parked_and_destroyed_beyond() -> None:
    idle = {"tasks_running": 0, "drained": True, "parked": False}
    facts = [fact("fleet", instances=3, parked=1), fact("instance", "i1", **idle),
             fact("instance", "i2", **idle)]  # fmt: skip
    a, b = check(act("stop", instance="i1"), act("stop", instance="i2"), facts=facts,
                 max_parked=2)  # fmt: skip
    assert (a.verdict, a.effective_action) == ("act", "stop")
    # the pool is full: the idle instance goes, as it would have without the warm pool
    assert (b.verdict, b.effective_action, b.guard) == ("act", "destroy", "max_parked")


def test_a_stop_keeps_min_instances_unparked() -> None:
    idle = {"tasks_running": 0, "drained": True, "parked": False}
    facts = [fact("fleet", instances=2, parked=1), fact("instance", "i1", **idle)]
    [d] = check(act("stop", instance="i1"), facts=facts, min_instances=1)
    assert (d.verdict, d.guard) == ("veto", "min_instances")
    [d] = check(act("stop", instance="i1"), facts=facts, min_instances=0)
    assert (d.verdict, d.effective_action) == ("act", "stop")


def parked_fact(iid: str, **extra: Any) -> dict[str, Any]:
    return fact("instance", iid, status="stopped", daemon="down", sidecar="down",
                tasks_running=0, parked=True, parked_for_s=600.0, dph=0.07, **extra)  # fmt: skip


def test_a_start_is_the_capacity_scale_to_wanted_and_counts_as_a_launch() -> None:
    facts = [fact("fleet", instances=3, active=2, parked=1), parked_fact("p1")]
    scale, start = check(act("scale_to", count=3), act("start", instance="p1"), facts=facts)
    assert (start.verdict, start.effective_action) == ("act", "start")
    assert scale.verdict == "noop"  # the start is the third instance: nothing is rented
    more, start = check(act("scale_to", count=4), act("start", instance="p1"), facts=facts)
    assert more.effective_params == {"count": 1} and start.verdict == "act"
    [capped] = check(act("start", instance="p1"), facts=facts, max_instances=2)
    assert (capped.verdict, capped.guard) == ("veto", "max_instances")


def test_only_the_starts_scale_to_wants_are_made() -> None:
    facts = [fact("fleet", instances=4, active=2, parked=2), parked_fact("p1"),
             parked_fact("p2")]  # fmt: skip
    _, a, b = check(act("scale_to", count=3), act("start", instance="p1"),
                    act("start", instance="p2"), facts=facts)  # fmt: skip
    assert (a.verdict, b.verdict) == ("act", "noop")


def test_the_starts_go_to_the_fastest_parked_instances() -> None:
    """Two starts wanted, three parked: the two whose hosts prove fastest start, whatever the
    rules' order; the host's journaled rate wins over the instance's benchmark, and a host
    that was blocked (rate 0) starts last."""
    facts = [fact("fleet", instances=5, active=2, parked=3),
             parked_fact("p1", machine_id="m1", bench_rate=30.0),
             parked_fact("p2", machine_id="m2", bench_rate=55.0),
             parked_fact("p3", machine_id="m3", bench_rate=40.0)]  # fmt: skip
    starts = [act("start", instance=i) for i in ("p1", "p2", "p3")]
    _, a, b, c = check(act("scale_to", count=4), *starts, facts=facts)
    assert [d.verdict for d in (a, b, c)] == ["noop", "act", "act"]
    assert "faster parked instances start first" in a.why
    by_id = {str(f["id"]): f for f in facts}
    hist = History(host_rates={"m1": 50.0, "m2": 55.0, "m3": 40.0}, host_failures={"m2": 1})
    out, _ = guards.check([act("scale_to", count=4), *starts],
                          guards.Context(by_id, hist, Guards(), NOW))  # fmt: skip
    assert [d.verdict for d in out[1:]] == ["act", "noop", "act"]  # m2 was blocked: last
    # room for all three: no ranking, every start is made
    out = check(act("scale_to", count=5), *starts, facts=facts)
    assert [d.verdict for d in out[1:]] == ["act", "act", "act"]


def test_rent_to_rents_only_that_far_and_leaves_the_rest_of_count_to_the_warm_pool() -> None:
    facts = [fact("fleet", instances=4, active=2, parked=2), parked_fact("p1"),
             parked_fact("p2")]  # fmt: skip
    # the burst wants 6; a boot would help only up to 3: both parked start, nothing is rented
    scale, a, b = check(act("scale_to", count=6, rent_to=3), act("start", instance="p1"),
                        act("start", instance="p2"), facts=facts)  # fmt: skip
    assert (a.verdict, b.verdict) == ("act", "act")
    assert scale.verdict == "noop" and "rents up to 3" in scale.why
    # with no parked instance, it rents up to rent_to, not to count
    [scale] = check(act("scale_to", count=6, rent_to=3), facts=facts[:1])
    assert (scale.verdict, scale.effective_action, scale.effective_params) == (
        "act", "launch", {"count": 1})  # fmt: skip
    [scale] = check(act("scale_to", count=6), facts=facts[:1])  # without: to count
    assert scale.effective_params == {"count": 4}
    [scale] = check(act("scale_to", count=6, rent_to=9), facts=facts[:1])  # above: count
    assert scale.effective_params == {"count": 4}


def test_a_start_already_waiting_is_not_sent_again() -> None:
    facts = [fact("fleet", parked=0), parked_fact("p1", starting_for_s=60.0)]
    [d] = check(act("start", instance="p1"), facts=facts)
    assert d.verdict == "noop"


# ---- facts: parked is fleetgate's own stop ---------------------------------------------


def inst(iid: str, status: str) -> Instance:
    return Instance(id=iid, label=f"fg-{iid}", machine_id="m1", host_id="h1", status=status,
                    stage="running", daemon="down" if status != "running" else "up",
                    sidecar="down" if status != "running" else "up", gpu_name="RTX 4090",
                    num_gpus=1, dph=0.07 if status == "stopped" else 0.6)  # fmt: skip


def facts_at(hist: History, now: float, *instances: Instance) -> tuple[History, dict[str, Any]]:
    obs = Observation(now=now, instances=tuple(instances), demand=(), sensors=())
    tracks, _ = advance(hist, obs, now)
    hist = History(instances=tracks, last_acted=hist.last_acted)
    return hist, {str(f["id"]): f for f in build_facts(obs, hist, now)}


def test_parked_only_when_fleetgate_stopped_it_until_it_runs_after_a_start() -> None:
    hist, _ = facts_at(History(), NOW, inst("a", "running"), inst("b", "running"))
    hist = History(instances=hist.instances, last_acted={"stop:instance:a": NOW + 10})
    hist, f = facts_at(hist, NOW + 60, inst("a", "stopped"), inst("b", "stopped"))
    assert (f["a"]["parked"], f["a"]["parked_for_s"]) == (True, 50.0)
    assert f["b"]["parked"] is False and "parked_for_s" not in f["b"]  # someone else's stop
    assert (f["fleet"]["parked"], f["fleet"]["active"]) == (1, 1)
    acted = {"stop:instance:a": NOW + 10, "start:instance:a": NOW + 70}
    hist = History(instances=hist.instances, last_acted=acted)
    hist, f = facts_at(hist, NOW + 100, inst("a", "loading"), inst("b", "stopped"))
    assert f["a"]["parked"] and f["a"]["starting_for_s"] == 30.0
    assert (f["fleet"]["parked"], f["fleet"]["active"]) == (0, 2)  # on its way, as a launch
    hist, f = facts_at(hist, NOW + 200, inst("a", "running"), inst("b", "stopped"))
    assert f["a"]["parked"] is False
    # the journal's stop, older than its start, does not park it again
    hist, f = facts_at(hist, NOW + 300, inst("a", "stopped"), inst("b", "stopped"))
    assert f["a"]["parked"] is False


def test_a_stop_whose_answer_was_lost_parks_the_instance_vast_stopped(
    fake: FakeVast, tmp_path: Path
) -> None:
    """vast stopped it and the connection dropped before its answer: the stop is journaled
    with an unknown outcome, not as failed, and the stopped instance is parked (it was a
    stopped instance fleetgate did not stop: asked about at 15 minutes, replaced at 1 h)."""
    iid = fake.add_instance(status="running", label="fg-x")
    fake.script("update", Lost(Close()))
    journal = Journal(tmp_path / "j.db")
    hist, _ = facts_at(journal.fleet.history(NOW), NOW, inst(str(iid), "running"))
    journal.fleet.save_tracks(hist.instances, [])
    d, row = journaled(journal, "stop", str(iid), NOW + 10)
    with requests.Session() as session:
        outcome = Actuator(vast_provider(fake, session), journal, Guards()).execute(
            Job(d, row, 1, History(), NOW + 10, {}))  # fmt: skip
    assert fake.instances[iid]["actual_status"] == "stopped"
    assert outcome.status == "unknown" and "may have reached vast" in outcome.result["error"]
    _, f = facts_at(journal.fleet.history(NOW + 60), NOW + 60, inst(str(iid), "stopped"))
    journal.close()
    assert (f[str(iid)]["parked"], f[str(iid)]["parked_for_s"]) == (True, 50.0)


def test_a_start_whose_answer_was_lost_counts_as_asked(fake: FakeVast, tmp_path: Path) -> None:
    """vast took the start and the connection dropped before its answer, and the host's GPUs
    are taken (it shows `scheduling`): journaled as failed, no start was asked, no rule
    matched it (not stopped, no `starting_for_s`) and its storage billed for good. Journaled
    with an unknown outcome, its start is asked: destroyed after waiting 10 minutes."""
    a = str(fake.add_instance(status="stopped", label="fg-x"))
    fake.script("update", Lost(Close()))
    journal = Journal(tmp_path / "j.db")

    hist, _ = facts_at(journal.fleet.history(NOW), NOW, inst(a, "running"))
    journal.fleet.save_tracks(hist.instances, [])
    _, stop = journaled(journal, "stop", a, NOW + 10)
    journal.actions.finish(stop, NOW + 10, "ok", {})
    hist, f = facts_at(journal.fleet.history(NOW + 60), NOW + 60, inst(a, "stopped"))
    journal.fleet.save_tracks(hist.instances, [])
    assert f[a]["parked"]
    d, start = journaled(journal, "start", a, NOW + 100)
    with requests.Session() as session:
        outcome = Actuator(vast_provider(fake, session), journal, Guards()).execute(
            Job(d, start, 1, History(), NOW + 100, {}))  # fmt: skip
    assert outcome.status == "unknown"
    _, f = facts_at(journal.fleet.history(NOW + 700), NOW + 700, inst(a, "scheduling"))
    journal.close()
    assert f[a]["parked"] and f[a]["starting_for_s"] == 600.0


def test_a_parked_instance_started_without_a_journaled_start_is_no_longer_parked() -> None:
    """Its start answered nothing clear (journaled as failed) but vast carried it out, or a
    person started it in vast's console: running again after it was seen stopped, it is not
    parked (it stayed parked while it ran: not active, so the fleet rented beside it)."""
    hist, _ = facts_at(History(), NOW, inst("a", "running"))
    hist = History(instances=hist.instances, last_acted={"stop:instance:a": NOW + 10})
    hist, f = facts_at(hist, NOW + 60, inst("a", "stopped"))
    assert f["a"]["parked"] and f["fleet"]["parked"] == 1
    hist, f = facts_at(hist, NOW + 120, inst("a", "loading"))
    assert f["a"]["parked"]  # not running yet; started by someone: on its way, as if asked
    assert f["a"]["starting_for_s"] == 0.0 and f["fleet"]["parked"] == 0
    for at in (NOW + 200, NOW + 300):
        hist, f = facts_at(hist, at, inst("a", "running"))
        assert f["a"]["parked"] is False and "parked_for_s" not in f["a"]
        assert (f["fleet"]["parked"], f["fleet"]["active"]) == (0, 1)
    hist = History(instances=hist.instances,  # parked again by a later stop of its own
                   last_acted={"stop:instance:a": NOW + 400})  # fmt: skip
    _, f = facts_at(hist, NOW + 460, inst("a", "stopped"))
    assert f["a"]["parked"] and f["a"]["parked_for_s"] == 60.0


def test_a_journaled_stop_that_never_took_leaves_the_instance_unparked() -> None:
    """The controller died between the stop's intent and vast's call (or the call failed
    unclearly and did nothing): the instance runs on. Parked while vast may still carry the
    stop out, it is not parked once it has run `STOP_TAKES_S` past the stop."""
    hist, _ = facts_at(History(), NOW, inst("a", "running"))
    hist = History(instances=hist.instances, last_acted={"stop:instance:a": NOW + 10})
    hist, f = facts_at(hist, NOW + 60, inst("a", "running"))
    assert f["a"]["parked"]  # vast may not show the stop yet
    for at in (NOW + 10 + STOP_TAKES_S, NOW + 2 * STOP_TAKES_S):
        hist, f = facts_at(hist, at, inst("a", "running"))
        assert f["a"]["parked"] is False
        assert (f["fleet"]["parked"], f["fleet"]["active"]) == (0, 1)


def test_the_journaled_stop_is_what_parks_it(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.db")
    hist, _ = facts_at(journal.fleet.history(NOW), NOW, inst("a", "running"))
    journal.fleet.save_tracks(hist.instances, [])
    p = Proposal("stop", {"instance": "a"}, "rule:park", "idle", 0.9)
    row = journal.actions.record(
        tick_id=1, now=NOW + 10, action="stop", target=p.target, params=p.params,
        proposer=p.proposer, reason=p.reason, confidence=0.9, verdict="act", why="w",
        status="intent",
    )  # fmt: skip
    journal.actions.finish(row, NOW + 10, "ok", {})
    _, f = facts_at(journal.fleet.history(NOW + 60), NOW + 60, inst("a", "stopped"))
    journal.close()
    assert (f["a"]["parked"], f["a"]["parked_for_s"]) == (True, 50.0)


def test_starts_in_the_last_hour_are_what_the_journal_started(tmp_path: Path) -> None:
    """`fleet.starts_1h`: parked instances the journal shows started (act, not failed) in the
    last hour; an older start, a failed one and another action do not count."""
    journal = Journal(tmp_path / "j.db")
    for n, (iid, at, action, status) in enumerate([
        ("a", NOW - 600, "start", "ok"), ("b", NOW - 3000, "start", "intent"),
        ("c", NOW - 4000, "start", "ok"), ("d", NOW - 60, "start", "failed"),
        ("e", NOW - 60, "stop", "ok"),
    ]):  # fmt: skip
        row = journal.actions.record(
            tick_id=n + 1, now=at, action=action, target=f"instance:{iid}",
            params={"instance": iid}, proposer="rule:x", reason="r", confidence=0.9,
            verdict="act", why="w", status="intent",
        )  # fmt: skip
        if status != "intent":
            journal.actions.finish(row, at, status, {})
    _, f = facts_at(journal.fleet.history(NOW), NOW, inst("a", "running"))
    journal.close()
    assert f["fleet"]["starts_1h"] == 2  # a and b


# ---- a parked instance started instead of a new rental ----------------------------------


def test_a_parked_instance_is_started_instead_of_a_new_rental(tmp_path: Path) -> None:
    s, iid, journal, fleet = parked_on_the_fleet_path(tmp_path)
    facts = [fact("fleet", instances=1, active=0, serving=0, parked=1), parked_fact(iid)]
    plan = check(act("scale_to", count=1), act("start", instance=iid), facts=facts)
    actuator = Actuator(fleet, journal, Guards())
    for d in plan:
        if d.verdict != "act":
            continue
        row = journal.actions.record(tick_id=1, now=s.now(), action=d.effective_action,
                                     target=d.proposal.target, params=d.effective_params,
                                     proposer="rule:r", reason="r", confidence=0.9,
                                     verdict="act", why="w", status="intent")  # fmt: skip
        actuator.execute(Job(d, row, 1, History(), s.now(), {iid: facts[1]}))
    s.advance(s.config.start_s[1] + 1)
    assert [d.verdict for d in plan] == ["noop", "act"]
    assert s.world.get(iid).status == "running"
    assert s.stats["instances_launched"] == 1  # no new rental
    journal.close()


def test_a_backlog_that_does_not_drain_rents_every_slot_it_needs() -> None:
    """The warm pool's rules hold rentals to what the measured task time says a boot helps;
    once a task has waited 20 minutes, the rule renting for every pending task outranks both
    that hold rentals back, so the tick acts on it (a tie would be decided by name)."""
    from controller.core.decide import resolve
    from controller.rules.source import read_rulebook

    folder = Path(__file__).parent.parent / "controller" / "examples" / "warm-pool"
    rules = {r.name: r for r in read_rulebook([folder]).rules}
    overdue = rules["scale-to-proving-backlog-overdue"]
    held = [rules["scale-to-proving-backlog"], rules["scale-to-proving-burst"]]
    assert all(overdue.priority > r.priority for r in held)
    props = [Proposal("scale_to", {"count": 30, "rent_to": 11}, f"rule:{r.name}", r.description,
                      0.9, priority=r.priority) for r in held]  # fmt: skip
    props.append(Proposal("scale_to", {"count": 30}, f"rule:{overdue.name}", overdue.description,
                          0.9, priority=overdue.priority))  # fmt: skip
    winners, lost, doubts = resolve(props)
    assert [w.proposer for w in winners] == ["rule:scale-to-proving-backlog-overdue"]
    assert winners[0].params == {"count": 30} and not doubts
    assert {d.verdict for d in lost} == {"superseded"}


@pytest.mark.parametrize("action, status", [("stop", "running"), ("start", "stopped")])
def test_a_stop_or_start_vast_refused_before_acting_is_failed_not_unknown(
    fake: FakeVast, tmp_path: Path, action: str, status: str
) -> None:
    """A 429 on every attempt: vast refused before acting, so nothing happened. Journaled
    as unknown, a refused stop would count a running instance as parked for 10 minutes (out
    of the active fleet), and a refused start would send a parked one to be destroyed."""
    iid = fake.add_instance(status=status, label="fg-x")
    fake.rate_limit("update", 10)
    journal = Journal(tmp_path / "j.db")
    d, row = journaled(journal, action, str(iid), NOW + 10)
    with requests.Session() as session:
        actuator = Actuator(vast_provider(fake, session), journal, Guards())
        try:
            outcome = actuator.execute(Job(d, row, 1, History(), NOW + 10, {}))
            status_seen = outcome.status
        except NotDone:
            status_seen = "failed"
    journal.close()
    assert fake.instances[iid]["actual_status"] == status
    assert status_seen == "failed"


def test_a_parked_instance_someone_else_started_that_waits_for_its_host_is_let_go() -> None:
    """Started in vast's console (or by a start whose answer was lost) while its host's GPUs
    are taken: `scheduling`, with no start of fleetgate's. It was parked with no
    `starting_for_s`, so neither warm-pool rule on a parked instance matched it (one wants it
    stopped, the other a start asked) and its storage billed for good. Seen leaving `stopped`
    it counts as started from then: capacity on its way, and let go after 10 minutes."""
    hist, _ = facts_at(History(), NOW, inst("a", "running"))
    hist = History(instances=hist.instances, last_acted={"stop:instance:a": NOW + 10})
    hist, f = facts_at(hist, NOW + 60, inst("a", "stopped"))
    assert f["a"]["parked"] and "starting_for_s" not in f["a"]
    hist, f = facts_at(hist, NOW + 120, inst("a", "scheduling"))
    assert f["a"]["starting_for_s"] == 0.0
    assert (f["fleet"]["parked"], f["fleet"]["active"]) == (0, 1)
    hist, f = facts_at(hist, NOW + 720, inst("a", "scheduling"))
    assert f["a"]["parked"] and f["a"]["starting_for_s"] == 600.0
    [d] = check(act("start", instance="a"), facts=list(f.values()))
    assert d.verdict != "act"  # no second start: it is starting already
    # as vast lists it: stopped, with intended_status running (its start waits for the GPUs)
    hist, _ = facts_at(History(), NOW, inst("c", "running"))
    hist = History(instances=hist.instances, last_acted={"stop:instance:c": NOW + 10})
    hist, f = facts_at(hist, NOW + 60, inst("c", "stopped"))
    waiting = dataclasses.replace(inst("c", "stopped"), intended_status="running")
    hist, f = facts_at(hist, NOW + 120, waiting)
    assert f["c"]["starting_for_s"] == 0.0 and f["fleet"]["parked"] == 0
    _, f = facts_at(hist, NOW + 720, waiting)
    assert f["c"]["parked"] and f["c"]["starting_for_s"] == 600.0
    # a stop of its own that never took (still running) is not read as someone's start
    hist, _ = facts_at(History(), NOW, inst("b", "running"))
    hist = History(instances=hist.instances, last_acted={"stop:instance:b": NOW + 10})
    hist, f = facts_at(hist, NOW + 60, inst("b", "loading"))
    assert "starting_for_s" not in f["b"]


def test_a_start_vast_queued_for_its_hosts_gpus_is_asked_not_failed(
    fake: FakeVast, tmp_path: Path
) -> None:
    """Someone rented the parked instance's GPUs: vast answers the start with HTTP 200,
    success false and "Required resources are currently unavailable, state change queued."
    and starts it once they are free. Read as a refusal, the start was journaled failed: no
    `starting_for_s`, so the warm pool's rule that lets a start go after 10 minutes never
    matched, the start was sent again every tick and each tick's `scale_to` counted it as the
    capacity it rented nothing for, for the 6 h the instance stayed parked."""
    iid = fake.add_instance(status="stopped", label="fg-x")
    fake.taken_hosts.add(iid)
    journal = Journal(tmp_path / "j.db")
    d, row = journaled(journal, "start", str(iid), NOW + 10)
    with requests.Session() as session:
        provider = vast_provider(fake, session)
        outcome = Actuator(provider, journal, Guards()).execute(
            Job(d, row, 1, History(), NOW + 10, {})
        )
        shown = fake.instances[iid]
        assert (shown["actual_status"], shown["intended_status"]) == ("stopped", "running")
        fake.taken_hosts.clear()  # the GPUs are free again: vast starts it
        fake.set_status(iid, None)
        assert provider.list_instances()[0].status == "running"
    assert outcome.status == "ok"
    acted = journal.fleet.history(NOW + 20).last_acted
    journal.close()
    assert acted[f"start:instance:{iid}"] == NOW + 10  # asked: starting_for_s counts from it
    replies = [q for q in fake.requests if q.endpoint == "update"]
    assert [q.body for q in replies] == [{"state": "running"}]  # sent once, not retried


def test_a_start_the_simulated_vast_queues_is_answered_as_vast_does(tmp_path: Path) -> None:
    """The simulator's start that waits for its host's GPUs answers as vast's does (success
    false, "state change queued"), and the fleet path takes it as asked."""
    from sim_support import sim_fleet

    s = sim(start_wait_per_h=1000.0, start_wait_s=(1800.0, 1800.0))
    iid = booted(s)
    journal = Journal(tmp_path / "j.db")
    fleet, _, _ = sim_fleet(s, journal)
    fleet.stop(iid)
    s.advance(600)
    fleet.start(iid)  # does not raise: vast took the start
    inst = s.world.get(iid)
    assert (inst.status, inst.start_at) == ("stopped", s.now() + 1800.0)
    api = SimVastAPI(s, "k")
    with requests.Session() as session:
        api.mount(session, "http://vast.test")
        again = session.put(
            f"http://vast.test/api/v0/instances/{iid}/",
            json={"state": "running"},
            headers={"Authorization": "Bearer k"},
        )
    assert again.status_code == 200
    assert again.json() == {
        "success": False,
        "msg": "Required resources are currently unavailable, state change queued.",
    }
    journal.close()


def test_the_listing_carries_vasts_intended_status() -> None:
    raw = {"id": 7, "actual_status": "stopped", "intended_status": "running", "dph_total": 0.02}
    assert to_instance(raw).intended_status == "running"
    assert to_instance({"id": 8, "actual_status": "running"}).intended_status == ""


# ---- a stopped instance as vast lists it ------------------------------------------------


def test_a_stopped_instance_listed_exited_reads_as_stopped_and_a_dead_one_as_exited() -> None:
    """vast's docs list a stopped instance `stopped`; instances stopped with `vastai stop
    instance` have been reported listed `exited` with `intended_status: stopped`. Only a
    container that exited while meant to run is dead."""

    def status(actual: str | None, intended: str | None) -> str:
        return to_instance({"id": 7, "actual_status": actual, "intended_status": intended}).status

    assert status("exited", "stopped") == "stopped"
    assert status("stopped", "stopped") == "stopped"
    assert status("exited", "running") == "exited"
    assert status("exited", None) == "exited"
    assert status("stopped", "running") == "stopped"  # a start waiting for the host's GPUs


def warm_engine() -> Any:
    from controller.rules.engine import Engine
    from controller.rules.source import read_rulebook

    root = Path(__file__).parent.parent
    folder = root / "controller" / "examples" / "warm-pool"
    return Engine(read_rulebook([root / "rules" / "lifecycle.yaml", folder / "scaling.yaml"]))


@pytest.mark.parametrize("stopped_as", ["stopped", "exited"])
def test_a_parked_instance_is_kept_and_started_however_vast_lists_it_stopped(
    fake: FakeVast, stopped_as: str
) -> None:
    """Parked through vast's API and listed back over HTTP, 10 minutes on: the lifecycle
    rules do not destroy it as dead (an instance listed `exited` for 3 minutes), and the warm
    pool's rule starts it for a burst. Read as vast's `actual_status` alone, the `exited`
    listing was destroyed 3 minutes after every park."""
    fake.stopped_as = stopped_as
    iid = str(fake.add_instance(status="running", label="fg-x"))
    with requests.Session() as session:
        provider = vast_provider(fake, session)
        [running] = provider.list_instances()
        hist, _ = facts_at(History(), NOW, dataclasses.replace(running, stage="running"))
        provider.stop(iid)
        hist = History(instances=hist.instances, last_acted={f"stop:instance:{iid}": NOW + 10})
        assert fake.instances[int(iid)]["actual_status"] == stopped_as
        [listed] = provider.list_instances()
    assert (listed.status, listed.intended_status) == ("stopped", "stopped")
    listed = dataclasses.replace(listed, stage="running")
    for at in (NOW + 60, NOW + 660):
        hist, f = facts_at(hist, at, listed)
    assert f[iid]["parked"] and f[iid]["status"] == "stopped" and f[iid]["status_for_s"] == 600
    burst = fact("demand", "all", task="all", pending=10, running=0, forecast_instances=5,
                 oldest_pending_s=0)  # fmt: skip
    fired = {m.rule for m in warm_engine().match([*f.values(), burst], NOW + 660)}
    assert "destroy-dead-instance" not in fired
    assert "start-parked-for-proving-burst" in fired


def test_the_simulator_lists_stopped_instances_both_ways_and_the_fleet_path_reads_them_stopped(
    tmp_path: Path,
) -> None:
    """Two parked instances (consecutive ids): vast's object for one says `stopped`, for the
    other `exited` with `intended_status: stopped`; the fleet path reads both as stopped."""
    from sim_support import sim_fleet

    from controller.sim import vast_views as views

    s = sim(start_wait_per_h=0.0)
    ids = [s.world.launch(f"fg-{k}", s.now()) for k in range(2)]
    s.advance(4 * 3600)
    journal = Journal(tmp_path / "j.db")
    fleet, _, _ = sim_fleet(s, journal)
    for iid in ids:
        fleet.stop(iid)
    listed = {i.id: i for i in fleet.list_instances()}
    journal.close()
    assert [listed[iid].status for iid in ids] == ["stopped", "stopped"]
    objects = [views.instance(s.world.get(iid), s.world.machines[s.world.get(iid).machine_id],
                              f"fg-{k}") for k, iid in enumerate(ids)]  # fmt: skip
    shown = sorted((o["actual_status"], o["intended_status"]) for o in objects)
    assert shown == [("exited", "stopped"), ("stopped", "stopped")]

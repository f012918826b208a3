"""Hosts are ranked for later launches by how fast Curio timed their nodes, not by the rate an
instance reports of itself.

The Curio side runs against a real PostgreSQL (FLEETGATE_TEST_PG_DSN; a fresh schema per test,
`fakes.curio_db`), the journal is the real SQLite one, and the ranking is vast's offer ranking
(`rank_offers`). The last tests run the same query through the simulator's Curio rows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fakes.curio_db import CurioDB
from support import Claim, curio_schema

from controller.core.gpu_rates import max_plausible
from controller.core.model import Instance
from controller.core.track import MIN_MEASURED_TASKS, History, Measured, advance, timed_as_claim
from controller.fleet.base import LaunchRequest
from controller.fleet.curio import CurioDemand, CurioSettings, TaskTiming, node_rates, task_seconds
from controller.fleet.observe import RealFleet
from controller.fleet.vast_offers import GOOD_RATE, rank_offers
from controller.service.app import App
from controller.service.assemble import assemble
from controller.service.config import Config
from controller.service.gather import Gathered, gather
from controller.sim import SimConfig, Simulation
from controller.sim.addresses import curio_node, vast_machine_id
from controller.sim.curio_rows import SimCurio
from controller.sim.world import Completed
from controller.store.journal import Journal

DSN = os.environ.get("FLEETGATE_TEST_PG_DSN", "host=127.0.0.1 port=5432 dbname=test user=postgres")
GPU = "RTX 4090"
CLAIM_MAX = max_plausible(GPU)  # the highest claim a 4090 gets stored: a liar's best
T0 = 1_700_000_000.0


@pytest.fixture
def db() -> Iterator[CurioDB]:
    with curio_schema(DSN) as curio:
        yield curio


def runs(db: CurioDB, node: str, n: int, seconds: float, *, name: str = "PoRep",
         ago_s: float = 60.0, side_by_side: int = 1, result: bool = True) -> None:  # fmt: skip
    """`n` runs of `seconds` each on `node`, back to back (`side_by_side` at a time), the last
    ending `ago_s` ago by the database clock."""
    rows = []
    for i in range(n):
        end_ago = ago_s + (i // side_by_side) * seconds
        rows.append((i, name, end_ago + seconds + 5, end_ago + seconds, end_ago, result, node))
    insert_history(db, rows)


def settings(db: CurioDB, **fields: Any) -> CurioSettings:
    return CurioSettings.model_validate(
        {"dsn": DSN, "schema_name": db.schema, "measure_every_s": 0, **fields}, strict=False
    )


# --- a fleet of listed instances, their agents' claims and their Curio nodes ----------------


@dataclass(frozen=True)
class Host:
    iid: str
    machine: str
    ip: str
    claim: float | None  # the bench rate the instance reports of itself
    node: str | None = None  # the host_and_port its agent names (default: its own)
    port: int = 12300  # its Curio node's public port

    @property
    def own_node(self) -> str:
        return f"{self.ip}:{self.port}"


class Vast:
    def __init__(self, hosts: list[Host]) -> None:
        self.hosts = hosts

    @property
    def last_raw(self) -> dict[str, dict[str, str]]:
        return {h.iid: {"public_ipaddr": h.ip} for h in self.hosts}

    def confirm_gone(self, ids: list[str]) -> set[str]:
        return set(ids)  # missing from the listing: destroyed

    def list_instances(self) -> list[Instance]:
        return [Instance(h.iid, f"fg-{h.iid}", h.machine, f"h{h.iid}", "running", "loading",
                         "unknown", "unknown", gpu_name=GPU) for h in self.hosts]  # fmt: skip


class Lifecycle:
    def __init__(self, hosts: list[Host]) -> None:
        self.hosts = hosts

    def records(self) -> dict[str, Claim]:
        return {f"fg-{h.iid}": Claim(f"fg-{h.iid}", "running", h.claim, h.node or h.own_node,
                                     vast_id=h.iid) for h in self.hosts}  # fmt: skip

    def overdue_commands(self, now: float) -> list[Any]:
        return []


class Fleet:
    """RealFleet over the fake listing, real Curio (PostgreSQL) and the real journal."""

    def __init__(self, db: CurioDB, hosts: list[Host], journal: Journal, **curio: Any) -> None:
        for h in hosts:
            db.add_machine(h.own_node)
        self.curio = CurioDemand(settings(db, **curio))
        self.vast, self.lifecycle = Vast(hosts), Lifecycle(hosts)
        self.now = T0
        self.fleet = RealFleet(vast=self.vast, lifecycle=self.lifecycle, curio=self.curio,
                               check_health=lambda _: {}, clock=lambda: self.now,
                               launched=self.launched)  # fmt: skip
        self.journal = journal

    def launched(self) -> dict[str, str]:
        """What the journal's launches rented: every host's instance (they are all the fleet's)."""
        return {i.id: i.label for i in self.vast.list_instances()}

    def tick(self, hosts: list[Host] | None = None) -> Gathered:
        """One gather and the journaling of what it revealed (as a tick's apply does)."""
        if hosts is not None:
            self.vast.hosts = self.lifecycle.hosts = hosts
        self.now += 60
        g = gather(self.journal, self.fleet, self.curio, self.now, pending_s=600)
        tracks, events = advance(g.history, g.observation, self.now)
        self.journal.fleet.save_tracks(tracks, events)
        return g

    def history(self) -> History:
        return self.tick().history


def offers(*machines: str) -> list[dict[str, Any]]:
    return [{"id": n + 1, "machine_id": m, "dph_total": 0.5} for n, m in enumerate(machines)]


def ranked(hist: History, *machines: str) -> list[str]:
    request = LaunchRequest("fg-x", prefer_rates=tuple(sorted(hist.launch_rates().items())))
    return [str(o["machine_id"]) for o in rank_offers(offers(*machines), request, 1.0)]


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.db")
    yield j
    j.close()


SLOW = Host("5001", "m-slow", "10.1.0.1", claim=CLAIM_MAX)
FAST = Host("5002", "m-fast", "10.1.0.2", claim=25.0)


def test_a_host_claiming_the_most_plausible_rate_but_timed_slow_ranks_below_a_fast_one(
    db: CurioDB, journal: Journal
) -> None:
    fleet = Fleet(db, [SLOW, FAST], journal)
    first = fleet.history()
    # before Curio timed anything, the claims decide: the liar's clamped claim ranks it first
    assert first.host_rates == {} and ranked(fleet.history(), "m-fast", "m-slow")[0] == "m-slow"
    runs(db, SLOW.own_node, 5, 1800.0)  # 2 PoReps an hour
    runs(db, FAST.own_node, 8, 300.0, side_by_side=2)  # 24 an hour, two at a time
    hist = fleet.history()
    assert hist.host_rates == {"m-slow": CLAIM_MAX, "m-fast": 25.0}  # the claims, as stored
    assert hist.measured_rates() == pytest.approx({"m-slow": 2.0, "m-fast": 24.0}, rel=0.01)
    assert ranked(hist, "m-slow", "m-fast") == ["m-fast", "m-slow"]
    # journaled: the events say what Curio measured, and the next tick ranks from them too
    [measured] = [e for e in journal.fleet.events("5001") if e["kind"] == "measured"]
    assert measured["detail"]["machine_id"] == "m-slow" and measured["detail"]["tasks"] == 5
    assert measured["detail"]["host_and_port"] == SLOW.own_node and measured["detail"]["enough"]
    assert fleet.history().measured["m-slow"].rate == pytest.approx(2.0, rel=0.01)


def test_the_measured_rate_stays_apart_from_the_instances_bench_rate(
    db: CurioDB, journal: Journal
) -> None:
    """A slow measurement is no benchmark: the instance's bench_rate (what the slow-instance
    rules judge) and its host's benchmark stay the claim."""
    fleet = Fleet(db, [FAST], journal)
    runs(db, FAST.own_node, 4, 3600.0)  # 1 an hour: far slower than it benchmarked
    g = fleet.tick()
    [inst] = g.observation.instances
    assert inst.bench_rate == 25.0
    assert g.history.measured_now["m-fast"].rate == pytest.approx(1.0, rel=0.01)
    hist = fleet.history()
    assert hist.instances["5002"].bench_rate == 25.0 and hist.host_rates["m-fast"] == 25.0
    assert hist.launch_rates()["m-fast"] == pytest.approx(1.0, rel=0.01)


def test_a_host_with_fewer_than_three_timed_tasks_falls_back_to_its_claim(
    db: CurioDB, journal: Journal
) -> None:
    fleet = Fleet(db, [SLOW, FAST], journal)
    fleet.tick()
    runs(db, SLOW.own_node, MIN_MEASURED_TASKS - 1, 1800.0)
    runs(db, FAST.own_node, MIN_MEASURED_TASKS, 600.0)
    hist = fleet.history()
    assert hist.measured_now["m-slow"].tasks == MIN_MEASURED_TASKS - 1
    assert hist.launch_rates()["m-slow"] == CLAIM_MAX  # too few samples: the claim stands
    assert hist.launch_rates()["m-fast"] == pytest.approx(6.0, rel=0.01)
    [few] = [e for e in journal.fleet.events("5001") if e["kind"] == "measured"]
    assert few["detail"]["enough"] is False  # journaled all the same
    runs(db, SLOW.own_node, 1, 1800.0, ago_s=4000.0)  # a third: now it is measured
    hist = fleet.history()
    assert hist.launch_rates()["m-slow"] == pytest.approx(2.0, rel=0.01)
    assert sum(e["kind"] == "measured" for e in journal.fleet.events("5001")) == 2


def test_an_instance_cannot_raise_its_hosts_rank_by_its_own_claim_once_measured(
    db: CurioDB, journal: Journal
) -> None:
    fleet = Fleet(db, [Host("5001", "m-slow", "10.1.0.1", claim=5.0), FAST], journal)
    fleet.tick()
    runs(db, SLOW.own_node, 4, 1800.0)
    runs(db, FAST.own_node, 8, 300.0, side_by_side=2)
    fleet.tick()
    # it benchmarks again and claims the most a 4090 may: stored as its benchmark, not its rank
    fleet.tick([SLOW, FAST])
    hist = fleet.history()
    assert hist.host_rates["m-slow"] == CLAIM_MAX
    assert hist.launch_rates()["m-slow"] == pytest.approx(2.0, rel=0.01)
    assert ranked(hist, "m-slow", "m-fast") == ["m-fast", "m-slow"]
    # a replacement on the same host (a new node, nothing timed yet) claims the most again:
    # the journaled measurement still ranks the host, the new claim does not
    fleet.tick([FAST])
    again = Host("5003", "m-slow", "10.1.0.1", claim=CLAIM_MAX, port=12301)
    db.add_machine(again.own_node)
    hist = fleet.tick([again, FAST]).history
    assert "m-slow" not in hist.measured_now and hist.measured["m-slow"].instance_id == "5001"
    assert hist.launch_rates()["m-slow"] == pytest.approx(2.0, rel=0.01)
    assert ranked(hist, "m-slow", "m-fast") == ["m-fast", "m-slow"]
    # a host that was blocked is known slow, whatever Curio timed
    journal.fleet.block_host("m-fast", fleet.now - 1, "crash-looping")
    assert fleet.history().launch_rates()["m-fast"] == 0.0


def test_an_instance_naming_another_instances_node_gets_none_of_its_times(
    db: CurioDB, journal: Journal
) -> None:
    thief = Host("5001", "m-thief", "10.1.0.9", claim=5.0, node=FAST.own_node)
    fleet = Fleet(db, [thief, FAST], journal)  # with its own node, which ran nothing
    runs(db, FAST.own_node, 4, 300.0)
    fleet.tick()
    hist = fleet.history()
    assert set(hist.measured_now) == {"m-fast"}
    assert hist.launch_rates()["m-thief"] == 5.0


def test_a_node_whose_times_are_implausible_is_held_to_its_gpus_bound(
    db: CurioDB, journal: Journal
) -> None:
    fleet = Fleet(db, [FAST], journal)
    fleet.tick()  # its claim is journaled
    runs(db, FAST.own_node, 50, 1.0)  # a proof a second: a node clock that lies
    hist = fleet.history()
    assert hist.measured_rates()["m-fast"] == CLAIM_MAX
    assert hist.launch_rates()["m-fast"] == 25.0  # timed faster than it claims: the claim ranks


def test_timings_of_long_work_do_not_rank_honest_hosts_as_slow() -> None:
    """A queue of long tasks times every host at a fraction of its claim: among peers the
    timings are put on the claims' scale, so honest hosts keep their claims and only the
    one that does a fraction of what its peers do for their claims ranks by its timing."""
    claims = {"m-a": 40.0, "m-b": 30.0, "m-c": 20.0, "m-d": 35.0, "m-liar": CLAIM_MAX}
    timed = {"m-a": 4.2, "m-b": 2.9, "m-c": 2.1, "m-d": 3.3, "m-liar": 0.5}  # tasks of ~8 proofs
    scaled = timed_as_claim(claims, timed)
    assert scaled["m-a"] == pytest.approx(40.0, rel=0.1)
    hist = History(host_rates=claims, measured={
        m: Measured(m, f"10.0.0.1:{n}", f"i-{n}", 9, 9 * 3600.0 / r, r, 0.0)
        for n, (m, r) in enumerate(timed.items())})  # fmt: skip
    rates = hist.launch_rates()
    assert {m: rates[m] for m in ("m-a", "m-b", "m-c", "m-d")} == {
        "m-a": 40.0, "m-b": 30.0, "m-c": 20.0, "m-d": 35.0}  # fmt: skip
    assert rates["m-liar"] == pytest.approx(0.5 * scaled["m-a"] / 4.2, rel=0.01)
    assert rates["m-liar"] < GOOD_RATE  # rented after every host that does what it claims
    # with too few peers to scale by, a timing is taken as it is
    assert timed_as_claim({"m-a": 40.0}, {"m-a": 4.2}) == {"m-a": 4.2}


def test_only_recent_successful_proving_runs_are_timed(db: CurioDB) -> None:
    node = "10.1.0.5:12300"
    runs(db, node, 3, 600.0)
    runs(db, node, 5, 60.0, result=False)  # failed runs prove nothing
    runs(db, node, 5, 60.0, name="SDR")  # not a task this fleet proves
    runs(db, node, 5, 60.0, ago_s=8 * 3600.0)  # outside the window
    [timed] = CurioDemand(settings(db)).task_timings()
    assert (timed.host_and_port, timed.task, timed.tasks) == (node, "PoRep", 3)
    assert timed.mean_s == pytest.approx(600.0) and timed.covered_s == pytest.approx(1800.0)
    wider = CurioDemand(settings(db, measure_window_s=9 * 3600.0)).task_timings()
    assert [t.tasks for t in wider] == [8]
    runs(db, "10.1.0.6:12300", 3, 600.0, name="WdPost")
    assert len(CurioDemand(settings(db)).task_timings()) == 2
    assert len(CurioDemand(settings(db, measure_max_rows=1)).task_timings()) == 1


def test_a_failed_history_read_keeps_the_listing_and_the_last_reading(
    db: CurioDB, journal: Journal
) -> None:
    fleet = Fleet(db, [FAST], journal)
    runs(db, FAST.own_node, 4, 300.0)
    assert fleet.history().measured_now["m-fast"].tasks == 4
    db.conn.execute(psycopg.sql.SQL("DROP TABLE {}.harmony_task_history").format(
        psycopg.sql.Identifier(db.schema)))  # fmt: skip
    g = fleet.tick()
    assert g.observation.sensor_ok("provider") and len(g.observation.instances) == 1
    assert g.history.measured_now["m-fast"].tasks == 4


def test_the_history_is_read_at_most_every_measure_every_s(db: CurioDB, journal: Journal) -> None:
    fleet = Fleet(db, [FAST], journal, measure_every_s=300)
    fleet.tick()
    runs(db, FAST.own_node, 4, 300.0)
    assert fleet.history().measured_now == {}  # 60 s later: not read again yet
    for _ in range(4):
        fleet.tick()
    assert fleet.history().measured_now["m-fast"].tasks == 4


def test_node_rates_weigh_tasks_and_count_side_by_side_runs_once() -> None:
    timings = [TaskTiming("a:1", "PoRep", 4, 900.0, 1800.0),  # two at a time for 30 min
               TaskTiming("a:1", "WinPost", 10, 10.0, 100.0),
               TaskTiming("b:1", "SDR", 100, 1.0, 100.0)]  # fmt: skip
    rates = node_rates({"PoRep": 1.0, "WinPost": 0.1}, timings)
    assert set(rates) == {"a:1"}
    assert rates["a:1"].tasks == 14 and rates["a:1"].busy_s == 1900.0
    assert rates["a:1"].rate == pytest.approx(3600.0 * (4 + 1.0) / 1900.0)


def test_task_seconds_are_the_fleets_own_runs_per_weighted_task() -> None:
    timings = [TaskTiming("a:1", "PoRep", 4, 900.0, 1800.0),
               TaskTiming("b:1", "PoRep", 2, 600.0, 1200.0),
               TaskTiming("a:1", "WinPost", 10, 10.0, 100.0),
               TaskTiming("x:1", "PoRep", 50, 5.0, 250.0),  # not the fleet's node
               TaskTiming("a:1", "SDR", 100, 1.0, 100.0)]  # not a proving task here  # fmt: skip
    out = task_seconds({"PoRep": 1.0, "WinPost": 0.1}, timings, {"a:1", "b:1"})
    assert out["PoRep"] == pytest.approx((4 * 900 + 2 * 600) / 6)
    assert out["WinPost"] == pytest.approx(10.0)
    # all: seconds of work per task as demand weighs them (a WinPost is a tenth of one)
    assert out["all"] == pytest.approx((4 * 900 + 2 * 600 + 10 * 10) / (6 + 10 * 0.1))
    assert task_seconds({"PoRep": 1.0}, timings, {"z:1"}) == {}


def test_how_long_a_task_takes_is_timed_on_the_fleets_own_nodes_only(
    db: CurioDB, journal: Journal
) -> None:
    fleet = Fleet(db, [FAST], journal)
    assert fleet.tick().history.task_s == {}  # nothing timed yet
    runs(db, FAST.own_node, 4, 300.0)
    runs(db, "10.9.9.9:12300", 6, 5000.0)  # a node of the operator's own, slower work
    assert fleet.tick().history.task_s == pytest.approx({"PoRep": 300.0, "all": 300.0}, rel=0.01)


# --- the simulator's Curio rows answer the same query ------------------------------------


def test_the_simulated_history_answers_as_postgres_does(db: CurioDB) -> None:
    """The same runs in the world and in a real Curio schema read the same."""
    sim = Simulation(SimConfig(machines=4), seed=3)
    now = sim.now()
    world_runs = [
        Completed(1, "PoRep", now - 4000, now - 3000, now - 1200, "10001", "m001"),
        Completed(2, "PoRep", now - 4000, now - 2800, now - 1000, "10001", "m001"),  # alongside
        Completed(3, "PoRep", now - 900, now - 900, now - 60, "10001", "m001"),
        Completed(4, "WinPost", now - 100, now - 80, now - 50, "10002", "m002"),
        Completed(5, "PoRep", now - 9e4, now - 9e4, now - 8e4, "10002", "m002"),  # too old
    ]
    sim.world.completed.extend(world_runs)
    nodes = {r.instance_id: curio_node(r.instance_id, r.machine_id) for r in world_runs}
    rows = [(r.task_id, r.name, now - r.posted, now - r.work_start, now - r.work_end, True,
             nodes[r.instance_id]) for r in world_runs]  # fmt: skip
    insert_history(db, rows)
    real = CurioDemand(settings(db)).task_timings()
    simulated = CurioDemand(settings(db), connect=SimCurio.of(sim).connect).task_timings()
    assert len(real) == 2 and [(t.host_and_port, t.task, t.tasks) for t in simulated] == [
        (t.host_and_port, t.task, t.tasks) for t in real]  # fmt: skip
    for s, r in zip(simulated, real, strict=True):
        assert s.mean_s == pytest.approx(r.mean_s, abs=0.01)
        assert s.covered_s == pytest.approx(r.covered_s, abs=0.01)
    assert real[0].covered_s == pytest.approx(2000 + 840)  # 1800 + 200 past it + 840


WORLD = {"boot_s": [30, 30], "pull_s": [30, 30], "register_s": [20, 20],
         "params_s": [60, 60], "bench_s": [60, 60], "stuck_fraction": 0.0,
         "busy_rate_per_h": 120, "quiet_s": 0, "odd_status_per_h": 0.0,
         "daemon_death_per_h": 0.0, "service_min_s": 300.0, "service_max_s": 600.0}  # fmt: skip


def sim_app(tmp_path: Path) -> App:
    config = Config.model_validate({"sim": {"world": WORLD}, "escalation": {"channels": []}})
    return assemble(config, state=tmp_path / "state", clock=time.time, sleep=time.sleep)


def test_a_simulated_tick_times_hosts_through_the_sim_wire(tmp_path: Path) -> None:
    app = sim_app(tmp_path)
    c = app.controller
    for _ in range(120):
        c.tick()
    assert app.wire.curio.calls["timings"] >= 1
    measured = [e for e in app.journal.fleet.events(limit=100_000) if e["kind"] == "measured"]
    assert measured, "two hours of a busy queue time some host"
    world = app.sim.world
    for e in measured:  # each is the node of the instance on that machine, as the world ran it
        [machine] = {r.machine_id for r in world.completed if r.instance_id == e["instance_id"]}
        assert e["detail"]["machine_id"] == str(vast_machine_id(machine))
        assert e["detail"]["host_and_port"] == curio_node(e["instance_id"], machine)
    tracks = app.journal.fleet.history(app.sim.now()).instances
    live = [i for i in world.live_instances() if i.id in {e["instance_id"] for e in measured}]
    assert live
    for inst in live:  # the benchmark stays the instance's own, whatever Curio timed
        assert tracks[inst.id].bench_rate == inst.bench_rate
    planned = c.plan(c.clock())  # as `explain` plans: what the next launch would rank by
    # how long a task takes, timed as the hosts are: the world's service times (300-600 s)
    [demand] = [f for f in planned.facts if f["kind"] == "demand" and f["task"] == "all"]
    assert 300.0 <= demand["task_s"] <= 600.0
    assert planned.history.task_s["all"] == pytest.approx(demand["task_s"], abs=1e-3)
    timed = {m: x.rate for m, x in planned.history.measured_now.items() if x.enough}
    assert timed, "some host ran three tasks in two hours"
    rates = planned.history.launch_rates()
    claims = planned.history.host_rates
    assert any(claims.get(m) not in (None, r) for m, r in timed.items())  # claims kept apart
    # the world's hosts do what they claim: each timed host ranks by its claim, or by its
    # timing on the claims' scale where that is under half the claim
    scaled = timed_as_claim(claims, timed)
    for m in timed:
        claim = claims.get(m)
        slow = claim is None or scaled[m] < claim * 0.5
        assert rates[m] == pytest.approx(scaled[m] if slow else claim)
    app.close()


def insert_history(db: CurioDB, rows: list[tuple[Any, ...]]) -> None:
    """Rows of Curio's harmony_task_history: (task_id, name, posted, work_start, work_end
    as seconds ago, result, completed_by_host_and_port)."""
    db.conn.cursor().executemany(
        psycopg.sql.SQL(
            "INSERT INTO {}.harmony_task_history (task_id, name, posted, work_start, work_end,"
            " result, err, completed_by_host_and_port) VALUES (%s, %s,"
            " now() - make_interval(secs => %s), now() - make_interval(secs => %s),"
            " now() - make_interval(secs => %s), %s, '', %s)"
        ).format(psycopg.sql.Identifier(db.schema)),
        rows,
    )

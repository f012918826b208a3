"""The production Curio sensor over the simulated world's Curio rows (controller.sim.curio_rows).

`CurioDemand(settings, connect=SimCurio.of(sim).connect)` must read what Curio's tables would
hold for the world. The contract test at the end writes the same rows into a real Curio schema
in PostgreSQL (FLEETGATE_TEST_PG_DSN; it fails, never skips, when that is unreachable) and
checks that the sensor reads the same there.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from fakes.curio_db import CurioDB
from psycopg import sql
from support import NO_FAULTS

from controller.core.model import Demand
from controller.fleet.base import SensorError, StaleReading
from controller.fleet.curio import CurioDemand, CurioSettings
from controller.sim import SimConfig, Simulation
from controller.sim.addresses import curio_node, operator_node
from controller.sim.curio_rows import TEXTS_CACHED, SimCurio, UnknownQuery

DSN = os.environ.get("FLEETGATE_TEST_PG_DSN", "host=127.0.0.1 port=5432 dbname=test user=postgres")
# every stage takes a fixed time: an instance launched at t serves from t + 450 s
STAGE_S = {"boot_s": (100, 100), "pull_s": (100, 100), "register_s": (50, 50),
           "params_s": (100, 100), "bench_s": (100, 100)}  # fmt: skip
BUSY = {"busy_rate_per_h": 150.0, "service_min_s": 4000.0, "service_max_s": 5000.0}


@dataclass
class Fleet:
    sim: Simulation
    serving: list[str]
    lost: str  # frozen ~3 min ago: Curio still lists it, its tasks stalled
    booting: str  # loading: sidecar never up
    launched: str  # provisioning


def make_fleet(**overrides: Any) -> Fleet:
    config = SimConfig(**{**NO_FAULTS, **STAGE_S, **BUSY, "machines": 20, **overrides})
    sim = Simulation(config, seed=5)

    def launch(label: str) -> str:
        return sim.world.launch(label, sim.now())

    serving = [launch(f"s{n}") for n in range(3)]
    lost = launch("lost")
    sim.advance(500)
    sim.world.get(lost).frozen_at = sim.now() + 1  # the host freezes it
    sim.advance(10)
    booting = launch("booting")
    sim.advance(150)
    launched = launch("launched")
    sim.advance(20)
    return Fleet(sim, serving, lost, booting, launched)


@pytest.fixture
def fleet() -> Fleet:
    return make_fleet()


def settings(**fields: Any) -> CurioSettings:
    return CurioSettings(dsn=DSN, **fields)


def sensor(sim: Simulation, **fields: Any) -> CurioDemand:
    return CurioDemand(settings(**fields), connect=SimCurio.of(sim).connect)


def queue_tasks(sim: Simulation) -> list[dict[str, Any]]:
    return list(sim.world.queue.to_json()["tasks"])


def by_task(demand: list[Demand]) -> dict[str, Demand]:
    return {d.task: d for d in demand}


# --- harmony_task


def test_demand_per_task_and_all_match_the_world_queue(fleet: Fleet) -> None:
    sim, now = fleet.sim, fleet.sim.now()
    tasks = queue_tasks(sim)
    assert {t["owner"] for t in tasks} == {None, *fleet.serving, fleet.lost}  # all listed
    weights = {"PoRep": 0.3, "UpdateProve": 1.0, "PSProve": 2.0, "WdPost": 1.0, "WinPost": 1.0}

    demand = by_task(sensor(sim, tasks=weights).demand())

    for name in weights:
        mine = [t for t in tasks if t["name"] == name]
        pending = [t for t in mine if t["owner"] is None]
        oldest = max((now - t["posted"] for t in pending), default=0.0)
        retries = max((t["retries"] for t in pending), default=0)
        assert demand[name] == Demand(name, len(pending), len(mine) - len(pending), oldest, retries)
    pending = sum(weights[n] * demand[n].pending for n in weights)
    running = sum(weights[n] * demand[n].running for n in weights)
    assert demand["all"].pending == math.ceil(pending - 1e-6) > 0
    assert demand["all"].running == math.ceil(running - 1e-6) > 0


def test_released_tasks_are_pending_with_one_more_retry(fleet: Fleet) -> None:
    sim = fleet.sim
    owned = [t for t in queue_tasks(sim) if t["owner"] == fleet.serving[0]]
    assert owned
    sim.world.reboot(fleet.serving[0], sim.now())  # its node drops what it holds

    demand = by_task(sensor(sim).demand())

    assert demand["all"].max_retries == 1
    assert demand["all"].pending == sum(1 for t in queue_tasks(sim) if t["owner"] is None)
    sim.advance(80)  # back up: it claims the oldest pending tasks, its own retried ones
    retried = [t for t in queue_tasks(sim) if t["retries"]]
    assert retried and all(t["owner"] == fleet.serving[0] for t in retried)
    assert by_task(sensor(sim).demand())["all"].max_retries == 0  # counts pending tasks only


def test_a_deleted_node_owns_nothing_any_more(fleet: Fleet) -> None:
    sim = fleet.sim
    before = by_task(sensor(sim).demand())["all"]
    stalled = sum(1 for t in queue_tasks(sim) if t["owner"] == fleet.lost)
    assert stalled
    inst = sim.world.get(fleet.lost)
    assert inst.sidecar_seen_at is not None
    inst.sidecar_seen_at -= 600  # Curio has deleted its row; the world has not released yet

    after = by_task(sensor(sim).demand())["all"]

    assert (after.pending, after.running) == (before.pending + stalled, before.running - stalled)
    assert int(fleet.lost) not in [m.id for m in sensor(sim).machines()]


# --- harmony_machines


def test_machines_are_the_operator_nodes_and_the_instances_seen_up(fleet: Fleet) -> None:
    sim = fleet.sim
    world = sim.world
    owned = Counter(t["owner"] for t in queue_tasks(sim))

    machines = sensor(sim).machines()

    listed = [*fleet.serving, fleet.lost]
    assert [m.id for m in machines] == [1, *map(int, listed)]
    assert machines[0].host_and_port == operator_node(1) and machines[0].running_tasks == 0
    for m, iid in zip(machines[1:], listed, strict=True):
        assert m.host_and_port == curio_node(iid, world.get(iid).machine_id)
        assert (m.running_tasks, m.unschedulable, m.stale) == (owned[iid], False, False)
    ages = {m.id: m.last_contact_age_s for m in machines}
    assert ages[1] == ages[int(fleet.serving[0])] == 0.0
    assert 170 <= ages[int(fleet.lost)] <= 190  # frozen at 501, now 680


def test_a_node_silent_longer_than_curio_allows_disappears(fleet: Fleet) -> None:
    sim = fleet.sim
    sim.advance(400)  # the lost node silent ~590 s: listed, not yet stale
    (lost,) = [m for m in sensor(sim).machines() if m.id == int(fleet.lost)]
    assert 580 <= lost.last_contact_age_s < 600 and not lost.stale

    sim.advance(30)

    assert int(fleet.lost) not in [m.id for m in sensor(sim).machines()]
    assert not [t for t in queue_tasks(sim) if t["owner"] == fleet.lost]  # released


def silent_fleet(operator_nodes: int) -> Simulation:
    """Every instance frozen 200 s ago (the booting ones before their nodes came up)."""
    fleet = make_fleet(operator_nodes=operator_nodes)
    for iid in [*fleet.serving, fleet.booting, fleet.launched]:
        fleet.sim.world.get(iid).frozen_at = fleet.sim.now() + 1
    fleet.sim.advance(200)
    return fleet.sim


def test_a_silent_fleet_is_stale_unless_an_operator_node_heartbeats() -> None:
    with pytest.raises(StaleReading, match=r"none of its 4 node\(s\) has checked in for 200 s"):
        sensor(silent_fleet(0), heartbeat_stale_s=150).demand()

    sim = silent_fleet(2)
    assert by_task(sensor(sim, heartbeat_stale_s=150).demand())["all"].pending > 0
    assert [m.id for m in sensor(sim).machines()][:3] == [1, 2, 10001]


# --- drain


def test_drain_and_undrain_change_the_world(fleet: Fleet) -> None:
    sim = fleet.sim
    curio = sensor(sim, allow_drain=True)
    node = fleet.serving[1]
    address = curio_node(node, sim.world.get(node).machine_id)

    assert curio.drain(int(node)) == 1
    assert sim.world.get(node).drained is True
    assert curio.undrain(address) == 1
    assert sim.world.get(node).drained is False
    assert curio.drain(operator_node(1)) == 1
    assert sim.world.drained_operators == {1}
    assert [m.unschedulable for m in curio.machines()][:3] == [True, False, False]
    assert Simulation.from_json(sim.to_json()).world.drained_operators == {1}
    assert curio.undrain(1) == 1 and sim.world.drained_operators == set()


def test_a_long_run_of_drains_keeps_only_a_few_query_texts(fleet: Fleet) -> None:
    """A drain's query is composed anew each time: the rows' text cache stays bounded (a
    simulator left running, as `make run` does, would otherwise keep every one it sent)."""
    sim = fleet.sim
    rows = SimCurio.of(sim)
    curio = CurioDemand(settings(allow_drain=True), connect=rows.connect)
    node = fleet.serving[0]
    for _ in range(100):
        assert curio.drain(int(node)) == 1 and curio.undrain(int(node)) == 1
    assert sim.world.get(node).drained is False
    assert 0 < len(rows._texts) <= TEXTS_CACHED


@pytest.mark.parametrize("which", ["unknown", "launched", "booting"])
def test_draining_a_node_curio_does_not_list_changes_nothing(fleet: Fleet, which: str) -> None:
    target = {"unknown": "424242", "launched": fleet.launched, "booting": fleet.booting}[which]

    with pytest.raises(SensorError, match="no Curio machine with id"):
        sensor(fleet.sim, allow_drain=True).drain(target)
    if which != "unknown":
        assert fleet.sim.world.get(target).drained is False


def test_a_drained_node_claims_nothing(fleet: Fleet) -> None:
    sim = fleet.sim
    sensor(sim, allow_drain=True).drain(fleet.serving[2])
    sim.world.reboot(fleet.serving[2], sim.now())  # drops its tasks
    sim.advance(600)

    assert not [t for t in queue_tasks(sim) if t["owner"] == fleet.serving[2]]


def test_old_states_without_the_new_fields_load(fleet: Fleet) -> None:
    data = fleet.sim.to_json()
    del data["world"]["drained_operators"]
    for inst in data["world"]["instances"]:
        del inst["sidecar_seen_at"]

    sim = Simulation.from_json(data)
    assert [m.id for m in sensor(sim).machines()] == [1]  # nobody seen yet
    sim.advance(10)
    assert len(sensor(sim).machines()) == 1 + len(fleet.serving)  # the lost one stays unseen


# --- the wire


def test_an_unknown_query_raises(fleet: Fleet) -> None:
    conn = SimCurio.of(fleet.sim).connect(settings())
    with conn, conn.cursor() as cur:
        with pytest.raises(UnknownQuery, match="no answer for this query"):
            cur.execute(sql.SQL("SELECT count(*) FROM {}.harmony_task").format(
                sql.Identifier("curio")))  # fmt: skip
        with pytest.raises(UnknownQuery):
            cur.execute("SELECT 1")
        assert cur.execute("SELECT set_config('statement_timeout', %s, true)", ["9"]).fetchall()
    assert conn.closed


def test_a_write_in_a_read_only_transaction_is_refused(fleet: Fleet) -> None:
    from controller.fleet.curio import _SET_UNSCHEDULABLE

    query = sql.SQL(_SET_UNSCHEDULABLE).format(
        schema=sql.Identifier("curio"), match=sql.SQL("{} = %s").format(sql.Identifier("id"))
    )
    conn = SimCurio.of(fleet.sim).connect(settings())
    conn.read_only = True
    with conn, conn.cursor() as cur, pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        cur.execute(query, [True, 1])
    assert fleet.sim.world.drained_operators == set()


# --- the contract: the same rows in a real Curio schema read the same


@pytest.fixture
def db() -> Iterator[CurioDB]:
    try:
        with CurioDB(DSN) as curio:
            yield curio
    except psycopg.OperationalError as exc:
        pytest.fail(f"test PostgreSQL unreachable at {DSN!r} ({exc})", pytrace=False)


def write_rows(db: CurioDB, curio: SimCurio, now: float) -> None:
    """SimCurio's harmony_machines and harmony_task rows, ages kept, into the real tables."""
    table = sql.Identifier(db.schema, "harmony_machines")
    machines = sql.SQL(
        "INSERT INTO {} (id, host_and_port, cpu, ram, gpu, unschedulable, last_contact)"
        " VALUES (%s, %s, 32, 274877906944, 1, %s, now() - make_interval(secs => %s))"
    ).format(table)
    tasks = sql.SQL(  # update_time is posted_time in SimCurio's rows
        "INSERT INTO {} (name, owner_id, posted_time, update_time, retries, added_by)"
        " VALUES (%s, %s, now() - make_interval(secs => %s), now() - make_interval(secs => %s),"
        " %s, 0)"
    ).format(sql.Identifier(db.schema, "harmony_task"))
    with db.conn.transaction(), db.conn.cursor() as cur:
        cur.executemany(machines, [(m.id, m.host_and_port, m.unschedulable,
                                    now - m.last_contact) for m in curio.machines()])  # fmt: skip
        cur.executemany(tasks, [(n, o, now - p, now - p, r) for n, o, p, r in curio.tasks()])


def test_contract_the_sensor_reads_the_same_from_postgresql(db: CurioDB) -> None:
    fleet = make_fleet(operator_nodes=2)
    sim = fleet.sim
    sim.world.reboot(fleet.serving[0], sim.now())
    sim.advance(80)  # back up, running its retried tasks again
    sim.world.reboot(fleet.serving[1], sim.now())  # its tasks pending with retries 1, silent
    sim.advance(20)  # the booting node has registered: listed, owning nothing
    sim.world.drain(fleet.serving[2])
    sim.world.drain_operator(2)
    curio = SimCurio.of(sim)
    write_rows(db, curio, sim.now())
    fields: dict[str, Any] = {"tasks": {"PoRep": 0.3, "PSProve": 2.0, "WdPost": 1.0}}
    real = CurioDemand(settings(schema_name=db.schema, **fields))
    fake = CurioDemand(settings(schema_name=db.schema, **fields), connect=curio.connect)

    assert_same_demand(fake.demand(), real.demand())
    fake_m, real_m = fake.machines(), real.machines()
    assert len(fake_m) == 2 + 5  # operators, serving, lost, booting
    assert [(m.id, m.host_and_port, m.unschedulable, m.running_tasks, m.stale) for m in fake_m] == [
        (m.id, m.host_and_port, m.unschedulable, m.running_tasks, m.stale) for m in real_m
    ]
    for f, r in zip(fake_m, real_m, strict=True):
        assert f.last_contact_age_s == pytest.approx(r.last_contact_age_s, abs=1.0)


def assert_same_demand(fake: list[Demand], real: list[Demand]) -> None:
    assert [(d.task, d.pending, d.running, d.max_retries) for d in fake] == [
        (d.task, d.pending, d.running, d.max_retries) for d in real
    ]
    assert max(d.max_retries for d in fake) == 1 and fake[-1].pending > 0
    for f, r in zip(fake, real, strict=True):
        assert f.oldest_pending_s == pytest.approx(r.oldest_pending_s, abs=1.0)

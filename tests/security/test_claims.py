"""Claims an instance makes are checked against what it cannot forge: the operator's protected
Curio nodes are never an instance's node, a benchmark rate implausible for the GPU model is
never stored as the host's rate (journaled for the operator instead), and a host Curio timed is
ranked by that measurement, not by its instance's claim."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fakes.curio_db import CurioDB
from support import Claim, curio_schema

from controller.core.gpu_rates import GLOBAL_MAX_RATE, max_plausible
from controller.core.model import Instance
from controller.core.track import _first, advance
from controller.fleet.base import LaunchRequest, SensorError
from controller.fleet.curio import CurioDemand, CurioSettings
from controller.fleet.observe import RealFleet
from controller.fleet.vast_offers import rank_offers
from controller.service.gather import gather
from controller.store.journal import Journal

DSN = os.environ.get("FLEETGATE_TEST_PG_DSN", "host=127.0.0.1 port=5432 dbname=test user=postgres")
OPERATOR = "10.9.9.9:12300"


@pytest.fixture
def db() -> Iterator[CurioDB]:
    with curio_schema(DSN) as curio:
        yield curio


def curio(db: CurioDB, protected: list[str]) -> CurioDemand:
    settings = CurioSettings.model_validate(
        {"dsn": DSN, "schema_name": db.schema, "allow_drain": True,
         "protected_nodes": protected, "measure_every_s": 0}, strict=False)  # fmt: skip
    return CurioDemand(settings)


def test_a_protected_node_is_never_drained_by_host_and_port_or_by_id(db: CurioDB) -> None:
    mine = db.add_machine(OPERATOR)
    other = db.add_machine("10.0.0.7:12300")
    by_addr = curio(db, [OPERATOR])
    with pytest.raises(SensorError, match="protected"):
        by_addr.drain(OPERATOR)
    with pytest.raises(SensorError, match="protected"):
        by_addr.drain(mine)  # asked for by id, listed by address: still refused
    by_id = curio(db, [str(mine)])
    with pytest.raises(SensorError, match="protected"):
        by_id.drain(OPERATOR)  # asked for by address, listed by id
    with pytest.raises(SensorError, match="protected"):
        by_id.undrain(OPERATOR)
    assert db.machine(mine)["unschedulable"] is False
    assert by_id.drain("10.0.0.7:12300") == 1  # an unprotected node drains as before
    assert db.machine(other)["unschedulable"] is True


class Vast:
    def __init__(self, ip: str) -> None:
        self.last_raw = {"5001": {"public_ipaddr": ip}}

    def list_instances(self) -> list[Instance]:
        return [Instance("5001", "fg-a", "m1", "h1", "running", "loading", "unknown", "unknown")]


class Lifecycle:
    def __init__(self, claim: Claim) -> None:
        self.claim = claim

    def records(self) -> dict[str, Claim]:
        return {self.claim.label: self.claim}

    def overdue_commands(self, now: float) -> list[Any]:
        return []


def test_an_instance_on_the_operators_address_claiming_its_node_is_not_linked(
    db: CurioDB,
) -> None:
    """Even an instance whose public address is the protected node's host (a shared NAT, a
    reused IP) does not get it as its node: it shows no tasks, no drain, and nothing is learned."""
    mine = db.add_machine(OPERATOR, unschedulable=True)
    task = db.post("PoRep")
    db.claim(task, mine)
    claim = Claim("fg-a", "running", 10.0, OPERATOR, vast_id="5001")
    fleet = RealFleet(vast=Vast("10.9.9.9"), lifecycle=Lifecycle(claim),
                      curio=curio(db, [OPERATOR]), check_health=lambda _: {},
                      clock=lambda: 1000.0, launched=lambda: {"5001": "fg-a"})  # fmt: skip
    [inst] = fleet.list_instances()
    assert inst.tasks_running == 0 and inst.drained is False and inst.sidecar == "down"
    assert "fg-a" not in fleet.learned or fleet.learned["fg-a"][2] is None
    # unprotected, the same claim links (the check above is the protection, not the address)
    fleet.curio = curio(db, [])
    [linked] = fleet.list_instances()
    assert linked.tasks_running == 1 and linked.drained is True


def test_plausible_bounds_per_gpu_model() -> None:
    assert max_plausible("RTX 4090") < max_plausible("H100") < GLOBAL_MAX_RATE
    assert max_plausible("NVIDIA GeForce RTX 4090", 2) == 2 * max_plausible("RTX 4090")
    assert max_plausible("Some Future GPU") == GLOBAL_MAX_RATE


def bench_instance(iid: str, machine: str, gpu: str, rate: float) -> Instance:
    return Instance(iid, f"fg-{iid}", machine, "h", "running", "running", "up", "up",
                    gpu_name=gpu, bench_rate=rate)  # fmt: skip


def test_an_implausible_bench_rate_is_refused_journaled_and_not_ranked(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.db")
    try:
        honest = bench_instance("1", "m-honest", "RTX 4090", 40.0)
        liar = bench_instance("2", "m-liar", "RTX 4090", 900.0)  # under MAX_RATE, not a 4090's
        firsts = [_first(inst, 100.0) for inst in (honest, liar)]
        tracks = {t.id: t for t, _ in firsts}
        journal.fleet.save_tracks(tracks, [e for _, evs in firsts for e in evs])
        hist = journal.fleet.history(200.0)
        assert hist.host_rates == {"m-honest": 40.0}
        assert "m-liar" not in hist.launch_rates()
        refused = [e for e in journal.fleet.events("2") if e["kind"] == "bench_refused"]
        assert len(refused) == 1
    finally:
        journal.close()


class TwoHosts:
    """vast's listing of two RTX 4090 instances, each on its own public address."""

    ips = {"5001": "10.4.0.1", "5002": "10.4.0.2"}
    last_raw = {iid: {"public_ipaddr": ip} for iid, ip in ips.items()}

    def list_instances(self) -> list[Instance]:
        return [Instance(iid, f"fg-{iid}", f"m-{iid}", "h", "running", "loading", "unknown",
                         "unknown", gpu_name="RTX 4090") for iid in self.ips]  # fmt: skip


class TwoClaims:
    def __init__(self, rates: dict[str, float]) -> None:
        self.rates = rates

    def records(self) -> dict[str, Claim]:
        return {f"fg-{iid}": Claim(f"fg-{iid}", "running", rate, f"{TwoHosts.ips[iid]}:12300",
                                   vast_id=iid) for iid, rate in self.rates.items()}  # fmt: skip

    def overdue_commands(self, now: float) -> list[Any]:
        return []


def test_a_self_reported_rate_does_not_rank_a_host_curio_timed_as_slow_first(
    db: CurioDB, tmp_path: Path
) -> None:
    """5001 claims the most a 4090 is believed to do; Curio timed its node at 2 PoReps an hour
    and 5002's (claiming far less) at 24: later launches rent 5002's host first."""
    for ip in TwoHosts.ips.values():
        db.add_machine(f"{ip}:12300")
    history = psycopg.sql.SQL(
        "INSERT INTO {}.harmony_task_history (task_id, name, posted, work_start, work_end, "
        "result, completed_by_host_and_port) SELECT n, 'PoRep', now() - make_interval(secs => "
        "(n + 1) * %s), now() - make_interval(secs => (n + 1) * %s), now() - make_interval("
        "secs => n * %s), true, %s FROM generate_series(0, 5) AS n"
    ).format(psycopg.sql.Identifier(db.schema))
    db.conn.execute(history, [1800, 1800, 1800, "10.4.0.1:12300"])
    db.conn.execute(history, [150, 150, 150, "10.4.0.2:12300"])
    demand = curio(db, [])
    rented = {i.id: i.label for i in TwoHosts().list_instances()}  # the fleet's launches
    fleet = RealFleet(vast=TwoHosts(), lifecycle=TwoClaims({"5001": max_plausible("RTX 4090"),
                      "5002": 25.0}), curio=demand, check_health=lambda _: {},
                      clock=lambda: 1000.0, launched=lambda: rented)  # fmt: skip
    journal = Journal(tmp_path / "j.db")
    try:
        for now in (1000.0, 1060.0):
            g = gather(journal, fleet, demand, now, pending_s=600)
            journal.fleet.save_tracks(*advance(g.history, g.observation, now))
        hist = g.history
        assert hist.host_rates["m-5001"] > hist.host_rates["m-5002"]  # the claims, as stored
        request = LaunchRequest("fg-x", prefer_rates=tuple(sorted(hist.launch_rates().items())))
        offers = [{"id": 1, "machine_id": "m-5001", "dph_total": 0.4},
                  {"id": 2, "machine_id": "m-5002", "dph_total": 0.4}]  # fmt: skip
        assert [o["machine_id"] for o in rank_offers(offers, request, 1.0)] == ["m-5002", "m-5001"]
        kinds = [e["kind"] for e in journal.fleet.events("5001")]
        assert "measured" in kinds  # what Curio timed is in the journal
    finally:
        journal.close()


class Records(Lifecycle):
    """The agent record as the actuator reads it too (`resolve` by vast id)."""

    def resolve(self, any_id: str) -> Claim | None:
        return self.claim if any_id == self.claim.vast_id else None


def test_a_drain_goes_only_to_the_node_fleetgate_linked_never_to_a_claim(db: CurioDB) -> None:
    """An instance's agent names the operator's node (unprotected, off its address): it is not
    linked, so its sidecar is unknown, which a stop turns into a drain; that drain must not
    reach the claimed node. Linked to its own node (on its public address) while its record
    still names the operator's (a re-registration since), the drain is its own node's."""
    from controller.fleet.actions import FleetActions
    from controller.fleet.base import PermanentProviderError

    operator = db.add_machine(OPERATOR)
    claim = Claim("fg-a", "running", 10.0, OPERATOR, vast_id="5001")
    demand = curio(db, [])
    fleet = RealFleet(vast=Vast("1.0.0.11"), lifecycle=Records(claim), curio=demand,
                      check_health=lambda _: {}, clock=lambda: 1000.0,
                      launched=lambda: {"5001": "fg-a"})  # fmt: skip
    actions = FleetActions(vast=None, lifecycle=Records(claim), curio=demand,
                           clock=lambda: 1000.0, node_of=fleet.node_of)  # fmt: skip
    [inst] = fleet.list_instances()
    assert inst.sidecar == "unknown"
    with pytest.raises(PermanentProviderError, match="no known Curio node"):
        actions.drain("5001")
    assert db.machine(operator)["unschedulable"] is False

    own = db.add_machine("1.0.0.11:12300")
    [inst] = fleet.list_instances()
    assert inst.sidecar == "up"
    actions.drain("5001")
    assert db.machine(own)["unschedulable"] is True
    assert db.machine(operator)["unschedulable"] is False

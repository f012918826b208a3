"""enrich: vast's listing joined with agent records, daemon health and Curio's nodes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from controller.core.model import Instance
from controller.fleet.observe import Link, RealFleet, enrich, stage_of
from controller.fleet.vast_instances import to_instance
from controller.store.records import Record


@dataclass
class Rec:
    label: str
    stage: str
    bench_rate: float | None = None
    host_and_port: str | None = None


@dataclass
class Check:
    up: bool
    uptime_s: float | None = None
    started_at: float | None = None


@dataclass
class Node:
    host_and_port: str
    last_contact_age_s: float = 10
    unschedulable: bool = False
    running_tasks: int = 0
    stale: bool = False


def vast(id: str, status: str = "running", label: str = "") -> Instance:
    return Instance(id, label or f"fg-{id}", "m1", "h1", status, "registered", "unknown", "unknown")


def test_stages_come_from_vast_while_booting_and_from_the_agent_after() -> None:
    assert stage_of(vast("1", "provisioning"), Rec("fg-1", "bench")) == "provisioning"
    assert stage_of(vast("1", "loading"), None) == "loading"
    assert stage_of(vast("1"), None) == "loading"  # running container, no agent yet
    assert stage_of(vast("1"), Rec("fg-1", "registered")) == "params"  # fetching parameters
    assert stage_of(vast("1"), Rec("fg-1", "params")) == "bench"  # parameters done: benchmarking
    assert stage_of(vast("1"), Rec("fg-1", "bench")) == "bench"
    assert stage_of(vast("1"), Rec("fg-1", "running")) == "running"


def test_a_serving_instance_with_a_dead_daemon_and_a_live_node() -> None:
    links = {"1": Link(Rec("fg-1", "running", 33.0, "10.0.0.1:12300"),
                       Node("10.0.0.1:12300", running_tasks=2), True)}  # fmt: skip
    [i] = enrich([vast("1")], links, {"1": Check(False)}, 180)
    assert (i.stage, i.daemon, i.sidecar, i.tasks_running, i.bench_rate) == (
        "running", "down", "up", 2, 33.0)  # fmt: skip


def test_unknown_health_stale_nodes_drain_and_unknown_nodes() -> None:
    links = {"2": Link(Rec("C.2", "running", None, "n2"), Node("n2", last_contact_age_s=500), True),
             "3": Link(Rec("fg-3", "running", None, "n3"), Node("n3", unschedulable=True), True),
             "4": Link(Rec("fg-4", "running"), None, False),
             "5": Link(Rec("fg-5", "running", None, "n5"), None, True),
             "6": Link(Rec("fg-6", "registered"), None, False)}  # fmt: skip
    a, b, c, d, e = enrich([vast(n) for n in "23456"], links, {"3": Check(True, 120.0)}, 180)
    assert (a.stage, a.daemon, a.sidecar) == ("running", "unknown", "down")
    assert (b.daemon, b.daemon_uptime_s, b.sidecar, b.drained) == ("up", 120.0, "up", True)
    assert c.sidecar == "unknown"  # serving, and no Curio node was ever found for it
    assert d.sidecar == "down"  # its node was known and Curio has dropped it
    assert e.sidecar == "down"  # fetching parameters: Curio does not run yet


# ---- RealFleet: ownership, linking, finding the Curio node -----------------------------------
class Vast:
    def __init__(self, raws: list[dict[str, Any]]) -> None:
        self.raws = raws

    def list_instances(self) -> list[Instance]:
        self.last_raw = {str(r["id"]): r for r in self.raws}
        return [to_instance(r) for r in self.raws]


class Records:
    def __init__(self, *recs: Record) -> None:
        self.by_label = {r.label: r for r in recs}
        self.links: list[tuple[str, dict[str, Any]]] = []

    def records(self) -> dict[str, Record]:
        return dict(self.by_label)

    def record(self, label: str) -> Record | None:
        return self.by_label.get(label)

    def overdue_commands(self, now: float) -> list[Any]:
        return []

    def link(self, label: str, **fields: Any) -> None:
        self.links.append((label, fields))
        r = self.by_label[label]
        self.by_label[label] = replace(r, **{k: v for k, v in fields.items() if v is not None})


class Curio:
    def __init__(self, *nodes: Node) -> None:
        self.nodes = list(nodes)

    def machines(self) -> list[Node]:
        return self.nodes


def raw(id: int, label: str, ip: str, status: str = "running") -> dict[str, Any]:
    return {"id": id, "label": label, "machine_id": 7000 + id, "host_id": 1,
            "actual_status": status, "dph_total": 0.5, "public_ipaddr": ip}  # fmt: skip


def record(label: str, stage: str = "running", vast_id: str | None = None,
           host_and_port: str | None = None) -> Record:  # fmt: skip
    return Record(label, vast_id, None, host_and_port, stage, 0.0, None, 30.0, 0.0, None, None,
                  None, None)  # fmt: skip


def real_fleet(vast: Vast, records: Records, curio: Curio, launched: dict[str, str]) -> RealFleet:
    return RealFleet(vast=vast, lifecycle=records, curio=curio,
                     check_health=lambda instances: {i.id: Check(True, 60.0) for i in instances},
                     clock=lambda: 1000.0, launched=lambda: launched)  # fmt: skip


def test_only_instances_fleetgate_launched_are_its_own() -> None:
    """Own: rented by a launch of this journal (1, and 2 that vast lists without a label), or
    listed with the label of a launch whose create said nothing clear (6). Not: a person's
    `fg-` label (3), another fleetgate's launch label (4), a jupyter box (5), and 7, which a
    launch rented and a person relabelled out of the fleet."""
    vast = Vast([raw(1, "fg-1-1-0-aa", "1.0.0.1"), raw(2, "", "1.0.0.2"),
                 raw(3, "fg-manual-box", "1.0.0.3"), raw(4, "fg-9-9-0-ee", "1.0.0.4"),
                 raw(5, "jupyter", "1.0.0.5", "stopped"), raw(6, "fg-1-2-0-cc", "1.0.0.6"),
                 raw(7, "keep-me", "1.0.0.7", "stopped")])  # fmt: skip
    launched = {"1": "fg-1-1-0-aa", "2": "fg-2-3-0-bb", "7": "fg-3-1-0-dd"}
    fleet = RealFleet(vast=vast, lifecycle=Records(), curio=Curio(),
                      check_health=lambda instances: {}, clock=lambda: 1000.0,
                      launched=lambda: launched,
                      open_labels=lambda: {"fg-1-2-0-cc"})  # fmt: skip
    own = fleet.list_instances()
    assert [i.id for i in own] == ["1", "2", "6"]
    assert [(i.id, i.label) for i in fleet.foreign] == [
        ("3", "fg-manual-box"),
        ("4", "fg-9-9-0-ee"),
        ("5", "jupyter"),
        ("7", "keep-me"),
    ]


def test_the_controller_links_each_agent_to_its_instance_and_curio_node() -> None:
    """The README's agent: its launch label, no vast id, no --host-and-port; vast shows an
    empty label for one of them. Each is linked by label (or by the launch that rented it), and
    its Curio node found at its public address; the operator's node it names is ignored."""
    vast = Vast([raw(11, "fg-1-1-0-aa", "1.0.0.11"), raw(12, "", "1.0.0.12"),
                 raw(13, "fg-1-1-2-cc", "1.0.0.13")])  # fmt: skip
    records = Records(record("fg-1-1-0-aa"), record("fg-1-1-1-bb"),
                      record("fg-1-1-2-cc", host_and_port="10.0.0.1:12300"))  # fmt: skip
    curio = Curio(
        Node("1.0.0.11:40011", running_tasks=2),
        Node("1.0.0.12:40012"),
        Node("1.0.0.13:40013", running_tasks=1),
        Node("10.0.0.1:12300", running_tasks=5),
    )
    fleet = real_fleet(
        vast,
        records,
        curio,
        launched={"11": "fg-1-1-0-aa", "12": "fg-1-1-1-bb", "13": "fg-1-1-2-cc"},
    )
    a, b, c = fleet.list_instances()
    assert records.links == []  # sensing writes nothing: the links wait for the tick's apply
    fleet.save_learned()
    assert (a.sidecar, a.tasks_running, a.stage) == ("up", 2, "running")
    assert (b.sidecar, b.tasks_running, b.stage) == ("up", 0, "running")
    assert (c.sidecar, c.tasks_running) == ("up", 1)  # not the operator's 5 tasks
    assert records.links == [
        ("fg-1-1-0-aa", {"vast_id": "11", "machine_id": "7011", "host_and_port": "1.0.0.11:40011"}),
        ("fg-1-1-1-bb", {"vast_id": "12", "machine_id": "7012", "host_and_port": "1.0.0.12:40012"}),
        ("fg-1-1-2-cc", {"vast_id": "13", "machine_id": "7013", "host_and_port": "1.0.0.13:40013"}),
    ]
    fleet.list_instances()
    fleet.save_learned()
    assert len(records.links) == 3  # nothing new learned: nothing written again


def test_an_agent_speaks_for_its_own_launch_label_never_by_a_vast_id_it_claims() -> None:
    """Vast shows no label for 12; the launch that rented it names it fg-b, whose agent is not
    up yet. fg-x's agent claims 12's id: it does not speak for 12 (it did before fg-b's agent
    registered). Once fg-b's agent registers, 12 is linked to it."""
    vast = Vast([raw(12, "", "1.0.0.12", "loading")])
    records = Records(record("fg-x", vast_id="12"))
    fleet = real_fleet(vast, records, Curio(), launched={"12": "fg-b"})
    [b] = fleet.list_instances()
    assert (b.id, b.stage) == ("12", "loading")  # vast's word, not fg-x's "running"
    fleet.save_learned()
    assert records.links == []
    records.by_label["fg-b"] = record("fg-b", stage="params")
    vast.raws = [raw(12, "", "1.0.0.12")]
    [b] = fleet.list_instances()
    fleet.save_learned()
    assert b.stage == "bench" and [label for label, _ in records.links] == ["fg-b"]  # params done


@pytest.mark.parametrize("price", [None, float("nan"), float("inf"), -0.5, "n/a"])
def test_an_instance_vast_prices_as_no_finite_number_counts_at_the_price_cap(price: Any) -> None:
    """Null counted as free (launches went past max_spend_per_hour); NaN or Infinity failed
    every tick in the spend guard; text failed the whole listing."""
    from controller.fleet.vast_instances import to_instance

    inst = to_instance({**raw(1, "fg-a", "1.0.0.1"), "dph_total": price}, 0.9)
    assert inst.dph == 0.9
    assert to_instance({**raw(1, "fg-a", "1.0.0.1"), "dph_total": "0.25"}, 0.9).dph == 0.25


def test_instances_on_one_host_never_take_each_others_node() -> None:
    """11 and 12 share their host's public address. 11's agent named its node; 12's names
    none and its node is not up: 12 took 11's node as "the only one on its address" (and its
    drain would have cordoned 11). Once 12's node is up, it is 12's."""
    vast = Vast([raw(11, "fg-a", "1.0.0.9"), raw(12, "fg-b", "1.0.0.9")])
    records = Records(record("fg-a", host_and_port="1.0.0.9:40011"), record("fg-b"))
    curio = Curio(Node("1.0.0.9:40011", running_tasks=2))
    fleet = real_fleet(vast, records, curio, launched={"11": "fg-a", "12": "fg-b"})
    a, b = fleet.list_instances()
    assert (a.sidecar, a.tasks_running) == ("up", 2)
    assert (b.sidecar, b.tasks_running) == ("unknown", 0)  # nothing to drain: it waits
    curio.nodes.append(Node("1.0.0.9:40012", running_tasks=1))
    a, b = fleet.list_instances()
    assert (b.sidecar, b.tasks_running) == ("up", 1)


class NetworkCurio(Curio):
    """Curio's nodes and the config's `curio` section (its node networks)."""

    def __init__(self, networks: list[str], *nodes: Node) -> None:
        from controller.fleet.curio import CurioSettings

        super().__init__(*nodes)
        self.settings = CurioSettings.model_validate(
            {"dsn": "host=127.0.0.1 dbname=curio", "node_networks": networks}, strict=False
        )


def test_a_node_behind_vasts_port_mapping_is_linked_on_a_configured_node_network() -> None:
    """A Curio node listening on 0.0.0.0 in a vast container announces the container's own
    address (or its overlay address), never the instance's public one: no node was ever
    linked, so no instance could be drained and every destroy went to a person. With the node
    network in the config, an agent's --host-and-port on it is believed, unless two agents
    name the same node (neither's) or the node is off the network (the operator's)."""
    vast = Vast([raw(11, "fg-a", "1.0.0.11"), raw(12, "fg-b", "1.0.0.12"),
                 raw(13, "fg-c", "1.0.0.13"), raw(14, "fg-d", "1.0.0.14")])  # fmt: skip
    records = Records(record("fg-a", host_and_port="100.64.0.11:12300"),
                      record("fg-b", host_and_port="100.64.0.50:12300"),
                      record("fg-c", host_and_port="100.64.0.50:12300"),
                      record("fg-d", host_and_port="10.9.9.9:12300"))  # fmt: skip
    nodes = (Node("100.64.0.11:12300", running_tasks=2), Node("100.64.0.50:12300", running_tasks=1),
             Node("10.9.9.9:12300", running_tasks=5))  # fmt: skip
    launched = {"11": "fg-a", "12": "fg-b", "13": "fg-c", "14": "fg-d"}

    before = real_fleet(vast, records, Curio(*nodes), launched=launched).list_instances()
    assert [(i.sidecar, i.tasks_running) for i in before] == [("unknown", 0)] * 4

    fleet = real_fleet(vast, records, NetworkCurio(["100.64.0.0/10"], *nodes), launched)
    a, b, c, d = fleet.list_instances()
    assert (a.sidecar, a.tasks_running) == ("up", 2)
    assert [(i.sidecar, i.tasks_running) for i in (b, c, d)] == [("unknown", 0)] * 3
    fleet.save_learned()
    assert ("fg-a", {"vast_id": "11", "machine_id": "7011",
                     "host_and_port": "100.64.0.11:12300"}) in records.links  # fmt: skip


@pytest.mark.parametrize("bad", ["100.64.0.0/33", "not-a-network", ""])
def test_a_node_network_that_is_no_cidr_is_refused_by_name(bad: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="give a CIDR such as"):
        NetworkCurio([bad])

"""enrich: vast's listing joined with agent records, daemon health and Curio's nodes."""

from __future__ import annotations

from dataclasses import dataclass

from controller.model import Instance
from controller.sensors.fleet import enrich, stage_of


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
    [i] = enrich([vast("1")], {"fg-1": Rec("fg-1", "running", 33.0, "10.0.0.1:12300")},
                 {"1": Check(False)}, [Node("10.0.0.1:12300", running_tasks=2)], 180)  # fmt: skip
    assert (i.stage, i.daemon, i.sidecar, i.tasks_running, i.bench_rate) == (
        "running", "down", "up", 2, 33.0)  # fmt: skip


def test_unknown_health_stale_nodes_drain_and_container_labels() -> None:
    records = {"C.2": Rec("C.2", "running", None, "n2"), "fg-3": Rec("fg-3", "running", None, "n3")}
    nodes = [Node("n2", last_contact_age_s=500), Node("n3", unschedulable=True, stale=False)]
    a, b = enrich([vast("2", label="x"), vast("3")], records, {"3": Check(True, 120.0)}, nodes,
                  180)  # fmt: skip
    assert (a.stage, a.daemon, a.sidecar) == ("running", "unknown", "down")
    assert (b.daemon, b.daemon_uptime_s, b.sidecar, b.drained) == ("up", 120.0, "up", True)


def test_a_daemon_counts_as_down_only_after_failures_that_persist() -> None:
    from controller.sensors.fleet import persisted

    failures: dict[str, list[float]] = {}
    down, up = {"1": Check(False)}, {"1": Check(True, 5.0)}
    assert persisted(down, failures, 100, count=2, after_s=60)["1"].up  # one blip: still up
    assert persisted(down, failures, 130, count=2, after_s=60)["1"].up  # two, but within 60 s
    assert not persisted(down, failures, 170, count=2, after_s=60)["1"].up  # persisted
    assert persisted(up, failures, 200, count=2, after_s=60)["1"].up and failures == {}
    assert persisted(down, failures, 210, count=2, after_s=60)["1"].up  # counting starts over
    persisted({}, failures, 220, count=2, after_s=60)
    assert failures == {}  # instances no longer checked are forgotten

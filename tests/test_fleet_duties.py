"""The real fleet path's duties, through its public seams: vast over HTTP (the fake written
from vast's API docs), Curio's tables in the real PostgreSQL, agents calling the instance API.

Each test is a way the world touched the controller and it failed: a fleet at zero that never
launched again, instances fleetgate did not launch managed as its own, an empty vast label, a
listing that missed an instance once, caps that ignored creates on their way, a second outage
that nobody heard of.
"""

from __future__ import annotations

from typing import Any

from fakes.vast_server import Close, Empty, Lost
from test_real_fleet_e2e import World, world  # noqa: F401 - the fixture

from controller.service.app import status


def own_creates(w: World) -> int:
    return sum(w.vast.creates_by_label.values())


def scale_to_zero(w: World) -> int:
    """One instance serves two tasks; they finish; it idles 10 min, is drained, destroyed."""
    tasks = w.db.post("PoRep", 2)
    w.tick(4)
    [iid] = sorted(w.registered)
    w.db.claim(tasks, w.machines[iid])
    w.tick(1)
    w.db.finish(tasks)
    w.tick(14)
    return iid


def test_a_fleet_that_scaled_itself_to_zero_launches_again(world: World) -> None:  # noqa: F811
    iid = scale_to_zero(world)
    assert iid not in world.vast.instances and own_creates(world) == 1
    world.db.post("PoRep", 2)
    world.tick(2)
    assert own_creates(world) == 2  # before: an empty listing was read as a failure forever
    sensing = [e for e in world.app.journal.escalations.recent() if e["kind"] == "sensing_failure"]
    assert sensing == []


def test_an_instance_destroyed_in_vasts_console_is_confirmed_gone_and_replaced(
    world: World,  # noqa: F811
) -> None:
    world.db.post("PoRep", 2)
    world.tick(4)
    [iid] = sorted(world.registered)
    with world.vast.lock:
        del world.vast._instances[iid]  # somebody destroyed it in the console
    world.tick(3)
    shows = [r.path for r in world.vast.of("show")]
    assert f"/api/v0/instances/{iid}/" in shows  # vast was asked before it was read as gone
    assert own_creates(world) == 2
    assert world.app.lifecycle.resolve(str(iid)) is None  # its agent record went with it


def test_a_destroy_whose_answer_timed_out_is_confirmed_and_the_fleet_refills(
    world: World,  # noqa: F811
) -> None:
    world.vast.script("destroy", Lost(Close()))  # vast destroys it; the answer never comes
    iid = scale_to_zero(world)
    failed = [r for r in world.app.journal.actions.recent(1000) if r["action"] == "destroy"]
    assert failed and iid not in world.vast.instances
    world.db.post("PoRep", 2)
    world.tick(3)
    assert own_creates(world) == 2


def test_instances_fleetgate_did_not_launch_are_shown_and_never_touched(
    world: World,  # noqa: F811
) -> None:
    notebook = world.vast.add_instance(label="jupyter")
    unlabelled = world.vast.add_instance(label="")
    stopped = world.vast.add_instance(status="stopped", label="old-prover")
    foreign = {notebook, unlabelled, stopped}
    world.db.post("PoRep", 2)
    world.tick(25)  # past every boot-stage limit (15 min unregistered ...)
    targets = {int(r.path.rstrip("/").rsplit("/", 1)[-1]) for r in world.vast.requests
               if r.endpoint in ("destroy", "reboot", "update")}  # fmt: skip
    assert targets.isdisjoint(foreign)
    assert foreign <= set(world.vast.instances)
    shown = {int(i["id"]): i["label"] for i in status(world.app)["foreign"]}
    assert shown == {notebook: "jupyter", unlabelled: "", stopped: "old-prover"}
    acted = {r["target"] for r in world.app.journal.actions.recent(1000, executed_only=False)}
    assert not any(str(i) in t for t in acted for i in foreign)


def test_an_instance_vast_lists_without_a_label_is_still_linked_drained_and_scaled_down(
    world: World,  # noqa: F811
) -> None:
    """Its agent, as the README sets it up, sends neither its vast id nor its Curio node: the
    controller links it by the launch that rented it and finds its node at its address."""
    world.flags = False
    tasks = world.db.post("PoRep", 2)
    world.tick(1)
    [iid] = list(world.vast.instances)
    with world.vast.lock:
        world.vast._instances[iid].fields["label"] = ""  # vast's API label may be empty
    world.tick(3)
    world.db.claim(tasks, world.machines[iid])
    world.tick(1)
    [fact] = [i for i in world.app.controller.plan(world.clock()).facts if i["id"] == str(iid)]
    assert (fact["stage"], fact["sidecar"], fact["tasks_running"]) == ("running", "up", 2)
    world.db.finish(tasks)
    world.tick(14)
    kinds = [(r["action"], r["params"].get("instance"))
             for r in world.app.journal.actions.recent(1000) if r["parent_id"] is None]  # fmt: skip
    assert ("drain", str(iid)) in kinds and ("destroy", str(iid)) in kinds
    assert kinds.index(("drain", str(iid))) < kinds.index(("destroy", str(iid)))


def test_one_listing_that_misses_an_instance_keeps_its_record(world: World) -> None:  # noqa: F811
    """One of four missing from one listing (not enough to doubt the listing as a whole), while
    vast still shows it: its track and agent record stay, nothing acts on it."""
    tasks = world.db.post("PoRep", 8)
    world.tick(4)
    ids = sorted(world.registered)
    assert len(ids) == 4
    iid = ids[0]
    world.db.claim(tasks[:2], world.machines[iid])
    world.vast.late_shows = False  # show sees it while the listing does not
    with world.vast.lock:
        world.vast._instances[iid].visible_after = world.vast.list_calls + 2  # the next one
    world.tick(1)
    summary = world.app.journal.meta.ticks(1)[0]["summary"]
    assert summary["instances"] == 3 and "veto" not in summary  # the listing was believed
    assert world.app.lifecycle.resolve(str(iid)) is not None  # before: forgotten for good
    world.tick(2)
    assert iid in world.vast.instances
    label = world.labels[iid]
    assert world.post(f"{label}/heartbeat") == {"commands": []}  # before: 404 from now on
    destroys = [r for r in world.app.journal.actions.recent(1000) if r["action"] == "destroy"]
    assert destroys == []


def test_caps_count_creates_that_the_listing_does_not_show_yet(world: World) -> None:  # noqa: F811
    c = world.app.controller
    c.settings = c.settings.model_copy(
        update={"guards": c.settings.guards.model_copy(update={"max_instances": 2})}
    )
    world.vast.late_creates = 4  # each new instance stays out of the listing for 4 listings
    world.db.post("PoRep", 12)  # 6 instances wanted
    peak = 0
    for _ in range(8):
        world.tick(1)
        peak = max(peak, len(world.vast.instances))
    assert peak == 2 and own_creates(world) == 2  # before: 5 live for a cap of 4


def test_each_new_listing_outage_is_a_new_escalation(world: World) -> None:  # noqa: F811
    world.db.post("PoRep", 2)
    world.tick(4)

    def outage() -> list[dict[str, Any]]:
        world.vast.script("list", Empty(), Empty())  # two ticks of an empty listing
        world.tick(2)
        world.tick(3)  # the listing is back
        return [e for e in world.app.journal.escalations.recent() if e["kind"] == "sensing_failure"]

    first = outage()
    assert len(first) == 1 and first[0]["status"] == "resolved"
    second = outage()  # within the dedup window of the first
    assert len(second) == 2

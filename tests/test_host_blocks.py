"""A host that fails again is kept out longer each time, and is rented last once it is back.

A crash-looping host with a fast benchmark would otherwise be blocked for a day, rented first
again the moment the block ends (its rate per dollar is the best known), and fail again: once
a day for as long as the fleet runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sim_support import sim_fleet

from controller.core.model import Decision, Proposal
from controller.core.policy import Guards
from controller.core.track import BLOCK_MAX_S, BLOCK_S, History
from controller.fleet.actuator import Actuator, Job
from controller.fleet.base import LaunchRequest
from controller.sim import SimConfig, Simulation
from controller.sim.machines import choose_machine
from controller.store.journal import Journal

DAY = 86_400.0


def test_a_block_doubles_with_each_earlier_one_up_to_the_cap() -> None:
    hist = History(host_failures={"m1": 1, "m2": 2, "m3": 5, "m4": 10_000})
    assert hist.block_s("m0") == BLOCK_S == DAY
    assert [hist.block_s(m) for m in ("m1", "m2")] == [2 * DAY, 4 * DAY]
    assert hist.block_s("m3") == hist.block_s("m4") == BLOCK_MAX_S == 30 * DAY


def test_a_host_that_was_ever_blocked_ranks_as_known_slow() -> None:
    hist = History(host_rates={"fast": 48.0, "ok": 30.0, "slow": 10.0},
                   host_failures={"fast": 1, "never-benched": 1})  # fmt: skip
    assert hist.launch_rates() == {"fast": 0.0, "ok": 30.0, "slow": 10.0, "never-benched": 0.0}


def test_replacing_on_a_host_blocked_twice_before_blocks_it_for_four_days(tmp_path: Path) -> None:
    """Through the production fleet path on the simulator's wire (vast's machine ids)."""
    sim = Simulation(SimConfig(machines=4, stuck_fraction=0.0), seed=1)
    journal = Journal(tmp_path / "j.db")
    fleet, _, _ = sim_fleet(sim, journal)
    old = fleet.launch(LaunchRequest(label="fg-old"))
    [listed] = fleet.list_instances()
    machine = listed.machine_id
    for n in range(2):  # two earlier blocks, both over
        journal.fleet.block_host(machine, 10.0 * n, "crash loop")
    now = sim.now()
    hist = journal.fleet.history(now)
    assert hist.host_failures == {machine: 2} and not hist.host_blocked(machine, now)

    params = {"instance": old, "block_host": True, "reason": "crash loop"}
    proposal = Proposal("replace", params, "rule:replace-crash-looping-instance", "crash loop")
    action_id = journal.actions.record(
        tick_id=None, now=now, action="replace", target=old, params=params,
        proposer=proposal.proposer, reason=proposal.reason, confidence=0.9, verdict="act",
        why="test", status="intent", key=None, parent_id=None,
    )  # fmt: skip
    job = Job(Decision(proposal, "act", "test"), action_id, 1, hist, now,
              {old: {"machine_id": machine}})  # fmt: skip
    outcome = Actuator(fleet, journal, Guards()).execute(job)

    assert outcome.status == "ok" and outcome.result["blocked_host"] == machine
    [host] = [h for h in journal.fleet.hosts() if h["machine_id"] == machine]
    assert (host["failures"], host["blocked_until"]) == (3, pytest.approx(now + 4 * DAY))
    new = fleet.find_by_label(outcome.result["label"])
    assert new is not None and new.machine_id != machine


def test_a_host_back_from_its_block_is_rented_after_every_other_one() -> None:
    sim = Simulation(SimConfig(machines=5), seed=2)
    machines = list(sim.world.machines.values())
    fastest = max(machines, key=lambda m: m.rate / m.dph)
    rates = {m.machine_id: m.rate for m in machines}
    before = History(host_rates=rates)
    after = History(host_rates=rates, host_failures={fastest.machine_id: 1})

    def first(hist: History) -> str:
        best = choose_machine(machines, busy=frozenset(), exclude=frozenset(),
                              prefer_rates=hist.launch_rates(), max_dph=None)  # fmt: skip
        assert best is not None
        return best.machine_id

    assert first(before) == fastest.machine_id
    assert first(after) != fastest.machine_id
    order = sorted(machines, key=lambda m: m.machine_id == fastest.machine_id)
    busy = frozenset(m.machine_id for m in order[:-1])  # every other machine rented
    last = choose_machine(machines, busy=busy, exclude=frozenset(),
                          prefer_rates=after.launch_rates(), max_dph=None)  # fmt: skip
    assert last is fastest  # still rentable: last, not never

"""decide: proposals from rule firings, unmatched facts, weighing, conflicts, the gate."""

from __future__ import annotations

from typing import Any

from support import book_of, fact

from controller.core.decide import decide, weigh
from controller.core.matches import Match
from controller.core.model import Proposal
from controller.core.policy import DecideSettings, Gate
from controller.rules.fire import proposals_from

BOOK = book_of("""
rules:
  - name: restart
    when: {instance: {daemon: down}}
    then: {action: restart_daemon, instance: "{{ instance.id }}"}
    confidence: 0.95
  - name: replace-it
    when: {instance: {daemon: down}}
    then: {action: replace, instance: "{{ instance.id }}"}
    confidence: 0.9
  - name: replace-first
    when: {instance: {daemon: down}}
    then: {action: replace, instance: "{{ instance.id }}"}
    confidence: 0.9
    priority: 10
  - name: grow
    when: {demand: {pending: {gt: 0}}}
    then:
      action: scale_to
      count: "{{ (demand.pending / settings.tasks_per_instance) | round(0, 'ceil') | int }}"
    confidence: 0.9
  - name: unsure
    when: {instance: {daemon: down}}
    then: {action: reboot, instance: "{{ instance.id }}"}
    confidence: 0.5
  - name: broken
    when: {demand: {pending: {gt: 0}}}
    then: {action: scale_to, count: "{{ demand.pending - 1000 }}"}
    confidence: 0.9
  - name: ask-about-it
    description: an instance nobody understands
    when: {instance: {status: frozen}}
    then: {action: escalate, reason: "instance {{ instance.id }} reports {{ instance.status }}"}
    confidence: 0.9
  - name: ask-plainly
    description: a queue a person should see
    when: {demand: {pending: {gt: 100}}}
    then: {action: escalate}
    confidence: 0.9
  - name: tell-queue
    when: {demand: {pending: {gt: 0}}}
    then: {action: notify, message: "{{ demand.pending }} tasks wait"}
    confidence: 0.9
  - name: tell-down
    when: {instance: {daemon: down}}
    then: {action: notify, message: "{{ instance.id }} is down"}
    confidence: 0.9
""")
S = DecideSettings()


def fired(rule: str, **facts: str) -> Match:
    return Match(f"rule:{rule}", dict(facts))


def run(facts: list[dict[str, Any]], matches: list[Match], settings: DecideSettings = S,
        extra: tuple[Proposal, ...] = ()) -> Any:  # fmt: skip
    by_id = {str(f["id"]): f for f in facts}
    fired = proposals_from(matches, by_id, BOOK, settings, 1000.0)
    return decide(facts, matches, fired, settings, extra)


def test_a_rule_firing_becomes_a_proposal_with_evaluated_params_and_acts() -> None:
    out = run([fact("demand", pending=5)], [fired("grow", demand="demand:all")])
    [d] = out.decisions
    assert d.proposal.action == "scale_to" and d.proposal.params == {"count": 3}
    assert d.proposal.proposer == "rule:grow" and d.verdict == "act"
    assert "0.90" in d.why and "act" in d.why
    assert out.doubts == ()


def test_parameters_that_fail_the_action_schema_become_a_rule_error_doubt() -> None:
    out = run([fact("demand", pending=5)], [fired("broken", demand="demand:all")])
    assert out.decisions == ()
    [doubt] = out.doubts
    assert doubt.kind == "rule_error" and "broken" in doubt.summary and "count" in doubt.summary


def test_unmatched_is_abnormal_and_unclaimed() -> None:
    facts = [fact("instance", "a", status="frozen"), fact("instance", "b", daemon="down")]
    matches = [Match("abnormal:instance", {"m": "a"}), Match("abnormal:instance", {"m": "b"}),
               Match("abnormal:instance", {"m": "a"}), fired("restart", instance="b")]  # fmt: skip
    out = run(facts, matches)
    assert out.unmatched == ("a",)
    [doubt] = out.doubts
    assert doubt.kind == "unmatched" and doubt.subject == "instance:a"
    assert doubt.key == {"status": "frozen", "stage": "running"}  # probes follow the status


def test_an_abnormal_sensor_is_a_sensing_failure() -> None:
    facts = [fact("sensor", name="provider", state="failed")]
    out = run(facts, [Match("abnormal:sensor", {"m": "sensor:provider"})])
    assert [d.kind for d in out.doubts] == ["sensing_failure"]


def test_an_ok_sensor_no_normal_pattern_covers_is_unmatched_not_a_sensing_failure() -> None:
    # rules without the shipped `normal: {sensor: {state: ok}}`: the sensor works and nothing
    # is held, so saying "fleet changes are held until it recovers" would be false
    facts = [fact("sensor", name="provider", state="ok")]
    out = run(facts, [Match("abnormal:sensor", {"m": "sensor:provider"})])
    [doubt] = out.doubts
    assert doubt.kind == "unmatched" and doubt.subject == "sensor:provider"
    assert "held" not in doubt.summary and "no rule covers it" in doubt.summary


def test_priority_resolves_two_actions_on_one_target() -> None:
    facts = [fact("instance", "b", daemon="down")]
    out = run(facts, [fired("restart", instance="b"), fired("replace-first", instance="b")])
    verdicts = {d.proposal.proposer: d.verdict for d in out.decisions}
    assert verdicts == {"rule:replace-first": "act", "rule:restart": "superseded"}
    assert out.doubts == ()


def test_a_tie_between_different_actions_is_a_conflict_that_asks() -> None:
    facts = [fact("instance", "b", daemon="down")]
    out = run(facts, [fired("restart", instance="b"), fired("replace-it", instance="b")])
    assert {d.verdict for d in out.decisions} == {"ask"}
    [doubt] = out.doubts
    assert doubt.kind == "conflict" and doubt.key == {"actions": ["replace", "restart_daemon"]}
    assert doubt.facts == (facts[0],)  # what both rules matched, once: the evidence shown


def test_the_same_action_from_two_rules_is_merged() -> None:
    facts = [fact("instance", "b", daemon="down")]
    out = run(facts, [fired("replace-it", instance="b"), fired("replace-first", instance="b")])
    assert sorted(d.verdict for d in out.decisions) == ["act", "superseded"]


def test_a_notify_neither_conflicts_with_nor_supersedes_an_action_on_the_fleet() -> None:
    both = [fired("grow", demand="demand:all"), fired("tell-queue", demand="demand:all")]
    out = run([fact("demand", pending=5)], both)
    verdicts = {d.proposal.proposer: d.verdict for d in out.decisions}
    assert verdicts == {"rule:grow": "act", "rule:tell-queue": "act"}
    assert out.doubts == ()


def test_two_rules_different_messages_both_notify_and_the_same_message_once() -> None:
    facts = [fact("demand", pending=5), fact("instance", "b", daemon="down")]
    out = run(facts, [fired("tell-queue", demand="demand:all"), fired("tell-down", instance="b"),
                      fired("tell-queue", demand="demand:all")])  # fmt: skip
    acted = sorted(d.proposal.params["message"] for d in out.decisions if d.verdict == "act")
    assert acted == ["5 tasks wait", "b is down"]
    assert [d.verdict for d in out.decisions].count("superseded") == 1
    assert out.doubts == ()


def test_low_confidence_asks() -> None:
    out = run([fact("instance", "b", daemon="down")], [fired("unsure", instance="b")])
    [d] = out.decisions
    assert d.verdict == "ask" and "below the threshold" in d.why
    assert [x.kind for x in out.doubts] == ["low_confidence"]
    assert [f["id"] for f in out.doubts[0].facts] == ["b"]  # the evidence shown with it


def test_a_stale_sensor_lowers_confidence_below_the_threshold() -> None:
    facts = [fact("demand", pending=5), fact("sensor", name="provider", state="stale")]
    out = run(facts, [fired("grow", demand="demand:all")])
    grow = next(d for d in out.decisions if d.proposal.proposer == "rule:grow")
    assert grow.proposal.confidence == 0.45 and grow.verdict == "ask"


def test_removing_many_working_instances_at_once_is_doubtful_but_idle_scale_down_is_not() -> None:
    busy = [fact("instance", f"i{n}", daemon="down", tasks_running=1) for n in range(4)]
    fleet = fact("fleet", instances=4)
    out = run([*busy, fleet], [fired("replace-it", instance=f"i{n}") for n in range(4)])
    assert {d.verdict for d in out.decisions} == {"ask"}
    idle = [fact("instance", f"i{n}", tasks_running=0) for n in range(4)]
    assert weighed([*idle, fleet]) == {0.9}


def test_destroying_many_parked_instances_is_routine_but_many_stopped_ones_is_doubtful() -> None:
    # a warm pool parked at one quiet hour reaches its time limit at one tick: fleetgate
    # stopped those itself; instances that stopped on their own are another matter
    fleet = fact("fleet", instances=4)
    parked = [
        fact("instance", f"i{n}", status="stopped", parked=True, tasks_running=0) for n in range(4)
    ]
    assert weighed([*parked, fleet]) == {0.9}
    stopped = [
        fact("instance", f"i{n}", status="stopped", parked=False, tasks_running=0) for n in range(4)
    ]
    assert weighed([*stopped, fleet]) == {0.63}  # 0.9 x the large change factor, 0.7: asks


def weighed(facts: list[dict[str, Any]]) -> set[float]:
    """The confidences after `weigh` of a destroy at 0.9 of every instance in `facts`."""
    props = [Proposal("destroy", {"instance": str(f["id"])}, "rule:x", "why", 0.9)
             for f in facts if f["kind"] == "instance"]  # fmt: skip
    by_id = {str(f["id"]): f for f in facts}
    return {p.confidence for p in weigh(props, by_id, Gate())}


def test_modes_observe_propose_and_per_action_override() -> None:
    facts, m = [fact("demand", pending=5)], [fired("grow", demand="demand:all")]
    observe = DecideSettings(gate=Gate(mode="observe"))
    assert run(facts, m, observe).decisions[0].verdict == "observe"
    propose = DecideSettings(gate=Gate(mode="propose"))
    out = run(facts, m, propose)
    assert out.decisions[0].verdict == "ask" and out.doubts[0].kind == "approval"
    per_action = DecideSettings(gate=Gate(mode="act", actions={"scale_to": "propose"}))
    assert run(facts, m, per_action).decisions[0].verdict == "ask"


def test_a_human_approval_skips_the_gate_but_not_the_guards() -> None:
    p = Proposal("reboot", {"instance": "b"}, "human:ana", "approved", 1.0, 1000, escalation_id=4)
    out = run([], [], DecideSettings(gate=Gate(mode="propose")), extra=(p,))
    [d] = out.decisions
    assert d.verdict == "act" and "ana" in d.why and "#4" in d.why


def test_the_action_name_type_lists_exactly_the_vocabulary() -> None:
    from typing import get_args

    from controller.core.actions import ACTIONS, ActionName

    assert get_args(ActionName) == tuple(ACTIONS)


def test_a_rule_that_escalates_is_one_requested_doubt_and_no_decision() -> None:
    odd = fact("instance", "b", status="frozen")
    out = run([odd], [Match("abnormal:instance", {"m": "b"}), fired("ask-about-it", instance="b")])
    assert out.decisions == () and out.unmatched == ()
    [doubt] = out.doubts
    assert (doubt.kind, doubt.subject) == ("requested", "instance:b")
    assert doubt.summary == "rule:ask-about-it asks a person to decide: instance b reports frozen"
    assert doubt.facts == (odd,) and doubt.proposals == ()
    assert doubt.key == {"proposer": "rule:ask-about-it"}


def test_an_escalation_without_a_reason_is_summarised_from_the_rule_and_gates_nothing() -> None:
    queue = fact("demand", pending=500)
    matches = [fired("ask-plainly", demand="demand:all"), fired("grow", demand="demand:all")]
    out = run([queue], matches, DecideSettings(gate=Gate(mode="observe")))
    [grow] = out.decisions  # the request is no rival for the fleet target
    assert grow.proposal.proposer == "rule:grow" and grow.verdict == "observe"
    [doubt] = out.doubts
    assert doubt.kind == "requested" and doubt.subject == "demand:all"
    assert doubt.summary.endswith(": a queue a person should see") and doubt.facts == (queue,)


def test_an_answer_that_names_escalate_is_void_not_acted_on() -> None:
    p = Proposal("escalate", {"reason": "again"}, "human:ana", "x", 1.0, 1000, escalation_id=3)
    out = run([], [], extra=(p,))
    [d] = out.decisions
    assert d.verdict == "noop" and "cannot be 'escalate'" in d.why
    assert out.doubts == ()

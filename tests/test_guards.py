"""guards: every act decision through limits, budgets, cooldowns, drain-before-destroy, holds."""

from __future__ import annotations

from typing import Any

from support import fact

from controller.core import guards
from controller.core.model import Decision, Proposal
from controller.core.policy import Guards
from controller.core.track import History, Track

NOW = 100_000.0


def act(action: str, proposer: str = "rule:r", **params: Any) -> Decision:
    return Decision(Proposal(action, params, proposer, "because", 0.9), "act", "matched")


def ctx(*facts: dict[str, Any], hist: History | None = None, **limits: Any) -> guards.Context:
    by_id = {str(f["id"]): f for f in facts}
    by_id.setdefault("fleet", fact("fleet", instances=0, active=0, spend_per_h=0.0))
    return guards.Context(by_id, hist or History(), Guards(**limits), NOW)


def one(d: Decision, c: guards.Context) -> Decision:
    [out], _ = guards.check([d], c)
    return out


def test_scale_to_becomes_the_launches_it_implies() -> None:
    c = ctx(fact("fleet", instances=2, active=2, spend_per_h=1.0))
    d = one(act("scale_to", count=5), c)
    assert (d.verdict, d.effective_action, d.effective_params) == ("act", "launch", {"count": 3})
    assert one(act("scale_to", count=2), c).verdict == "noop"


def test_launches_are_trimmed_by_the_tightest_limit_and_say_which() -> None:
    c = ctx(fact("fleet", instances=8, active=8), max_instances=10)
    d = one(act("launch", count=5), c)
    assert d.effective_params == {"count": 2} and d.guard == "max_instances" and "trimmed" in d.why
    c = ctx(max_launches_per_tick=3)
    assert one(act("launch", count=5), c).effective_params == {"count": 3}
    c = ctx(hist=History(launches=tuple(NOW - 60 * n for n in range(29))), max_launches_per_hour=30)
    assert one(act("launch", count=5), c).effective_params == {"count": 1}
    c = ctx(fact("fleet", spend_per_h=9.0), max_spend_per_hour=10.0, launch_dph_estimate=0.4)
    assert one(act("launch", count=5), c).effective_params == {"count": 2}


def test_budgets_count_across_decisions_of_one_tick() -> None:
    out, _ = guards.check([act("launch", count=4), act("launch", count=4)],
                          ctx(max_launches_per_tick=6))  # fmt: skip
    assert [d.effective_params["count"] for d in out] == [4, 2]


def test_a_spend_cap_that_allows_nothing_vetoes_and_asks_a_person() -> None:
    c = ctx(fact("fleet", instances=5, spend_per_h=10.0), max_spend_per_hour=10.0)
    [d], doubts = guards.check([act("scale_to", count=9)], c)
    assert d.verdict == "veto" and d.guard == "max_spend_per_hour"
    assert [x.kind for x in doubts] == ["guard_veto"]
    [d], doubts = guards.check([act("launch", count=1)], ctx(max_launches_per_tick=0))
    assert d.verdict == "veto" and doubts == []  # throttling is routine: no escalation


def test_a_replace_the_caps_refuse_is_escalated_naming_the_instance() -> None:
    c = ctx(fact("instance", "i1", daemon="down"), fact("fleet", instances=5, active=5),
            max_instances=5)  # fmt: skip
    [d], [doubt] = guards.check([act("replace", instance="i1")], c)
    assert d.verdict == "veto" and d.guard == "max_instances"
    assert doubt.kind == "guard_veto" and doubt.summary == (
        "rule:r wants to replace instance i1, which needs room for 1 more instance(s), but "
        "max_instances allows none")  # fmt: skip
    assert [f["id"] for f in doubt.facts] == ["i1"]  # its evidence, not "(no facts attached)"
    [_], [doubt] = guards.check([act("scale_to", count=9)], c)
    assert doubt.summary == "rule:r wants 4 more instance(s) but max_instances allows none"


def test_a_drained_instance_goes_only_once_curio_has_read_its_cordon() -> None:
    """Curio's node reads its cordon with its task poll, every 30 s: a destroy or stop in a
    tick less than `cordon_settle_s` after fleetgate's drain (a short `interval_s`) could take
    a task the node claimed after the tick's reading. Vetoed until the cordon has held."""
    drained = fact("instance", "i1", tasks_running=0, drained=True)
    fleet = fact("fleet", instances=3)
    for action, guard in (("destroy", "drain_before_destroy"), ("stop", "drain_before_stop")):
        young = History(last_acted={"drain:instance:i1": NOW - 20})
        d = one(act(action, instance="i1"), ctx(drained, fleet, hist=young))
        assert (d.verdict, d.guard) == ("veto", guard) and "drained 20s ago" in d.why
        held = History(last_acted={"drain:instance:i1": NOW - 35})
        assert one(act(action, instance="i1"), ctx(drained, fleet, hist=held)).verdict == "act"
        # drained by someone else (no drain of fleetgate's): as before
        assert one(act(action, instance="i1"), ctx(drained, fleet)).verdict == "act"
        d = one(act(action, instance="i1"), ctx(drained, fleet, hist=young, cordon_settle_s=0))
        assert d.verdict == "act"


def test_drain_before_destroy() -> None:
    serving = fact("instance", "i1", tasks_running=0, drained=False)
    d = one(act("destroy", instance="i1"), ctx(serving, fact("fleet", instances=3)))
    assert (d.verdict, d.effective_action, d.guard) == ("act", "drain", "drain_before_destroy")
    busy = fact("instance", "i1", tasks_running=2, drained=True)
    d = one(act("destroy", instance="i1"), ctx(busy, fact("fleet", instances=3)))
    assert d.verdict == "veto" and "2 task(s)" in d.why
    drained = fact("instance", "i1", tasks_running=0, drained=True)
    d = one(act("destroy", instance="i1"), ctx(drained, fact("fleet", instances=3)))
    assert (d.verdict, d.effective_action) == ("act", "destroy")
    dead = fact("instance", "i1", status="exited", sidecar="down", tasks_running=1)
    assert one(act("destroy", instance="i1"), ctx(dead)).effective_action == "destroy"


def test_min_instances_and_scale_down_delay_protect_serving_capacity() -> None:
    drained = fact("instance", "i1", tasks_running=0, drained=True)
    d = one(
        act("destroy", instance="i1"), ctx(drained, fact("fleet", instances=2), min_instances=2)
    )
    assert (d.verdict, d.guard) == ("veto", "min_instances")
    recent = History(launches=(NOW - 100,))
    d = one(act("destroy", instance="i1"), ctx(drained, fact("fleet", instances=5), hist=recent))
    assert (d.verdict, d.guard) == ("veto", "scale_down_delay")


def test_at_most_a_share_of_the_fleet_is_removed_per_tick() -> None:
    dead = [fact("instance", f"i{n}", status="offline", sidecar="down") for n in range(5)]
    c = ctx(*dead, fact("fleet", instances=20), max_destroy_share_per_tick=0.1)
    out, _ = guards.check([act("destroy", instance=f"i{n}") for n in range(5)], c)
    assert [d.verdict for d in out] == ["act", "act", "veto", "veto", "veto"]
    assert out[2].guard == "max_destroy_share_per_tick"


def test_crash_loop_limit_and_cooldowns() -> None:
    looping = fact("instance", "i1", daemon="down", restarts_1h=3)
    d = one(act("restart_daemon", instance="i1"), ctx(looping))
    assert (d.verdict, d.guard) == ("veto", "crash_loop_limit")
    h = History(last_acted={"restart_daemon:instance:i1": NOW - 30})
    d = one(
        act("restart_daemon", instance="i1"), ctx(fact("instance", "i1", daemon="down"), hist=h)
    )
    assert (d.verdict, d.guard) == ("veto", "cooldown")
    h = History(last_acted={"restart_daemon:instance:i1": NOW - 500})
    assert (
        one(act("restart_daemon", instance="i1"), ctx(fact("instance", "i1"), hist=h)).verdict
        == "act"
    )


def test_a_daemon_whose_status_server_never_answered_is_not_restarted_but_asked_about() -> None:
    down = fact("instance", "i1", daemon="down", restarts_1h=0)
    never = Track("i1", "m1", 0.0, "running", 0.0, "running", 0.0, "down", 0.0, ever_up=True)
    c = ctx(down, hist=History(instances={"i1": never}))
    [d], doubts = guards.check([act("restart_daemon", instance="i1")], c)
    assert (d.verdict, d.guard) == ("veto", "daemon_never_answered")
    assert [x.kind for x in doubts] == ["guard_veto"] and "status_listen" in doubts[0].summary
    person = act("restart_daemon", proposer="human:ops", instance="i1")
    assert one(person, c).verdict == "act"  # a person who looked may restart it
    answered = History(instances={"i1": never._replace(answered=True)})
    assert one(act("restart_daemon", instance="i1"), ctx(down, hist=answered)).verdict == "act"


def test_pause_and_sensing_failures_hold_fleet_changes() -> None:
    assert one(act("launch", count=1), ctx(paused=True)).guard == "paused"
    assert one(act("hold", reason="x"), ctx(paused=True)).verdict == "act"
    failed = fact("sensor", name="provider", state="failed")
    for d in (act("launch", count=1), act("destroy", instance="i1"), act("replace", instance="i1")):
        assert one(d, ctx(failed, fact("instance", "i1"))).guard == "sensing"
    no_demand = fact("sensor", name="demand", state="failed")
    assert one(act("scale_to", count=3), ctx(no_demand)).guard == "sensing"
    assert (
        one(act("restart_daemon", instance="i1"), ctx(no_demand, fact("instance", "i1"))).verdict
        == "act"
    )


def test_replace_once_and_nothing_for_instances_that_are_gone() -> None:
    retiring = fact("instance", "i1", retiring=True)
    assert one(act("replace", instance="i1"), ctx(retiring)).verdict == "noop"
    assert one(act("replace", instance="i1"), ctx(fact("instance", "i1"))).verdict == "act"
    assert one(act("destroy", instance="nope"), ctx()).verdict == "noop"


def test_other_verdicts_pass_through_untouched() -> None:
    ask = Decision(Proposal("launch", {"count": 1}, "rule:r", "x", 0.1), "ask", "low")
    assert one(ask, ctx(paused=True)) == ask


def test_only_an_explicit_override_exceeds_a_budget_cap_and_the_decision_says_so() -> None:
    c = ctx(fact("fleet", instances=5, spend_per_h=10.0), max_spend_per_hour=10.0)
    plain = Decision(Proposal("launch", {"count": 2}, "human:ana", "x", 1.0, 1000), "act", "ok")
    assert one(plain, c).verdict == "veto"
    over = Decision(Proposal("launch", {"count": 2}, "human:ana", "x", 1.0, 1000,
                             overrides=("max_spend_per_hour",)), "act", "ok")  # fmt: skip
    d = one(over, c)
    assert d.verdict == "act" and d.effective_params == {"count": 2}
    assert "budget override by human:ana (max_spend_per_hour)" in d.why
    capped = ctx(fact("fleet", instances=5, spend_per_h=10.0), max_spend_per_hour=10.0,
                 max_launches_per_tick=1)  # fmt: skip
    assert one(over, capped).effective_params == {"count": 1}  # other caps still hold


def test_launches_on_their_way_count_against_the_instance_and_spend_caps() -> None:
    c = ctx(fact("fleet", instances=3, active=5, pending_launches=2, spend_per_h=1.5),
            max_instances=6, max_spend_per_hour=10.0)  # fmt: skip
    d = one(act("launch", count=4), c)
    assert (d.verdict, d.params, d.guard) == ("act", {"count": 1}, "max_instances")  # 6 - 3 - 2
    c = ctx(fact("fleet", instances=1, pending_launches=3, spend_per_h=0.5),
            max_spend_per_hour=3.2, launch_dph_estimate=0.9)  # fmt: skip
    d = one(act("launch", count=4), c)
    assert (d.verdict, d.guard) == ("veto", "max_spend_per_hour")  # 0.5 + 3 x 0.9 on the way


def test_an_unknown_curio_node_is_never_destroyed_and_a_person_is_asked() -> None:
    inst = fact("instance", "i1", status="running", sidecar="unknown", tasks_running=0)
    checked, doubts = guards.check([act("destroy", instance="i1")], ctx(inst))
    assert checked[0].verdict == "veto" and "Curio node is unknown" in checked[0].why
    assert [(x.kind, x.subject, x.key) for x in doubts] == [
        ("guard_veto", "instance:i1", {"guard": "unknown_node"})]  # fmt: skip


def test_nothing_is_put_to_a_person_that_would_do_nothing() -> None:
    asked = Decision(Proposal("scale_to", {"count": 2}, "rule:r", "why"), "ask", "propose")
    [d], _ = guards.check([asked], ctx(fact("fleet", active=2)))
    assert d.verdict == "noop" and "not put to a person" in d.why
    [d], doubts = guards.check([asked], ctx(fact("fleet", active=1, instances=1),
                                            max_instances=1))  # fmt: skip
    assert (d.verdict, d.guard) == ("veto", "max_instances")  # an approval would not help
    assert [x.key for x in doubts] == [{"guard": "max_instances"}]  # the cap says so itself
    [d], _ = guards.check([asked], ctx(fact("fleet", active=1)))
    assert d.verdict == "ask"  # one more instance is worth asking about
    for failed in ("provider", "demand"):  # made from facts that are not the fleet's
        sensor = fact("sensor", name=failed, state="failed")
        [d], _ = guards.check([asked], ctx(fact("fleet", active=1), sensor))
        assert (d.verdict, d.guard) == ("veto", "sensing") and "not put to a person" in d.why
    [d], _ = guards.check([asked], ctx(fact("fleet", active=1), paused=True))
    assert d.verdict == "ask"  # a pause lifts by a person's word: the question stays


def test_a_host_block_from_any_answer_is_at_most_thirty_days() -> None:
    """An answer (an LLM's, a button's) that blocks a host "until 2057" is refused at the schema."""
    import pytest

    from controller.core import actions

    ok = actions.validate("block_host", {"machine": "m1", "for": 30 * 86_400})
    assert ok["for"] == 30 * 86_400
    for too_long in (30 * 86_400 + 1, 1e9, float("inf")):
        with pytest.raises(actions.ActionError):
            actions.validate("block_host", {"machine": "m1", "for": too_long})


def test_a_notify_cooldown_holds_a_lasting_condition_to_one_notice_per_window() -> None:
    """As the README says: `guards.cooldowns_s: {notify: 3600}`, one notice an hour."""
    tell = act("notify", message="spend is high")
    recent = History(last_acted={"notify:fleet": NOW - 600})
    d = one(tell, ctx(hist=recent, cooldowns_s={"notify": 3600}))
    assert (d.verdict, d.guard) == ("veto", "cooldown")
    assert one(tell, ctx(hist=recent)).verdict == "act"  # no cooldown: every tick it matches
    older = History(last_acted={"notify:fleet": NOW - 3700})
    assert one(tell, ctx(hist=older, cooldowns_s={"notify": 3600})).verdict == "act"

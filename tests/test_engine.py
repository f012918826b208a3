"""The durable_rules adapter: synchronous, stateless per call, never crashes the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from datetime import datetime
from pathlib import Path

import pytest
from support import book_of, engine_of, fact

from controller.core.facts import build_facts
from controller.core.model import Demand, Observation, SensorStatus
from controller.core.track import History
from controller.rules.engine import Engine, EngineError, _batch, _texts
from controller.rules.source import read_rulebook
from controller.tools.bench.tick import synthetic_instances

ROOT = Path(__file__).resolve().parents[1]

RULES = """
normal:
  instance: {status: running, daemon: up}
  demand: {}
  fleet: {}
rules:
  - name: restart
    when: {instance: {daemon: down, restarts_1h: {lt: 3}}}
    then: {action: restart_daemon, instance: "{{ instance.id }}"}
    confidence: 0.9
  - name: grow
    when:
      demand: {task: all, pending: {gt: 0}}
      fleet: {active: {lt: {ref: demand.pending}}}
    then: {action: scale_to, count: "{{ demand.pending }}"}
    confidence: 0.9
"""


def test_rules_fire_synchronously_with_the_ids_of_the_facts_they_joined() -> None:
    e = engine_of(RULES)
    facts = [fact("instance", "i1", daemon="down"), fact("instance", "i2"),
             fact("demand", pending=5), fact("fleet", active=2)]  # fmt: skip
    matches = e.match(facts, 1.0)
    fired = sorted((m.key, tuple(sorted(m.facts.items()))) for m in matches)
    assert ("rule:restart", (("instance", "i1"),)) in fired
    assert ("rule:grow", (("demand", "demand:all"), ("fleet", "fleet"))) in fired
    assert {m.facts["m"] for m in matches if m.abnormal_kind == "instance"} == {"i1"}
    assert not any(m.facts.get("instance") == "i2" for m in matches)


def test_the_facts_are_as_they_were_after_a_match_and_after_a_failed_one() -> None:
    e = engine_of(RULES)
    facts = [fact("instance", "i1", daemon="down"), fact("fleet", active=2)]
    before = [dict(f) for f in facts]
    e.match(facts, 1.0)
    assert facts == before  # the session id they carried while asserted is gone
    bad = [fact("instance", "i2"), fact("instance", "i3", restarts_1h=object())]
    with pytest.raises(EngineError, match="not JSON"):  # refused before durable_rules sees it
        e.match(bad, 2.0)
    assert all("sid" not in f for f in bad)
    assert any(m.rule == "restart" for m in e.match(facts, 3.0))  # and the engine still works


def test_each_call_is_a_fresh_session_the_same_facts_fire_again() -> None:
    e = engine_of(RULES)
    facts = [fact("instance", "i1", daemon="down")]
    first = e.match(facts, 1.0)
    second = e.match(facts, 1.0, reuse=False)  # identical facts: no MessageObservedException
    assert [m.key for m in first] == [m.key for m in second]
    assert any(m.rule == "restart" for m in second)


def test_a_batch_asserted_as_the_last_one_was_is_answered_as_it_was() -> None:
    """A quiet fleet asserts the same facts tick after tick: the engine answers them as it
    did, without a session; a changed value, another order of facts or reuse=False asserts."""
    e = engine_of(RULES)
    sessions: list[int] = []
    real = e._match

    def counted(batch: str, sid: str) -> list[object]:
        sessions.append(len(batch))
        return real(batch, sid)  # type: ignore[return-value]

    e._match = counted  # type: ignore[method-assign]
    facts = [fact("instance", "i1", daemon="down"), fact("demand", pending=5),
             fact("fleet", active=2)]  # fmt: skip
    first = e.match(facts, 1.0)
    again = e.match([dict(f) for f in facts], 2.0)  # another tick's stamp, the same facts
    assert again == first and len(sessions) == 1
    changed = e.match([facts[0], fact("demand", pending=1), facts[2]], 3.0)
    assert len(sessions) == 2 and not any(m.rule == "grow" for m in changed)
    assert any(m.rule == "grow" for m in e.match(facts, 4.0)) and len(sessions) == 3
    e.match(facts, 5.0, reuse=False)
    assert len(sessions) == 4
    assert any(m.rule == "restart" for m in engine_of(RULES).match(facts, 6.0))  # its own


def test_a_cross_fact_reference_compares_against_the_joined_fact() -> None:
    e = engine_of(RULES)
    assert not any(
        m.rule == "grow" for m in e.match([fact("demand", pending=2), fact("fleet", active=2)], 1.0)
    )
    assert any(
        m.rule == "grow" for m in e.match([fact("demand", pending=3), fact("fleet", active=2)], 1.0)
    )


TWO_REFS = """
normal:
  demand: {}
  fleet: {}
rules:
  - name: short
    when:
      demand: {task: all}
      fleet: {active: {lt: {ref: demand.pending}}, booting: {lte: {ref: demand.pending}}}
    then: {action: scale_to, count: "{{ demand.pending }}"}
    confidence: 0.9
"""


def test_every_join_condition_is_followed_by_one_that_always_holds() -> None:
    # durable_rules steps past the end of an alias's join conditions when the last one is
    # false and reads the memory beyond (a segfault at random: 8 of 30 processes over 1,000
    # matches of `RULES`, none of 40 with the guard). What the engine registered ends each
    # alias that joins with `t >= <kind>.t`; everything else is registered as written.
    from controller.rules.engine import _host

    guard = {"$gte": {"t": {"demand": "t"}}}
    for text, key in ((RULES, "rule:grow"), (TWO_REFS, "rule:short")):
        e = engine_of(text)
        written = e.book.definition
        registered = _host().get_ruleset(e._name).get_definition()
        assert {k: v for k, v in registered.items() if k != key} == {
            k: v for k, v in written.items() if k != key
        }
        demand, fleet = written[key]["all"]
        assert registered[key]["all"] == [
            demand,
            {"fleet": {"$and": [*fleet["fleet"]["$and"], guard]}},
        ]
        assert sum(c == guard for c in registered[key]["all"][1]["fleet"]["$and"]) == 1


def test_joins_whose_last_condition_fails_match_as_written_many_times_over() -> None:
    # Each of the two join conditions fails alone, both fail, both hold: only the last fires.
    e = engine_of(TWO_REFS)
    cases = [({"active": 3, "booting": 1}, False), ({"active": 1, "booting": 3}, False),
             ({"active": 3, "booting": 3}, False), ({"active": 1, "booting": 1}, True)]  # fmt: skip
    for n in range(200):
        fleet, fires = cases[n % 4]
        facts = [fact("demand", pending=2), fact("fleet", **fleet)]
        assert any(m.rule == "short" for m in e.match(facts, float(n), reuse=False)) is fires


def test_a_false_join_in_many_processes_never_crashes() -> None:
    # The crash the guard prevents depends on what lies in memory past the rule's expressions,
    # so it is sought in several processes, with freshly allocated memory filled (glibc's
    # MALLOC_PERTURB_) so that no stray byte ends the engine's search early.
    code = textwrap.dedent(
        """
        from support import engine_of, fact
        from test_engine import RULES
        e = engine_of(RULES)
        for n in range(1000):
            facts = [fact("instance", f"i{n}", daemon="down"), fact("demand", pending=n % 5),
                     fact("fleet", active=2)]
            e.match(facts, float(n), reuse=False)
        print("survived")
        """
    )
    here = Path(__file__).parent
    for perturb in ("", "1", "85", "254"):
        env = dict(os.environ, MALLOC_PERTURB_=perturb) if perturb else None
        out = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True,
                             text=True, timeout=120, env=env)  # fmt: skip
        assert out.returncode == 0, f"child exited {out.returncode}: {out.stderr[-500:]}"
        assert "survived" in out.stdout


def test_facts_no_rule_wants_and_batches_where_nothing_fires_are_fine() -> None:
    e = engine_of(RULES)
    assert e.match([fact("instance", "ok")], 1.0) == []
    # a kind without any normal pattern is outside the steady state: it surfaces, never hides
    sensor = e.match([fact("sensor", name="demand")], 1.0)
    assert [(m.abnormal_kind, m.facts) for m in sensor] == [("sensor", {"m": "sensor:demand"})]
    assert e.match([], 1.0) == []


def test_no_background_threads_are_started() -> None:
    before = threading.active_count()
    e = engine_of(RULES)
    for n in range(50):
        e.match([fact("instance", f"i{n}", daemon="down")], float(n))
    assert threading.active_count() == before


def test_two_rulebooks_live_side_by_side_and_a_reload_does_not_collide() -> None:
    a, b = engine_of(RULES), engine_of(RULES)  # same digest, distinct rulesets
    assert a.match([fact("instance", "x", daemon="down")], 1.0)
    assert b.match([fact("instance", "x", daemon="down")], 1.0)


def test_a_session_where_no_rule_fires_can_be_dropped_without_crashing() -> None:
    # durable_rules 2.0.28 segfaults in delete_state when no action ran in a session; the adapter
    # guards against it. Run in a child process so a regression fails this test, not the suite.
    code = textwrap.dedent(
        """
        from support import engine_of, fact
        from test_engine import RULES
        e = engine_of(RULES)
        for n in range(300):
            facts = [fact("fleet", active=1), fact("demand", pending=0)]
            if n % 7 == 0:
                facts.append(fact("instance", f"i{n}", daemon="down"))
            e.match(facts, float(n))
        print("survived")
        """
    )
    here = Path(__file__).parent
    out = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0, f"child exited {out.returncode}: {out.stderr[-500:]}"
    assert "survived" in out.stdout


def test_a_fact_given_twice_is_asserted_once() -> None:
    """durable_rules rejects a batch that repeats a fact (MessageObservedException): the
    adapter asserts it once, and the batch matches as with the fact given once."""
    e = engine_of(RULES)
    down = fact("instance", "i1", daemon="down")
    once = [down, fact("demand", pending=3), fact("fleet", active=1)]
    twice = e.match([down, dict(down), *once[1:]], 1.0, reuse=False)
    assert twice == e.match(once, 2.0, reuse=False)
    assert {m.rule for m in twice} >= {"restart", "grow"}
    # another fact with the same id: refused by name, before the engine sees it
    with pytest.raises(EngineError, match="two different facts have the id 'i1'"):
        e.match([down, fact("instance", "i1", daemon="up"), *once[1:]], 3.0)
    assert e.match(once, 4.0, reuse=False) == twice  # and the engine still works


@pytest.mark.parametrize(
    ("value", "below_3"),
    [(5e-05, True), (-5e-05, True), (1e-5, True), (5e-324, True), (1e16, False),
     (-1e16, True), (1e300, False), (float("inf"), False), (float("-inf"), True)],
)  # fmt: skip
def test_a_float_written_with_a_bare_exponent_does_not_blind_the_batch(
    value: float, below_3: bool
) -> None:
    # durable_rules reads `5e-05` or `1e+16` (an exponent, no decimal point) as nothing and
    # dropped the whole batch: no rule fired on any fact. The other facts still match, and
    # the value compares as itself.
    down = fact("instance", "i1", daemon="down", restarts_1h=value)
    for e in (engine_of(RULES), Engine(book_of(RULES), every_field=True)):
        fired = {m.rule for m in e.match([down, fact("demand", pending=3),
                                          fact("fleet", active=1)], 1.0)}  # fmt: skip
        assert "grow" in fired
        assert ("restart" in fired) is below_3
        assert down["restarts_1h"] == value  # the caller's fact is left as it was


def test_a_rejected_batch_leaves_the_engine_working() -> None:
    # Deleting the session of a batch durable_rules rejected corrupted its memory: the next
    # call or two segfaulted or aborted (the flaky crash of a whole test run). The adapter
    # leaves that session alone. In a child process, so a regression fails this test only.
    code = textwrap.dedent(
        """
        import json
        from support import engine_of, fact
        from test_engine import RULES
        from controller.rules.engine import EngineError
        e = engine_of(RULES)
        for n in range(30):
            sid = f"{e._name}.rejected{n}"
            down = dict(fact("instance", "i1", daemon="down"), sid=sid, t=0.0)
            try:  # past the adapter's own removal of repeats: the engine's rejection
                e._match(json.dumps([down, dict(down)]), sid)
            except EngineError as exc:
                assert "MessageObservedException" in str(exc), exc
            else:
                raise SystemExit("the repeated fact was not rejected")
            facts = [fact("instance", f"i{n}", daemon="down"), fact("demand", pending=n % 5),
                     fact("fleet", active=2)]
            assert any(m.rule == "restart" for m in e.match(facts, float(n), reuse=False))
        print("survived")
        """
    )
    here = Path(__file__).parent
    out = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0, f"child exited {out.returncode}: {out.stderr[-500:]}"
    assert "survived" in out.stdout


def test_the_fields_a_rulebook_names_include_references_and_normal_patterns() -> None:
    used = book_of(RULES).fields_used()
    assert used == {
        "instance": {"status", "daemon", "restarts_1h"},
        "demand": {"task", "pending"},
        "fleet": {"active"},
    }


def test_only_the_named_fields_are_asserted() -> None:
    # status_msg is named by no rule: never serialised, so even a value JSON cannot hold is fine
    odd = [fact("instance", "i1", daemon="down", status_msg=object()), fact("fleet", active=2)]
    assert [m.rule for m in engine_of(RULES).match(odd, 1.0) if m.rule] == ["restart"]
    with pytest.raises(EngineError, match="not JSON"):  # the whole fact would be
        Engine(book_of(RULES), every_field=True).match(odd, 1.0)


def test_asserting_only_the_named_fields_fires_what_whole_facts_fire() -> None:
    book = read_rulebook([ROOT / "rules"])
    now = 1_700_000_000.0
    obs = Observation(
        now,
        tuple(synthetic_instances(400, now)),
        (Demand("all", 250, 600, 900.0), Demand("PoRep", 250, 600, 900.0)),
        (SensorStatus("provider", "ok"), SensorStatus("demand", "stale", "late")),
    )
    facts = build_facts(obs, History(host_blocks={"m7": now + 60.0}), now) + [
        fact("instance", "dead", status="exited", status_for_s=400.0, daemon="down"),
        fact("instance", "stuck", stage="bench", stage_age_s=3000.0),
        fact("instance", "slow", bench_rate=10.0),
        fact("instance", "blocked", host_blocked=True),
        fact("instance", "looping", daemon="down", restarts_1h=3),
    ]
    slim = Engine(book).match(facts, now)
    whole = Engine(book, every_field=True).match(facts, now)
    assert sorted(slim, key=repr) == sorted(whole, key=repr)
    assert {m.key for m in slim} >= {
        "abnormal:instance", "abnormal:sensor", "rule:scale-to-proving-backlog",
        "rule:restart-silently-exited-daemon", "rule:destroy-dead-instance",
        "rule:replace-stuck-benchmarking", "rule:replace-slow-benchmark",
        "rule:replace-instance-on-blocked-host", "rule:replace-crash-looping-instance",
    }  # fmt: skip


def test_a_field_named_only_in_a_reference_reaches_the_engine() -> None:
    text = """
normal: {demand: {}, fleet: {}}
rules:
  - name: burst
    when:
      fleet: {}
      demand: {pending: {gt: {ref: fleet.serving}}}
    then: {action: hold, reason: burst}
    confidence: 0.9
"""
    assert book_of(text).fields_used() == {"fleet": {"serving"}, "demand": {"pending"}}
    e = engine_of(text)
    assert [m.rule for m in e.match([fact("demand", pending=3), fact("fleet", serving=1)], 1.0)
            if m.rule] == ["burst"]  # fmt: skip
    assert not [m for m in e.match([fact("demand", pending=3), fact("fleet", serving=5)], 2.0)
                if m.rule]  # fmt: skip


def test_a_batch_is_given_to_durable_rules_as_its_own_json_dumps_writes_it() -> None:
    """The adapter writes each fact's JSON once (the key of the last batch, and the text the
    engine parses): the text is the one `Host.assert_facts` would have written, byte for
    byte, so the engine is given what it was before, whatever the facts hold."""
    now = 1_700_000_000.0
    demand, sensor = Demand("all", 250, 600, 900.0), SensorStatus("provider", "ok")
    obs = Observation(now, tuple(synthetic_instances(200, now)), (demand,), (sensor,))
    odd = [
        fact("instance", "i-é", status_msg='naïve "quoted" \\ back\nline ✓', daemon="down"),
        {"kind": "instance", "id": 7, "labels": {"a": [1, 2.5, None, True]}, "dph": 1e-300},
        {"kind": "demand", "id": "d", "pending": float("nan"), "oldest_pending_s": -0.0},
        {},
    ]
    sid = "fleetgate_x_1.3"
    for facts in (build_facts(obs, History(), now), odd):
        slim = [Engine(book_of(RULES), every_field=True)._slim(f) for f in facts]
        tick = {"kind": "__tick__", "id": "__tick__", "sid": sid, "t": now}
        expected = json.dumps([tick, *(dict(f, sid=sid, t=now) for f in slim)],
                              ensure_ascii=False)  # fmt: skip
        assert _batch(tick, _texts(slim)) == expected


BY_THE_CLOCK = """
rules:
  - name: office-hours-floor
    when:
      fleet: {hour_utc: {gte: 8, lt: 18}, weekday_utc: {lte: 4}, active: {lt: 2}}
    then: {action: scale_to, count: 2}
    confidence: 0.9
"""


@pytest.mark.parametrize(("when", "fires"), [
    ("2026-12-07T16:00:00+00:00", True),  # a Monday, 16:00 UTC
    ("2026-12-11T08:00:00+00:00", True),  # a Friday, 08:00
    ("2026-12-07T18:00:00+00:00", False),  # Monday, 18:00: after hours
    ("2026-12-08T07:59:59+00:00", False),  # Tuesday, a second before 8
    ("2026-12-12T12:00:00+00:00", False),  # a Saturday
    ("2026-12-13T12:00:00+00:00", False),  # a Sunday
])  # fmt: skip
def test_a_rule_keeps_a_fleet_by_the_clock(when: str, fires: bool) -> None:
    """The fleet fact carries the tick's hour and weekday (UTC), so a rule can keep a floor in
    office hours; before, no condition could read the time."""
    now = datetime.fromisoformat(when).timestamp()
    facts = build_facts(Observation(now, (), (), ()), History(), now)
    fleet = next(f for f in facts if f["kind"] == "fleet")
    moment = datetime.fromisoformat(when)
    assert (fleet["hour_utc"], fleet["weekday_utc"]) == (moment.hour, moment.weekday())
    matched = engine_of(BY_THE_CLOCK).match(facts, now)
    rules = [m.key for m in matched if m.key.startswith("rule:")]
    assert rules == (["rule:office-hours-floor"] if fires else [])

"""The durable_rules adapter: synchronous, stateless per call, never crashes the process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from support import engine_of, fact

from controller.engine import EngineError

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
    bad = [fact("instance", "i2"), fact("instance", "i3", status_msg=object())]
    with pytest.raises(EngineError, match="not JSON"):  # refused before durable_rules sees it
        e.match(bad, 2.0)
    assert all("sid" not in f for f in bad)
    assert any(m.rule == "restart" for m in e.match(facts, 3.0))  # and the engine still works


def test_each_call_is_a_fresh_session_the_same_facts_fire_again() -> None:
    e = engine_of(RULES)
    facts = [fact("instance", "i1", daemon="down")]
    first = e.match(facts, 1.0)
    second = e.match(facts, 1.0)  # identical facts: no MessageObservedException
    assert [m.key for m in first] == [m.key for m in second]
    assert any(m.rule == "restart" for m in second)


def test_a_cross_fact_reference_compares_against_the_joined_fact() -> None:
    e = engine_of(RULES)
    assert not any(
        m.rule == "grow" for m in e.match([fact("demand", pending=2), fact("fleet", active=2)], 1.0)
    )
    assert any(
        m.rule == "grow" for m in e.match([fact("demand", pending=3), fact("fleet", active=2)], 1.0)
    )


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

"""`for:` on a rule: it fires only once its condition has held that long for one subject.

The hold is kept in the journal (`rule_pending`), not in the engine: a tick that sees the
condition not hold starts it over, and a controller restarted in a new process on the same
journal keeps its clock. Durations are strict (`file:line` errors); `explain` shows the rules
that wait, with the time left; rule tests say how long their facts have held (`held_for`).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import BACKENDS, StillFleet, book_of, fact, journal_on

from controller.core.matches import Match
from controller.core.model import Demand
from controller.rules.durations import parse_duration, show_duration
from controller.rules.engine import Engine
from controller.rules.hold import GAP_S, hold
from controller.rules.rulebook import RulesError
from controller.rules.ruletest import run_file
from controller.rules.source import RulesSource
from controller.service import commands
from controller.service.app import decide_settings
from controller.service.config import Config
from controller.service.tick import Controller
from controller.store.journal import Journal
from escalation.notify import Notifier
from escalation.render import Renderer
from escalation.router import Escalator

TESTS = Path(__file__).resolve().parent
RULES = """\
normal:
  demand: {}
  fleet: {}
  sensor: {state: ok}
rules:
  - name: backlog-for-ten-minutes
    description: tasks have been waiting for ten minutes
    when:
      demand: {task: all, pending: {gt: 0}}
    for: 10m
    then: {action: hold, reason: "backlog held"}
    confidence: 0.9
"""
START = 100_000.0
STEP = 60.0  # a tick a minute


class Queue(StillFleet):
    """A fleet of no instances and a proving queue whose size the test sets."""

    def __init__(self) -> None:
        self.pending = 3

    def demand(self) -> list[Demand]:
        return [Demand("PoRep", self.pending, 0), Demand("all", self.pending, 0)]


def controller(db: Path, rules: Path, clock: list[float], queue: Queue) -> Controller:
    journal = Journal(db)
    esc = Escalator(journal, Notifier([], Renderer()), window_s=3600, deadline_s=1800)
    return Controller(journal=journal, provider=queue, demand=queue, rules=RulesSource([rules]),
                      settings=decide_settings(Config()), escalator=esc,
                      clock=lambda: clock[0])  # fmt: skip


def fired_at(db: Path) -> list[float]:
    """When the rule's `hold` was recorded, oldest first."""
    journal = Journal(db)
    try:
        rows = journal.actions.recent(1000)
    finally:
        journal.close()
    return sorted(float(r["at"]) for r in rows if r["proposer"] == "rule:backlog-for-ten-minutes")


def run_ticks(db: str, rules: str, start: float, minutes: list[int], pending: list[int]) -> None:
    """Tick once at each of `minutes` after `start`, the queue holding `pending` tasks then."""
    clock, queue = [start], Queue()
    c = controller(Path(db), Path(rules), clock, queue)
    try:
        for minute, n in zip(minutes, pending, strict=True):
            clock[0], queue.pending = start + minute * STEP, n
            c.tick()
    finally:
        c.journal.close()


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    path = tmp_path / "rules" / "backlog.yaml"
    path.parent.mkdir()
    path.write_text(RULES)
    return path.parent


def test_fires_only_once_the_condition_has_held_for_its_duration(
    tmp_path: Path, rules: Path
) -> None:
    db = tmp_path / "j.db"
    run_ticks(str(db), str(rules), START, list(range(10)), [3] * 10)  # minutes 0-9: 9 min held
    assert fired_at(db) == []
    run_ticks(str(db), str(rules), START, [10], [3])  # minute 10: held 10 minutes
    assert fired_at(db) == [START + 10 * STEP]


def test_a_tick_that_sees_the_condition_not_hold_starts_the_clock_again(
    tmp_path: Path, rules: Path
) -> None:
    db = tmp_path / "j.db"
    pending = [3] * 8 + [0] + [3] * 10  # minute 8: the queue empties for one tick
    run_ticks(str(db), str(rules), START, list(range(19)), pending)
    assert fired_at(db) == []  # held from minute 9 to 18: 9 minutes
    run_ticks(str(db), str(rules), START, [19], [3])
    assert fired_at(db) == [START + 19 * STEP]


def test_a_new_process_on_the_same_journal_keeps_the_clock(tmp_path: Path, rules: Path) -> None:
    db = tmp_path / "j.db"
    code = textwrap.dedent("""
        import json, sys
        from test_rules_for import run_ticks
        run_ticks(*json.loads(sys.argv[1]))
    """)

    def process(minutes: list[int]) -> None:
        args = json.dumps([str(db), str(rules), START, minutes, [3] * len(minutes)])
        done = subprocess.run([sys.executable, "-c", code, args], cwd=TESTS, capture_output=True,
                              text=True, timeout=100, check=False,
                              env={"PYTHONPATH": f"{TESTS}:{TESTS.parent}"})  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]

    process([0, 1, 2, 3, 4, 5])  # one controller, stopped after five minutes of backlog
    assert fired_at(db) == []
    process([6, 7, 8, 9, 10, 11])  # another, on the same journal
    assert fired_at(db)[0] == START + 10 * STEP  # ten minutes after the first one saw it
    # a controller on a journal of its own starts from nothing
    fresh = tmp_path / "fresh.db"
    run_ticks(str(fresh), str(rules), START, [6, 7, 8, 9, 10, 11], [3] * 6)
    assert fired_at(fresh) == []


def test_explain_shows_the_waiting_rule_and_the_time_left(
    tmp_path: Path, rules: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    run_ticks(str(db), str(rules), START, [0, 1, 2, 3], [3] * 4)
    clock, queue = [START + 4 * STEP + 30], Queue()  # 4 min 30 s after it started to hold
    c = controller(db, rules, clock, queue)
    try:
        planned = c.plan(clock[0])
        doc = commands.explain_doc(planned)
        want = {"rule": "backlog-for-ten-minutes", "subject": "demand=demand:all",
                "since": START, "for_s": 600.0, "held_s": 270.0, "left_s": 330.0}  # fmt: skip
        assert doc["pending"] == [want]
        assert commands.explain(SimpleNamespace(controller=c), as_json=False) == 0  # type: ignore[arg-type]
    finally:
        c.journal.close()
    out = capsys.readouterr().out
    waiting = out[out.index("waiting (for:):") : out.index("plan:")].splitlines()[1:]
    assert [x.split() for x in waiting if x] == [
        ["backlog-for-ten-minutes", "←", "demand=demand:all:", "held", "4m30s", "of", "10m,",
         "fires", "in", "5m30s"]]  # fmt: skip
    assert fired_at(db) == []  # explain wrote nothing


# -- the pure part -------------------------------------------------------------------------------


def _match(pid: str = "demand:all") -> Match:
    return Match("rule:backlog-for-ten-minutes", {"demand": pid})


def test_hold_keeps_starts_and_drops_clocks() -> None:
    book = book_of(RULES)
    key = ("backlog-for-ten-minutes", "demand=demand:all")
    first = hold(book, [_match()], {}, 1000.0)
    assert first.fire == [] and first.pending == {key: (1000.0, 1000.0)}
    assert [(w.held_s, w.left_s) for w in first.waiting] == [(0.0, 600.0)]
    later = hold(book, [_match()], first.pending, 1599.0)
    assert later.fire == [] and later.pending[key] == (1000.0, 1599.0)
    ready = hold(book, [_match()], later.pending, 1600.0)
    assert ready.fire == [_match()] and ready.waiting == ()
    assert hold(book, [], ready.pending, 1660.0).pending == {}  # not matched: cleared
    # nobody watched for over GAP_S: the hold starts again
    stale = hold(book, [_match()], {key: (1000.0, 1000.0)}, 1000.0 + GAP_S + 1)
    assert stale.fire == [] and stale.pending[key][0] == 1000.0 + GAP_S + 1


def test_a_rule_without_for_fires_at_once_and_keeps_no_clock() -> None:
    book = book_of(RULES.replace("    for: 10m\n", ""))
    held = hold(book, [_match()], {}, 5.0)
    assert held.fire == [_match()] and held.pending == {} and held.waiting == ()


def test_each_subject_has_its_own_clock() -> None:
    text = RULES.replace("demand: {task: all, pending: {gt: 0}}", "demand: {pending: {gt: 0}}")
    book = book_of(text)
    engine = Engine(book)
    facts = [fact("demand", "demand:all", pending=3), fact("demand", "demand:PoRep", pending=3)]
    matches = [m for m in engine.match(facts, 0.0) if m.rule]
    assert len(matches) == 2
    before = {("backlog-for-ten-minutes", "demand=demand:all"): (0.0, 590.0)}
    held = hold(book, matches, before, 600.0)
    assert [m.facts for m in held.fire] == [{"demand": "demand:all"}]
    assert [w.subject for w in held.waiting] == ["demand=demand:PoRep"]


# -- durations -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("10m", 600), ("2h", 7200),
                                               ("1d", 86400), ("1h30m", 5400)])  # fmt: skip
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(show_duration(seconds)) == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("600", "expects a duration such as 90s, 10m, 2h or 1h30m"),
        ("10 minutes", "expects a duration such as 90s, 10m, 2h or 1h30m"),
        ("30m1h", "largest first"),
        ("1.5h", "expects a duration such as"),
        ("0s", "above zero"),
        ("31d", "at most 30d"),
        ("600", "got '600'"),
    ],
)
def test_a_bad_duration_is_an_error_at_its_line(value: str, message: str) -> None:
    text = RULES.replace("for: 10m", f"for: {value!r}" if value == "600" else f"for: {value}")
    with pytest.raises(RulesError) as err:
        book_of(text, "rules/backlog.yaml")
    [problem] = err.value.problems
    assert str(problem).startswith("rules/backlog.yaml:10: rule 'backlog-for-ten-minutes': for: ")
    assert message in problem.message


@pytest.mark.parametrize("value", ["600", "true", "[10m]"])
def test_a_duration_must_be_text_with_a_unit(value: str) -> None:
    with pytest.raises(RulesError, match=r"rules/test.yaml:10: .*for: expects a duration"):
        book_of(RULES.replace("for: 10m", f"for: {value}"))


def test_a_bare_number_is_refused_with_a_hint() -> None:
    with pytest.raises(RulesError, match=r"got 600 \(write e.g. 600s or 600m\)"):
        book_of(RULES.replace("for: 10m", "for: 600"))


# -- rule tests ----------------------------------------------------------------------------------


def test_rule_tests_say_how_long_the_facts_have_held(tmp_path: Path, rules: Path) -> None:
    tests = rules / "tests"
    tests.mkdir()
    (tests / "backlog_test.yaml").write_text(
        textwrap.dedent("""\
        rule_files: [../backlog.yaml]
        tests:
          - name: a fresh backlog waits
            facts: [{kind: demand, pending: 3}]
            expect: {proposals: [], pending: [backlog-for-ten-minutes], unmatched: []}
          - name: nine minutes are not enough
            facts: [{kind: demand, pending: 3}]
            held_for: 9m
            expect: {proposals: [], pending: [backlog-for-ten-minutes]}
          - name: ten minutes are
            facts: [{kind: demand, pending: 3}]
            held_for: 10m
            expect:
              proposals: [{rule: backlog-for-ten-minutes, action: hold}]
              pending: []
          - name: this one fails - it expects a proposal the hold withholds
            facts: [{kind: demand, pending: 3}]
            held_for: 5m
            expect: {proposals: [{rule: backlog-for-ten-minutes, action: hold}]}
    """)
    )
    results = run_file(tests / "backlog_test.yaml")
    assert [r.ok for r in results] == [True, True, True, False], [r.problems for r in results]
    assert "expected proposal not made" in results[3].problems[0]
    assert list(results[3].problems[1:]) == [
        "no rule proposed anything for these facts",
        "rules still waiting on their for: backlog-for-ten-minutes (the test's held_for: says "
        "how long its facts have held)",
    ]


def test_a_rule_test_with_a_bad_held_for_is_an_error_at_its_line(
    tmp_path: Path, rules: Path
) -> None:
    path = rules / "bad_test.yaml"
    path.write_text("rule_files: [backlog.yaml]\ntests:\n  - name: x\n    facts: []\n"
                    "    held_for: ten minutes\n    expect: {proposals: []}\n")  # fmt: skip
    [result] = run_file(path)
    assert not result.ok
    assert result.problems[0].startswith(f"{path}:5: held_for: expects a duration")


def test_the_holds_survive_in_the_journal_and_an_older_journal_has_none(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.db")
    journal.rule_pending.save({("r", "instance=i1"): (10.0, 70.0)})
    journal.close()
    again = Journal(tmp_path / "j.db", read_only=True)
    assert again.rule_pending.load() == {("r", "instance=i1"): (10.0, 70.0)}
    again.close()
    with closing(sqlite3.connect(tmp_path / "j.db")) as db:  # as a version without `for:` left it
        db.execute("DROP TABLE rule_pending")
        db.commit()
    old = Journal(tmp_path / "j.db", read_only=True)  # explain's: nothing is created
    assert old.rule_pending.load() == {}
    old.close()
    updated = Journal(tmp_path / "j.db")  # a controller brings it up to date
    assert updated.rule_pending.load() == {}
    updated.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_store_keeps_what_each_tick_saw_hold(backend: str, tmp_path: Path) -> None:
    with journal_on(backend, tmp_path) as j:
        j.rule_pending.save({("a", "instance=1"): (1.0, 5.0), ("b", "fleet=fleet"): (2.0, 5.0)})
        assert j.rule_pending.load() == {("a", "instance=1"): (1.0, 5.0),
                                         ("b", "fleet=fleet"): (2.0, 5.0)}  # fmt: skip
        # the next tick: `a` goes on, `b` stopped holding, `c` starts
        j.rule_pending.save({("a", "instance=1"): (1.0, 65.0), ("c", "instance=2"): (65.0, 65.0)})
        assert j.rule_pending.load() == {("a", "instance=1"): (1.0, 65.0),
                                         ("c", "instance=2"): (65.0, 65.0)}  # fmt: skip
        j.rule_pending.save({("a", "instance=1"): (1.0, 70.0), ("c", "instance=2"): (65.0, 90.0)})
        assert j.rule_pending.load()[("c", "instance=2")] == (65.0, 90.0)
        j.rule_pending.save({})
        assert j.rule_pending.load() == {}

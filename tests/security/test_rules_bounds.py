"""Rules files are operator input: what one costs is bounded (time, memory, message size).

One test per attack. Before these bounds each hung `fleetgate check` or a running controller's
tick (SIGTERM ignored), failed every tick without escalating, ate gigabytes, crashed the
process in durable_rules, or printed the input back as a 978 MB error. Attacks that could hang
or eat memory run in a child Python (address space capped at 2 GiB) that must answer within
10 s: the old code ran out the clock or died; the bounded code answers in well under a second.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from support import app_on_rules_copy

from controller.core.policy import DecideSettings
from controller.rules import expr
from controller.rules.engine import Engine, EngineError
from controller.rules.expr import ExprError, compile_expr
from controller.rules.fire import proposals_from
from controller.rules.rulebook import Rulebook, RulesError, load_texts
from controller.rules.ruletest import DEFAULTS
from controller.rules.source import Reload, RulesSource, read_rulebook

ROOT = Path(__file__).resolve().parents[2]
MEMORY = 2 << 30
CAP = 2_000  # characters of one error message (controller.rules.limits.MAX_MESSAGE)


def isolated(body: str, data: Any, timeout: float = 10.0) -> Any:
    """Run `body` in a child Python with `data` as DATA; the JSON it prints last."""
    code = (
        "import json, resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({MEMORY}, {MEMORY}))\n"
        "DATA = json.loads(sys.stdin.read())\n" + textwrap.dedent(body)
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], input=json.dumps(data), cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"no answer within {timeout:.0f} s: not bounded", pytrace=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


CHECK = """
from controller.rules.rulebook import RulesError, load_texts
try:
    load_texts([("rules/x.yaml", DATA)])
    print(json.dumps([]))
except RulesError as exc:
    print(json.dumps([str(p) for p in exc.problems]))
"""
TICK = """
from controller.rules.fire import proposals_from
from controller.rules.engine import Engine
from controller.rules.rulebook import load_texts
from controller.rules.ruletest import DEFAULTS
from controller.core.policy import DecideSettings
book = load_texts([("rules/x.yaml", DATA)])
facts = [dict(DEFAULTS["instance"], kind="instance", id="i1", daemon="down")]
matches = Engine(book).match(facts, 0.0)
props, doubts = proposals_from(matches, {"i1": facts[0]}, book, DecideSettings(), 0.0)
print(json.dumps({"proposals": len(props), "doubts": [[d.kind, d.summary] for d in doubts]}))
"""
NOTIFY = """rules:
  - name: r
    when: {{instance: {{daemon: down}}}}
    then:
      action: notify
      message: {}
    confidence: 0.5
"""


def notify(src: str) -> str:
    return NOTIFY.format(json.dumps(src))  # a JSON string is a YAML double-quoted scalar


# -- 1. expressions: bounded before they run, refused at check time when constant -----------

STATIC = [
    ("{{ 10 ** (10 ** 9) }}", "** with an exponent over 1000 (1000000000)"),  # hung check
    ("{{ (instance.num_gpus + 9) ** (10 ** 9) }}", "** with an exponent over 1000 (1000000000)"),
    ("{{ 'x' * 10**11 }}",
     "repeating a str 100000000000 times would be over 10000 characters or items"),
    ("{{ lipsum(10**6) }}", "unknown function lipsum() (expressions may call range() and "
                            "dict(), and methods of strings, lists and dicts)"),
    ("{{ range(10**9) | list }}", "range() of over 1000 items"),
    ('{{ "%0999999999d" % 1 }}', "a % format whose widths and values add up to over 10000"),
    ('{{ "x" | center(10**9) }}', "a width over 10000 (1000000000)"),
    ("{{ instance.id | center(10**9) }}", "a width over 10000 (1000000000)"),
    ("{{ [1] * 10**9 }}",
     "repeating a list 1000000000 times would be over 10000 characters or items"),
    ('{{ "{:>1000000000}".format(1) }}', "calling format() is not allowed in rule expressions"),
    ("{{ [1] | batch(10**9, 0) | list }}", "a count over 10000 (1000000000)"),
    ("{% for i in range(10**9) %}{{ i }}{% endfor %}",
     "only {{ ... }} expressions are allowed, not {% ... %} statements"),
    ("{{ 'x' * 9000 }}{{ 'y' * 9000 }}", "the result is over 10000 characters or items"),
    ("{{ 5 | round(-1000000000) }}",  # 10 ** precision: check hung
     "a round precision beyond +-100 (-1000000000)"),
    ("{{ instance.dph | round(100000000, 'ceil') }}",
     "a round precision beyond +-100 (100000000)"),
]  # fmt: skip


@pytest.mark.parametrize(("src", "reason"), STATIC, ids=[s for s, _ in STATIC])
def test_an_expression_over_a_bound_is_refused_by_check(src: str, reason: str) -> None:
    problems = isolated(CHECK, notify(src))
    assert problems == [f"rules/x.yaml:6: rule 'r': expression {src!r}: {reason}"]


AT_TICK = [
    ("{{ instance.label * 10**11 }}",  # passed check, then MemoryError out of every tick
     "repeating a str 100000000000 times would be over 10000 characters or items"),
    ("{{ (instance.num_gpus + 9) ** (instance.num_gpus * 10**9) }}",  # the tick never ended
     "** with an exponent over 1000 (1000000000)"),
    ("{{ (instance.label * 100) | center(instance.num_gpus * 10**9) }}",
     "a width over 10000 (1000000000)"),
    ("{{ instance.label * 1000 ~ instance.label * 1000 }}",  # 14 kB: a result over the cap
     "the result is over 10000 characters or items"),
    ("{{ instance.num_gpus | round(instance.num_gpus * (0 - 10**8)) }}",  # the tick never ended
     "a round precision beyond +-100 (-100000000)"),
]  # fmt: skip


@pytest.mark.parametrize(("src", "reason"), AT_TICK, ids=[s for s, _ in AT_TICK])
def test_an_expression_over_a_bound_at_tick_time_is_a_rule_error(src: str, reason: str) -> None:
    """Only the facts show it: the proposal is dropped with a rule error doubt (escalated),
    the way any parameter that does not evaluate is; nothing raises out of the tick."""
    assert isolated(CHECK, notify(src)) == []
    summary = f"rule 'r' (rules/x.yaml:2) could not build its action: {src!r}: {reason}"
    assert isolated(TICK, notify(src)) == {"proposals": 0, "doubts": [["rule_error", summary]]}


@pytest.mark.parametrize("error", [MemoryError, RecursionError])
def test_memory_and_recursion_errors_in_evaluation_are_rule_errors(
    error: type[Exception], monkeypatch: pytest.MonkeyPatch
) -> None:
    book = load_texts([("rules/x.yaml", notify("{{ instance.id }}"))])

    def fails(context: dict[str, Any]) -> Any:
        raise error("out of it")

    monkeypatch.setattr(expr, "_expression", lambda source: fails)
    fact = dict(DEFAULTS["instance"], kind="instance", id="i1", daemon="down")
    matches = Engine(book).match([fact], 0.0)
    props, doubts = proposals_from(matches, {"i1": fact}, book, DecideSettings(), 0.0)
    assert props == []
    assert [(d.kind, d.summary) for d in doubts] == [
        ("rule_error", "rule 'r' (rules/x.yaml:2) could not build its action: "
                       f"'{{{{ instance.id }}}}': {error.__name__}: out of it"),
    ]  # fmt: skip


RUNNING = """
import shutil
import time
from pathlib import Path
from controller.service.assemble import assemble
from controller.service.config import Config
tmp = Path(DATA["tmp"])
rules = tmp / "rules"
shutil.copytree("rules", rules, ignore=shutil.ignore_patterns("tests"))
app = assemble(Config(), state=tmp / "state", clock=time.time, sleep=time.sleep, seed=7,
               rules=[str(rules)])
app.controller.tick()
first = app.controller.rules.book.digest
(rules / "zz.yaml").write_text(DATA["text"])
app.controller.tick()
app.controller.tick()
reloads = [[r["ok"], r["digest"], r["problems"]] for r in app.journal.meta.reloads()]
print(json.dumps({"first": first, "reloads": reloads, "ticks": len(app.journal.meta.ticks(9))}))
app.close()
"""


def test_a_pow_bomb_dropped_into_a_running_controller_is_a_failed_reload(tmp_path: Path) -> None:
    src = "{{ (fleet.instances + 9) ** (10 ** 9) }}"
    text = NOTIFY.replace("daemon: down", "").replace("instance:", "fleet:").format(json.dumps(src))
    got = isolated(RUNNING, {"tmp": str(tmp_path), "text": text}, timeout=60.0)
    where = f"{tmp_path}/rules/zz.yaml:6: rule 'r'"
    problem = f"{where}: expression {src!r}: ** with an exponent over 1000 (1000000000)"
    assert got == {"first": got["first"], "reloads": [[0, got["first"], problem]], "ticks": 3}


# -- 2. YAML aliases ---------------------------------------------------------------------------


def test_billion_laughs_is_refused_at_the_alias_that_goes_over_the_bound() -> None:
    lines = ["lol:", '  a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    lines += [
        "rules:",
        "  - {name: r, when: {instance: {}}, then: {action: hold}, confidence: *a8}",
    ]
    text = "\n".join(lines) + "\n"
    assert len(text.encode()) < 700  # 9 levels of 9: a billion values once expanded
    problems = isolated(CHECK, text)
    # a0 .. a3 expand to 10, 91, 820 and 7,381 values: the first *a3 (line 6) goes over 10,000
    assert problems == [
        "rules/x.yaml:6: invalid YAML: aliases (*name) expand to more than 10000 values "
        "(write the values out)"
    ]


# -- 3. `matches` patterns the engine would refuse ---------------------------------------------

MATCHES = """rules:
  - name: odd-gpu
    when: {{instance: {{gpu_name: {{matches: {}}}}}}}
    then: {{action: hold}}
    confidence: 0.5
"""
SUPPORT = "regular expression {!r}: the rule engine does not support "


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("a{2,300}", "the repeat {2,300} (at most 100, and n <= m)"),  # refused at load
        ("RTX.*+", "a repeat right after a repeat (at 'RTX.*+': no lazy *? or possessive *+)"),
        ("RTX 4090( Ti|){2,}", "a repeat '{2,}' of a part that can match nothing"),  # hangs
        ("100%", "the escape '%' (it escapes with %: %d %w %s %a %l %u %x %c %g %p, or % before "
                 "one of .|?*+()[]{}%; write %% for a %)"),
    ],
)  # fmt: skip
def test_a_pattern_outside_the_engines_dialect_is_refused_by_check(
    pattern: str, reason: str
) -> None:
    with pytest.raises(RulesError) as caught:
        load_texts([("rules/x.yaml", MATCHES.format(json.dumps(pattern)))])
    assert [str(p) for p in caught.value.problems] == [
        f"rules/x.yaml:3: rule 'odd-gpu': field 'gpu_name': {SUPPORT.format(pattern)}{reason}"
    ]


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("(a|b)*a(a|b){13}", "the rule engine refuses it (durable_rules error 504): its "
                             "automaton grows too large; use fewer or smaller repeats and "
                             "alternatives"),
        ("aa+%w%w+", "the rule engine crashes or hangs compiling it"),  # it aborts the process
    ],
)  # fmt: skip
def test_a_pattern_the_engine_cannot_compile_is_refused_by_check(
    pattern: str, reason: str, tmp_path: Path
) -> None:
    """Only compiling tells (automaton limits, heap corruption): check compiles each pattern
    in a child process, so a crash there is a problem at file:line, not a dead controller."""
    (tmp_path / "x.yaml").write_text(MATCHES.format(json.dumps(pattern)))
    with pytest.raises(RulesError) as caught:
        read_rulebook([tmp_path])
    where = f"{tmp_path / 'x.yaml'}:3: rule 'odd-gpu': field 'gpu_name'"
    assert str(caught.value) == f"{where}: regular expression {pattern!r}: {reason}"


def test_a_pattern_the_engine_dwells_on_is_refused_and_trying_stops_within_a_budget(
    tmp_path: Path,
) -> None:
    """`(%w*%d){N}` takes durable_rules 8 to 9 s each to refuse: a reload of 6 such patterns
    stalled a running controller's tick for 49 s. Each gets a second; after 5 s of trying, the
    rest are problems untried."""
    lines = ["rules:"]
    for n in range(40, 20, -1):
        lines += [f"  - name: m{n}", f"    when: {{instance: {{status_msg: {{matches: "
                  f"\"(%w*%d){{{n}}}\"}}}}}}", "    then: {action: hold}",
                  "    confidence: 0.5"]  # fmt: skip
    (tmp_path / "x.yaml").write_text("\n".join(lines) + "\n")
    with pytest.raises(RulesError) as caught:
        read_rulebook([tmp_path])
    problems = [str(p) for p in caught.value.problems]
    assert len(problems) == 20
    where = f"{tmp_path / 'x.yaml'}:3: rule 'm40': field 'status_msg'"
    assert problems[0] == (f"{where}: regular expression '(%w*%d){{40}}': the rule engine "
                           "takes over 1 s to compile it; use fewer or smaller repeats and "
                           "alternatives")  # fmt: skip
    untried = [p for p in problems if "not tried: trying the rules' new patterns took over "
               "5 s (fix the ones above first)" in p]  # fmt: skip
    assert 0 < len(untried) < 20 and problems[-1] in untried


def write_later(path: Path, text: str) -> None:
    path.write_text(text)  # a different size: the fingerprint of the files changes


def test_a_reload_the_engine_would_refuse_is_a_failed_reload(tmp_path: Path) -> None:
    rules = tmp_path / "x.yaml"
    rules.write_text(MATCHES.format('"RTX.*"'))
    source = RulesSource([tmp_path])
    first, engine = source.book, source.engine
    write_later(rules, MATCHES.format('"a{2,300}"'))
    problem = f"{rules}:3: rule 'odd-gpu': field 'gpu_name': {SUPPORT.format('a{2,300}')}"
    assert source.reload() == Reload(
        False, first.digest, source._seen, problem + "the repeat {2,300} (at most 100, and n <= m)"
    )
    assert (source.book, source.engine) == (first, engine)  # the last good rules stay


def test_an_engine_that_fails_to_build_for_any_reason_is_a_failed_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = tmp_path / "x.yaml"
    rules.write_text(MATCHES.format('"RTX.*"'))
    source = RulesSource([tmp_path])
    first, engine = source.book, source.engine

    def refuses(book: Rulebook) -> Engine:
        raise EngineError(f"durable_rules refused the rules ({book.digest}): error code: 999")

    monkeypatch.setattr("controller.rules.source.Engine", refuses)
    write_later(rules, MATCHES.format('"RTX 4090.*"'))
    reloaded = source.reload()
    assert reloaded is not None and not reloaded.ok and reloaded.digest == first.digest
    assert reloaded.problems.startswith(f"{tmp_path}: the rule engine refused the rules: ")
    assert reloaded.problems.endswith("error code: 999")
    assert (source.book, source.engine) == (first, engine)


def test_the_loop_journals_a_reload_the_engine_would_refuse(tmp_path: Path) -> None:
    app, rules = app_on_rules_copy(tmp_path)
    try:
        app.controller.tick()
        first = app.controller.rules.book.digest
        (rules / "zz.yaml").write_text(MATCHES.format('"a{2,300}"'))
        app.controller.tick()  # raised EngineError out of the tick before
        reloads = [(r["ok"], r["digest"], r["problems"]) for r in app.journal.meta.reloads()]
        assert reloads == [(0, first, f"{rules / 'zz.yaml'}:3: rule 'odd-gpu': field "
                            f"'gpu_name': {SUPPORT.format('a{2,300}')}the repeat {{2,300}} "
                            "(at most 100, and n <= m)")]  # fmt: skip
        assert app.controller.rules.book.digest == first
    finally:
        app.close()


# -- 4. every rules error message is capped ----------------------------------------------------


def test_a_huge_name_is_named_not_echoed() -> None:
    text = f"rules:\n  - {{name: r, when: {{instance: {{}}}}, then: {{action: {'x' * 100_000}}}, " \
           "confidence: 0.5}\n"  # fmt: skip
    with pytest.raises(RulesError) as caught:
        load_texts([("rules/x.yaml", text)])
    (problem,) = caught.value.problems
    assert len(problem.message) == CAP and problem.message.endswith("…")
    assert str(problem).startswith("rules/x.yaml:2: rule 'r': unknown action 'xxxxxxxx")


def test_a_huge_value_is_shown_bounded() -> None:
    text = f"rules:\n  - {{name: r, when: {{instance: {{}}}}, then: {{action: hold}}, " \
           f"confidence: {list(range(10_000))}}}\n"  # fmt: skip
    with pytest.raises(RulesError) as caught:
        load_texts([("rules/x.yaml", text)])
    assert str(caught.value) == (
        "rules/x.yaml:2: rule 'r': confidence must be a number from 0 to 1, "
        "got [0, 1, 2, 3, 4, 5, ...]"
    )


def test_a_yaml_error_names_the_problem_not_the_input() -> None:
    with pytest.raises(RulesError) as caught:
        load_texts([("rules/x.yaml", "rules: *" + "a" * 100_000 + "\n")])
    (problem,) = caught.value.problems
    assert problem.message.startswith("invalid YAML: found undefined alias 'aaaa")
    assert len(problem.message) == CAP and problem.message.endswith("…")


def test_many_problems_are_listed_up_to_a_cap() -> None:
    with pytest.raises(RulesError) as caught:
        load_texts([("rules/x.yaml", "".join(f"k{i}: 1\n" for i in range(150)))])
    assert len(caught.value.problems) == 150
    lines = str(caught.value).splitlines()
    assert lines[:100] == [str(p) for p in caught.value.problems[:100]]
    assert lines[100:] == ["… and 50 more problems"]


def test_an_evaluation_error_message_is_capped() -> None:
    src = "{{ instance.num_gpus / 0 }}" + " " * 1968  # under the 2,000 an expression may have
    with pytest.raises(ExprError) as caught:
        compile_expr(src).evaluate({"instance": {"num_gpus": 1}})
    message = str(caught.value)
    assert len(message) == CAP and message.endswith("…")
    assert message.startswith("'{{ instance.num_gpus / 0 }}")

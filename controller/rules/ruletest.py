"""Rule unit tests: facts in, expected proposals and unmatched facts out.

A test file (YAML):

    rule_files: [../crashes.yaml]      # relative to this file; default: every rules file in ..
    settings: {tasks_per_instance: 2}  # optional, for every test in the file
    tests:
      - name: a silently exited daemon is restarted
        facts:
          - {kind: instance, id: "i1", daemon: down}   # merged over a healthy serving instance
        held_for: 11m                                 # optional: how long the facts have held
        settings: {idle_wait_s: 300}                  # optional, for this test (over the file's)
        expect:
          proposals:
            - {rule: restart-silently-exited-daemon, action: restart_daemon, params: {instance: i1}}
          unmatched: []                               # optional: exact list of fact ids
          pending: []                                 # optional: `for:` rules still waiting

`proposals` must match exactly: every expected one present (params compared as a subset),
none unexpected. Matching runs through durable_rules and `decide`, as a tick does.

`held_for` is how long every condition the facts meet has held already (default: they hold
from now): a rule with `for: 10m` fires in a test with `held_for: 10m` or more, and otherwise
waits, listed under `pending` (by rule name). Settings (the file's, then a test's) override the
rules files' own, in conditions and parameters alike, as the config's do.

A test file is read strictly: a key outside the shape above (a misspelled `expect:`, `facts`
under `expect`, `acton` in a proposal), a fact of an unknown kind or a test without `expect`
is an error at its `file:line`, never a test that passes by checking nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller import textfile
from controller.core.decide import unmatched
from controller.core.policy import DecideSettings
from controller.rules.durations import parse_duration
from controller.rules.engine import Engine
from controller.rules.fire import proposals_from
from controller.rules.hold import hold, subject
from controller.rules.rulebook import RulesError
from controller.rules.source import read_rulebook
from controller.rules.yamlsrc import Located, YamlError, load

DEFAULTS: dict[str, dict[str, Any]] = {
    "instance": {
        "label": "fg-test", "machine_id": "m1", "host_id": "h1", "status": "running",
        "stage": "running", "daemon": "up", "sidecar": "up", "gpu_name": "RTX 4090",
        "num_gpus": 1, "dph": 0.5, "tasks_running": 1, "drained": False, "status_msg": "",
        "age_s": 7200.0, "stage_age_s": 3600.0, "status_for_s": 3600.0, "down_for_s": 0.0,
        "restarts_1h": 0, "deaths_1h": 0, "idle_for_s": 0.0, "host_blocked": False,
        "replacing": False, "retiring": False, "parked": False, "bench_rate": 35.0,
    },
    "demand": {
        "task": "all", "pending": 0, "running": 0, "oldest_pending_s": 0.0, "max_retries": 0,
    },
    "fleet": {"instances": 1, "active": 1, "serving": 1, "booting": 0, "dead": 0, "drained": 0,
              "parked": 0, "pending_launches": 0, "spend_per_h": 0.5, "launches_1h": 0,
              "starts_1h": 0, "pending": 0, "running_tasks": 0, "hour_utc": 12,
              "weekday_utc": 2},
    "sensor": {"name": "provider", "state": "ok", "detail": ""},
}  # fmt: skip


@dataclass(frozen=True)
class Result:
    where: str
    name: str
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def _fact(raw: dict[str, Any], n: int) -> dict[str, Any]:
    kind = str(raw.get("kind", ""))
    fact = {"kind": kind, **DEFAULTS.get(kind, {}), **raw}
    if kind == "demand":
        fact.setdefault("id", f"demand:{fact['task']}")
        # as sensed before Curio has timed a task: one slot per pending task
        fact.setdefault("backlog_slots", float(fact["pending"]))
    elif kind in ("fleet",):
        fact.setdefault("id", "fleet")
    elif kind == "sensor":
        fact.setdefault("id", f"sensor:{fact['name']}")
    else:
        fact.setdefault("id", f"{kind}{n}")
    fact["id"] = str(fact["id"])
    return fact


def _matches(exp: dict[str, Any], got: dict[str, Any]) -> bool:
    """An expected proposal matches when every key it names agrees (params as a subset)."""
    for key, want in exp.items():
        if key == "params":
            if not all(got["params"].get(k) == v for k, v in (want or {}).items()):
                return False
        elif got.get(key) != want:
            return False
    return True


def _compare(expected: list[dict[str, Any]], got: list[dict[str, Any]]) -> list[str]:
    problems = []
    left = list(got)
    for exp in expected:
        hit = next((g for g in left if _matches(exp, g)), None)
        if hit is None:
            problems.append(f"expected proposal not made: {exp}")
        else:
            left.remove(hit)
    problems += [f"unexpected proposal: {g}" for g in left]
    return problems


def run_test(engine: Engine, test: dict[str, Any], settings: DecideSettings) -> list[str]:
    facts = [_fact(f, n) for n, f in enumerate(test.get("facts") or [])]
    matches = engine.match(facts, 0.0)
    by_id = {f["id"]: f for f in facts}
    held_s = parse_duration(test["held_for"]) if "held_for" in test else 0.0
    holds = {(str(m.rule), subject(m)): (-held_s, 0.0) for m in matches if m.rule}
    held = hold(engine.book, matches, holds, 0.0)
    props, doubts = proposals_from(held.fire, by_id, engine.book, settings, 0.0)
    got = [
        {"rule": p.proposer.removeprefix("rule:"), "action": p.action, "params": p.params}
        for p in props
    ]
    expect = test.get("expect") or {}
    problems = _compare(list(expect.get("proposals") or []), got)
    if any(p.startswith("expected proposal not made") for p in problems):
        if not got:
            problems.append("no rule proposed anything for these facts")
        waiting = sorted({w.rule for w in held.waiting})
        if waiting:
            problems.append(f"rules still waiting on their for: {', '.join(waiting)} (the "
                            "test's held_for: says how long its facts have held)")  # fmt: skip
    problems += [f"rule error: {d.summary}" for d in doubts]
    if "unmatched" in expect:
        un = sorted(str(f["id"]) for d in unmatched(matches, by_id) for f in d.facts)
        if un != sorted(str(x) for x in expect["unmatched"]):
            problems.append(f"unmatched facts: expected {sorted(expect['unmatched'])}, got {un}")
    if "pending" in expect:
        waiting = sorted(w.rule for w in held.waiting)
        if waiting != sorted(str(x) for x in expect["pending"] or []):
            problems.append(f"pending rules: expected {sorted(expect['pending'] or [])}, "
                            f"got {waiting}")  # fmt: skip
    return problems


FILE_KEYS = frozenset({"rule_files", "settings", "tests"})
TEST_KEYS = frozenset({"name", "facts", "expect", "held_for", "settings"})
EXPECT_KEYS = frozenset({"proposals", "unmatched", "pending"})
PROPOSAL_KEYS = frozenset({"rule", "action", "params"})


def _unknown(where: str, value: Any, allowed: frozenset[str], what: str) -> list[str]:
    """`where:line: KEY: unknown key in WHAT (expected one of ...)` for each stray key."""
    if not isinstance(value, dict):
        return [f"{where}:{getattr(value, 'line', 0)}: {what} must be a mapping"]
    line_of = value.line_of if isinstance(value, Located) else (lambda _k: 0)
    return [f"{where}:{line_of(str(k))}: {str(k)[:40]}: unknown key in {what} "
            f"(expected one of {', '.join(sorted(allowed))})"
            for k in value if k not in allowed]  # fmt: skip


def shape_problems(where: str, doc: Any) -> list[str]:
    """Everything in a test file outside the documented shape (module docstring)."""
    problems = _unknown(where, doc, FILE_KEYS, "the test file")
    tests = doc.get("tests") if isinstance(doc, dict) else None
    if not isinstance(tests, list) or not tests:
        return [*problems, f"{where}:{getattr(doc, 'line', 0)}: tests: a list of tests is needed"]
    for test in tests:
        problems += _unknown(where, test, TEST_KEYS, "a test")
        if not isinstance(test, dict):
            continue
        line = getattr(test, "line", 0)
        problems += _test_values(where, test, line)
        if "expect" not in test:
            problems.append(f"{where}:{line}: expect: missing (a test must expect something)")
        else:
            expect = test["expect"]
            problems += _unknown(where, expect, EXPECT_KEYS, "expect")
            for proposal in (expect.get("proposals") or []) if isinstance(expect, dict) else []:
                problems += _unknown(where, proposal, PROPOSAL_KEYS, "an expected proposal")
        for fact in test.get("facts") or []:
            kind = fact.get("kind") if isinstance(fact, dict) else None
            if kind not in DEFAULTS:
                problems.append(f"{where}:{getattr(fact, 'line', line)}: kind: {str(kind)[:40]!r} "
                                f"is not a fact kind (one of {', '.join(DEFAULTS)})")  # fmt: skip
    return problems


def _test_values(where: str, test: dict[str, Any], line: int) -> list[str]:
    """A test's `held_for` (a duration) and `settings` (a mapping), where given."""
    at = test.line_of if isinstance(test, Located) else (lambda _k: line)
    problems = []
    if "held_for" in test:
        try:
            parse_duration(test["held_for"])
        except ValueError as exc:
            problems.append(f"{where}:{at('held_for')}: held_for: {exc}")
    if "settings" in test and not isinstance(test["settings"], dict):
        problems.append(f"{where}:{at('settings')}: settings: must map names to values")
    return problems


def run_file(path: Path) -> list[Result]:
    try:
        doc = load(textfile.read_text(path)) or {}
    except (OSError, YamlError) as exc:
        return [Result(str(path), "(file)", (str(exc),))]
    shape = shape_problems(str(path), doc)
    if shape:
        return [Result(str(path), "(file)", tuple(shape))]
    files = [path.parent / f for f in doc.get("rule_files") or []] or [path.parent.parent]
    engines: dict[str, Engine] = {}  # one per distinct set of settings

    def engine_for(values: dict[str, Any], origin: str) -> Engine:
        key = repr(sorted(values.items()))
        if key not in engines:
            engines[key] = Engine(read_rulebook(files, values, origin))
        return engines[key]

    file_values = dict(doc.get("settings") or {})
    try:
        engine_for(file_values, f"{path}'s settings")
    except RulesError as exc:
        return [Result(str(path), "(rules)", tuple(str(p) for p in exc.problems))]
    base = DecideSettings()
    results = []
    for test in doc.get("tests") or []:
        where = f"{path}:{getattr(test, 'line', 0)}"
        values = {**file_values, **(test.get("settings") or {})}
        try:
            engine = engine_for(values, f"the settings of the test at {where}")
        except RulesError as exc:
            results.append(Result(where, str(test.get("name", "?")),
                                  tuple(str(p) for p in exc.problems)))  # fmt: skip
            continue
        settings = DecideSettings(values={**base.values, **values})
        results.append(
            Result(where, str(test.get("name", "?")), tuple(run_test(engine, test, settings)))
        )
    return results


def run_files(paths: list[Path]) -> list[Result]:
    files: list[Path] = []
    for p in paths:
        files += sorted(p.glob("*.yaml")) if p.is_dir() else [p]
    return [r for f in files for r in run_file(f)]

"""The shipped rules against their unit tests (rules/tests/*.yaml), and the test runner's teeth.

- every case in rules/tests passes;
- every shipped rule is expected to fire in at least one case, and every rules file has its
  `<name>_test.yaml` (a new rule or file without a test fails here);
- the runner reports a wrong expectation as a failure that says what differs;
- `fleetgate test-rules` exits 0 on the shipped tests and 1 on a failing file.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from controller.core.facts import build_facts
from controller.core.model import Demand, Instance, Observation, SensorStatus
from controller.core.track import History
from controller.rules.ruletest import DEFAULTS, Result, run_files
from controller.rules.source import read_rulebook, rule_files
from controller.rules.yamlsrc import load

ROOT = Path(__file__).parent.parent
RULES = ROOT / "rules"
RULE_TESTS = RULES / "tests"


def _report(results: list[Result]) -> str:
    return "\n".join(f"{r.where}: {r.name}\n    " + "\n    ".join(r.problems)
                     for r in results if not r.ok)  # fmt: skip


def _test_docs() -> dict[Path, dict[str, Any]]:
    return {p: load(p.read_text(encoding="utf-8")) or {} for p in sorted(RULE_TESTS.glob("*.yaml"))}


def _fleetgate() -> Path:
    for candidate in (
        Path(sys.executable).parent / "fleetgate",
        ROOT / ".venv" / "bin" / "fleetgate",
    ):
        if candidate.is_file():
            return candidate
    pytest.skip("the fleetgate console script is not installed next to this interpreter")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(_fleetgate()), "test-rules", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


# ---------------------------------------------------------------- the shipped rules pass


def test_every_shipped_rule_test_passes() -> None:
    results = run_files([RULE_TESTS])
    assert results, f"no rule tests found in {RULE_TESTS}"
    failed = [r for r in results if not r.ok]
    assert not failed, f"{len(failed)} of {len(results)} rule test(s) failed:\n{_report(failed)}"


@pytest.mark.parametrize("variant", ["forecast", "warm-pool"])
def test_the_opt_in_scaling_variants_pass_their_rule_tests(variant: str) -> None:
    """The scaling variants under controller/examples/ (each in place of scaling.yaml, beside
    the other shipped files): their tests pass as `fleetgate test-rules DIR` runs them."""
    tests = ROOT / "controller" / "examples" / variant / "tests"
    results = run_files([tests])
    assert len(results) >= 10, f"too few rule tests in {tests}"
    failed = [r for r in results if not r.ok]
    assert not failed, f"{len(failed)} of {len(results)} rule test(s) failed:\n{_report(failed)}"
    done = _cli(str(tests))
    assert done.returncode == 0 and f"{len(results)} passed, 0 failed" in done.stdout, done.stdout


def test_every_shipped_rule_is_expected_to_fire_somewhere() -> None:
    names = {rule.name for rule in read_rulebook([RULES]).rules}
    assert names, "no shipped rules found"
    expected: set[str] = set()
    for doc in _test_docs().values():
        for case in doc.get("tests") or []:
            for proposal in (case.get("expect") or {}).get("proposals") or []:
                expected.add(str(proposal.get("rule")))
    missing = sorted(names - expected)
    assert not missing, f"rules without a test case that expects them to fire: {missing}"
    unknown = sorted(expected - names)
    assert not unknown, f"test cases expect rules that do not exist: {unknown}"


def test_every_rules_file_has_its_test_file() -> None:
    files = rule_files([RULES])
    assert files, "no shipped rules files found"
    missing = [f.name for f in files if not (RULE_TESTS / f"{f.stem}_test.yaml").is_file()]
    assert not missing, f"rules files without rules/tests/<name>_test.yaml: {missing}"


def test_each_test_file_loads_its_own_rules_file() -> None:
    for path, doc in _test_docs().items():
        listed = [(path.parent / f).resolve() for f in doc.get("rule_files") or []]
        own = RULES / (path.stem.removesuffix("_test") + ".yaml")
        if own.is_file():
            assert own.resolve() in listed, f"{path.name} does not load {own.name}"


# ---------------------------------------------------------------- the runner can fail

_DOWN = {"kind": "instance", "daemon": "down"}
_RESTART = {"rule": "restart-silently-exited-daemon", "action": "restart_daemon"}

# Each case is wrong in one way; `problems` are substrings its report must contain, `count` the
# exact number of problems reported.
WRONG: list[Any] = [
    pytest.param(
        {
            "name": "wrong action",
            "facts": [{**_DOWN, "id": "i1"}],
            "expect": {
                "proposals": [{**_RESTART, "action": "reboot", "params": {"instance": "i1"}}]
            },
            "problems": [
                "expected proposal not made: {'rule': 'restart-silently-exited-daemon', "
                "'action': 'reboot'",
                "unexpected proposal: {'rule': "
                "'restart-silently-exited-daemon', 'action': 'restart_daemon', "
                "'params': {'instance': 'i1'}}",
            ],
            "count": 2,
        },
        id="wrong-action",
    ),
    pytest.param(
        {
            "name": "wrong rule name",
            "facts": [{**_DOWN, "id": "i1"}],
            "expect": {"proposals": [{**_RESTART, "rule": "restart-daemon"}]},
            "problems": [
                "expected proposal not made: {'rule': 'restart-daemon'",
                "unexpected proposal: {'rule': 'restart-silently-exited-daemon'",
            ],
            "count": 2,
        },
        id="wrong-rule",
    ),
    pytest.param(
        {
            "name": "wrong param: the instance",
            "facts": [{**_DOWN, "id": "i1"}],
            "expect": {"proposals": [{**_RESTART, "params": {"instance": "i2"}}]},
            "problems": [
                "expected proposal not made: {'rule': 'restart-silently-exited-daemon', "
                "'action': 'restart_daemon', 'params': {'instance': 'i2'}}",
                "unexpected proposal: {'rule': 'restart-silently-exited-daemon', "
                "'action': 'restart_daemon', 'params': {'instance': 'i1'}}",
            ],
            "count": 2,
        },
        id="wrong-param-instance",
    ),
    pytest.param(
        {
            "name": "wrong param: the rendered count",
            "facts": [
                {"kind": "demand", "pending": 5, "running": 2, "oldest_pending_s": 600.0},
                {"kind": "fleet", "running_tasks": 2},
            ],
            "expect": {
                "proposals": [
                    {
                        "rule": "scale-to-proving-backlog",
                        "action": "scale_to",
                        "params": {"count": 3},
                    }
                ]
            },
            "problems": [
                "expected proposal not made: {'rule': 'scale-to-proving-backlog', "
                "'action': 'scale_to', 'params': {'count': 3}}",
                "unexpected proposal: {'rule': 'scale-to-proving-backlog', "
                "'action': 'scale_to', 'params': {'count': 4}}",
            ],
            "count": 2,
        },
        id="wrong-param-count",
    ),
    pytest.param(
        {
            "name": "wrong param: the rendered reason",
            "facts": [{**_DOWN, "id": "i1", "restarts_1h": 3}],
            "expect": {
                "proposals": [
                    {
                        "rule": "replace-crash-looping-instance",
                        "action": "replace",
                        "params": {"instance": "i1", "reason": "crash loop"},
                    }
                ]
            },
            "problems": [
                "expected proposal not made",
                "'reason': 'crash loop'}",
                "unexpected proposal",
                "'crash loop: 3 restarts in the last hour'",
            ],
            "count": 2,
        },
        id="wrong-param-reason",
    ),
    pytest.param(
        {
            "name": "missing expected proposal",
            "facts": [
                {"kind": "demand"},
                {"kind": "fleet"},
                {"kind": "instance", "id": "i1", "idle_for_s": 600.0},
                {"kind": "instance", "id": "i2", "idle_for_s": 599.0},
            ],
            "expect": {
                "proposals": [
                    {
                        "rule": "scale-down-idle-instance",
                        "action": "destroy",
                        "params": {"instance": "i1"},
                    },
                    {
                        "rule": "scale-down-idle-instance",
                        "action": "destroy",
                        "params": {"instance": "i2"},
                    },
                ]
            },
            "problems": [
                "expected proposal not made: {'rule': 'scale-down-idle-instance', "
                "'action': 'destroy', 'params': {'instance': 'i2'}}"
            ],
            "count": 1,
        },
        id="missing-proposal",
    ),
    pytest.param(
        {
            "name": "expected proposal, nothing made",
            "facts": [{"kind": "instance", "id": "i1"}],
            "expect": {"proposals": [{**_RESTART, "params": {"instance": "i1"}}]},
            "problems": [
                "expected proposal not made: {'rule': 'restart-silently-exited-daemon'",
                "no rule proposed anything for these facts",
            ],
            "count": 2,
        },
        id="nothing-made",
    ),
    pytest.param(
        {
            "name": "unexpected extra proposal",
            "facts": [{**_DOWN, "id": "i1"}, {**_DOWN, "id": "i2", "restarts_1h": 3}],
            "expect": {"proposals": [{**_RESTART, "params": {"instance": "i1"}}]},
            "problems": [
                "unexpected proposal: {'rule': 'replace-crash-looping-instance', "
                "'action': 'replace', 'params': {'instance': 'i2', 'block_host': True, "
                "'reason': 'crash loop: 3 restarts in the last hour'}}"
            ],
            "count": 1,
        },
        id="extra-proposal",
    ),
    pytest.param(
        {
            "name": "unexpected extra proposal of the same rule",
            "facts": [{**_DOWN, "id": "i1"}, {**_DOWN, "id": "i2"}],
            "expect": {"proposals": [{**_RESTART, "params": {"instance": "i1"}}]},
            "problems": [
                "unexpected proposal: {'rule': 'restart-silently-exited-daemon', "
                "'action': 'restart_daemon', 'params': {'instance': 'i2'}}"
            ],
            "count": 1,
        },
        id="extra-proposal-same-rule",
    ),
    pytest.param(
        {
            "name": "no proposal expected, one made",
            "facts": [{**_DOWN, "id": "i1"}],
            "expect": {"proposals": []},
            "problems": [
                "unexpected proposal: {'rule': 'restart-silently-exited-daemon', "
                "'action': 'restart_daemon', 'params': {'instance': 'i1'}}"
            ],
            "count": 1,
        },
        id="none-expected",
    ),
    pytest.param(
        {
            "name": "wrong unmatched: a 10-minute reboot expected matched",
            "facts": [
                {"kind": "instance", "id": "i1", "status": "rebooting", "status_for_s": 600.0}
            ],
            "expect": {"proposals": [], "unmatched": []},
            "problems": ["unmatched facts: expected [], got ['i1']"],
            "count": 1,
        },
        id="unmatched-missing",
    ),
    pytest.param(
        {
            "name": "wrong unmatched: a healthy instance expected unmatched",
            "facts": [{"kind": "instance", "id": "i1"}, {"kind": "sensor", "state": "failed"}],
            "expect": {"proposals": [], "unmatched": ["i1"]},
            "problems": ["unmatched facts: expected ['i1'], got ['sensor:provider']"],
            "count": 1,
        },
        id="unmatched-wrong",
    ),
]

RIGHT = {
    "name": "a correct case in the same file",
    "facts": [{**_DOWN, "id": "i1"}],
    "expect": {"proposals": [{**_RESTART, "params": {"instance": "i1"}}], "unmatched": []},
}


def _write_failing(directory: Path) -> Path:
    shipped = [str(f.resolve()) for f in rule_files([RULES])]
    cases = [{k: v for k, v in p.values[0].items() if k not in ("problems", "count")}
             for p in WRONG]  # fmt: skip
    path = directory / "wrong_test.yaml"
    doc = {"rule_files": shipped, "tests": [*cases, RIGHT]}
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")  # JSON is YAML
    return path


@pytest.fixture(scope="module")
def wrong_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    results = run_files([_write_failing(tmp_path_factory.mktemp("wrong"))])
    by_name = {r.name: r for r in results}
    assert len(by_name) == len(results) == len(WRONG) + 1, results
    return by_name


def test_runner_passes_a_correct_case_next_to_wrong_ones(wrong_results: dict[str, Result]) -> None:
    right = wrong_results[RIGHT["name"]]
    assert right.ok, right.problems


@pytest.mark.parametrize("case", WRONG)
def test_runner_reports_a_wrong_expectation(
    case: dict[str, Any], wrong_results: dict[str, Result]
) -> None:
    result = wrong_results[case["name"]]
    assert not result.ok, f"{case['name']!r} passed but should fail"
    report = "\n".join(result.problems)
    for needle in case["problems"]:
        assert needle in report, f"{case['name']!r}: {needle!r} not in:\n{report}"
    assert len(result.problems) == case["count"], report


def test_runner_reports_a_broken_test_file(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "broken_test.yaml"
    bad_yaml.write_text("tests:\n  - name: x\n    facts: [\n", encoding="utf-8")
    missing = tmp_path / "missing_rules_test.yaml"
    missing.write_text("rule_files: [does-not-exist.yaml]\n"
                       "tests: [{name: x, facts: [], expect: {proposals: []}}]\n",
                       encoding="utf-8")  # fmt: skip
    results = run_files([bad_yaml, missing])
    assert [r.name for r in results] == ["(file)", "(rules)"], results
    assert all(not r.ok and r.problems for r in results), results


STRAY = """\
rule_files: [../crashes.yaml]
tests:
  - name: a misspelled expect checks nothing
    facts:
      - {kind: instance, id: i1, daemon: down}
    expext:
      proposals: []
  - name: a stray key in a proposal
    facts:
      - {kind: instanse, id: i1}
    expect:
      proposals:
        - {rule: r, acton: restart_daemon}
      unmatchd: []
"""


def test_a_test_file_outside_its_shape_is_an_error_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "stray_test.yaml"
    path.write_text(STRAY, encoding="utf-8")
    [result] = run_files([path])
    assert not result.ok and result.name == "(file)"
    at = f"{path}:"
    assert result.problems == (
        f"{at}6: expext: unknown key in a test (expected one of expect, facts, held_for, name, "
        "settings)",
        f"{at}3: expect: missing (a test must expect something)",
        f"{at}14: unmatchd: unknown key in expect (expected one of pending, proposals, unmatched)",
        f"{at}13: acton: unknown key in an expected proposal (expected one of action, params, "
        "rule)",
        f"{at}10: kind: 'instanse' is not a fact kind (one of instance, demand, fleet, sensor)",
    ), result.problems


PARKED = """\
rules:
  - name: stop-idle-drained
    when:
      instance: {drained: true, tasks_running: 0, parked: false}
    then: {action: stop, instance: "{{ instance.id }}"}
    confidence: 0.9
  - name: quiet-fleet
    when:
      fleet: {parked: 0, pending_launches: 0}
    then: {action: notify, message: "nothing parked or on its way"}
    confidence: 0.9
"""
PARKED_TEST = """\
rule_files: [parked.yaml]
tests:
  - name: fields every tick's facts carry hold in a test's plain facts too
    facts:
      - {kind: instance, id: i1, drained: true, tasks_running: 0}
      - {kind: fleet}
    expect:
      proposals:
        - {rule: stop-idle-drained, action: stop, params: {instance: i1}}
        - {rule: quiet-fleet, action: notify}
"""


def test_a_test_fact_carries_the_fields_every_tick_fact_has(tmp_path: Path) -> None:
    """`parked: false` (every instance not parked) matched in a tick, not in a rule test."""
    (tmp_path / "parked.yaml").write_text(PARKED, encoding="utf-8")
    (tmp_path / "parked_test.yaml").write_text(PARKED_TEST, encoding="utf-8")
    [result] = run_files([tmp_path / "parked_test.yaml"])
    assert result.ok, result.problems


def test_the_test_defaults_name_every_field_a_tick_always_sets() -> None:
    inst = Instance("i1", "fg-1", "m1", "h1", "running", "running", "up", "up")
    ok = (SensorStatus("provider", "ok"),)
    facts = build_facts(Observation(0.0, (inst,), (Demand("all", 0, 0),), ok), History(), 0.0)
    for f in facts:
        always = set(f) - {"kind", "id", "backlog_slots"}  # backlog_slots: from pending
        assert always <= set(DEFAULTS[f["kind"]]), (f["kind"], always - set(DEFAULTS[f["kind"]]))


def _readme_yaml(first_line: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S)
               if b.startswith(first_line)]  # fmt: skip
    return block


def test_the_readme_rules_and_rule_test_examples_load_and_pass(tmp_path: Path) -> None:
    """What an operator copies from the Rules and Rule unit tests sections works as shown."""
    rules = tmp_path / "example.yaml"
    rules.write_text(_readme_yaml("normal:"), encoding="utf-8")
    book = read_rulebook([rules])
    assert [r.name for r in book.rules] == ["restart-silently-exited-daemon"]
    assert book.warnings == ()
    test = _readme_yaml("rule_files:")
    shipped = [str(RULES / n) for n in ("crashes.yaml", "scaling.yaml", "lifecycle.yaml",
                                        "hosts.yaml")]  # fmt: skip
    doc = load(test)
    assert [str(f) for f in doc["rule_files"]] == [f"../{Path(f).name}" for f in shipped]
    (tmp_path / "example_test.yaml").write_text(
        re.sub(r"rule_files: \[.*\]", f"rule_files: {json.dumps(shipped)}", test),
        encoding="utf-8",
    )
    [result] = run_files([tmp_path / "example_test.yaml"])
    assert result.ok, result.problems


# ---------------------------------------------------------------- the CLI


def test_cli_passes_on_the_shipped_tests() -> None:
    proc = _cli("rules/tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = re.search(r"^(\d+) passed, 0 failed$", proc.stdout, re.MULTILINE)
    assert summary, proc.stdout
    assert int(summary.group(1)) == len(run_files([RULE_TESTS])) > 0
    assert "FAIL" not in proc.stdout


def test_cli_fails_on_a_failing_file(tmp_path: Path) -> None:
    path = _write_failing(tmp_path)
    results = run_files([path])
    failed = sum(1 for r in results if not r.ok)
    assert failed >= len([p for p in WRONG if not p.marks]), results
    proc = _cli(str(path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = f"{len(results) - failed} passed, {failed} failed"
    assert re.search(rf"^{summary}$", proc.stdout, re.MULTILINE), proc.stdout
    assert "FAIL" in proc.stdout and "expected proposal not made" in proc.stdout
    both = _cli("rules/tests", str(path))
    assert both.returncode == 1, both.stdout + both.stderr
    assert re.search(rf"^\d+ passed, {failed} failed$", both.stdout, re.MULTILINE), both.stdout

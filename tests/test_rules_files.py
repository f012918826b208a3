"""Rules files as operators write them (STYLE habit 4).

- `tests/data/rules/good/*.yaml` load and compile;
- `tests/data/rules/bad/*.yaml` each hold one mistake and say, in `# expect: LINE: TEXT` comments,
  which `path:LINE: ...TEXT...` problems the loader must report (and no others). A file with a
  `# xfail: REASON` comment shows a known loader bug: its expectations say what *should* happen;
- `fleetgate check` on the shipped rules and on a bad file;
- random mutations of the shipped rules never escape as anything but `RulesError`.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import EXPECT, cases, read, rel

from controller.core.facts import FIELDS
from controller.rules.engine import Engine
from controller.rules.fieldinfo import INFO
from controller.rules.rulebook import Problem, RulesError, load_texts
from controller.rules.source import read_rulebook
from controller.service import cli

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "rules"
SHIPPED = ROOT / "rules"
GOOD = sorted((DATA / "good").glob("*.yaml"))
BAD = sorted((DATA / "bad").glob("*.yaml"))
DUP = sorted((DATA / "bad" / "dup").glob("*.yaml"))


def load_error(files: Sequence[tuple[str, str]]) -> RulesError:
    try:
        load_texts(files)
    except RulesError as exc:
        return exc
    pytest.fail(f"{', '.join(p for p, _ in files)}: loaded without problems")


def assert_reported(paths: Sequence[Path]) -> None:
    """Every `# expect: LINE: TEXT` of `paths` is one problem at exactly that line, naming the
    file; nothing else is reported; and the error prints one problem per line."""
    expected = [(rel(p), int(m[1]), m[2].strip()) for p in paths for m in EXPECT.finditer(read(p))]
    assert expected, "a bad file needs at least one '# expect: LINE: TEXT' comment"
    exc = load_error([(rel(p), read(p)) for p in paths])
    report = "\n".join(str(p) for p in exc.problems)
    unmatched: list[Problem] = list(exc.problems)
    for path, line, text in expected:
        hit = next(
            (p for p in unmatched if p.path == path and p.line == line and text in str(p)), None
        )
        assert hit is not None, f"no problem {path}:{line}: ...{text}... in:\n{report}"
        assert str(hit).startswith(f"{path}:{line}: ")
        unmatched.remove(hit)
    assert not unmatched, "unexpected problems:\n" + "\n".join(str(p) for p in unmatched)
    assert str(exc).splitlines() == [str(p) for p in exc.problems]


# -- good files -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_good_rules_file_loads_and_compiles(path: Path) -> None:
    text = read(path)
    book = load_texts([(rel(path), text)])
    doc = yaml.safe_load(text) or {}
    names = [r["name"] for r in doc.get("rules") or []]
    assert [r.name for r in book.rules] == names
    assert {k for k in book.definition if k.startswith("rule:")} == {f"rule:{n}" for n in names}
    for rule in book.rules:
        join = book.definition[f"rule:{rule.name}"]["all"]
        assert [next(iter(alias)) for alias in join] == list(rule.when)
        assert rule.path == rel(path) and rule.line >= 1
    assert set(book.normal) == set(doc.get("normal") or {})


def test_good_files_use_every_operator() -> None:
    book = load_texts([(rel(p), read(p)) for p in GOOD])
    written = set(
        re.findall(r"\b(gt|gte|lt|lte|eq|neq|in|matches|exists): ", "".join(read(p) for p in GOOD))
    )
    assert written == {"gt", "gte", "lt", "lte", "eq", "neq", "in", "matches", "exists"}
    compiled = set(re.findall(r'"(\$\w+)"', str(book.definition).replace("'", '"')))
    assert {"$gt", "$gte", "$lt", "$lte", "$neq", "$or", "$mt", "$ex", "$nex"} <= compiled


def test_good_folder_is_one_valid_rulebook_for_the_engine() -> None:
    book = load_texts([(rel(p), read(p)) for p in GOOD])
    assert len({r.name for r in book.rules}) == len(book.rules)
    Engine(book)  # durable_rules accepts the compiled definition


@pytest.mark.parametrize(("active", "fires"), [(2, True), (5, False), (9, False)])
def test_join_reference_compares_two_facts(active: int, fires: bool) -> None:
    book = load_texts([(rel(DATA / "good" / "join.yaml"), read(DATA / "good" / "join.yaml"))])
    demand = dict(kind="demand", id="demand:all", task="all", pending=5, running=1,
                  oldest_pending_s=0.0, max_retries=3)  # fmt: skip
    fleet = dict(kind="fleet", id="fleet", instances=active, active=active, serving=0, booting=0,
                 dead=0, drained=0, spend_per_h=0.0, launches_1h=0, pending=5,
                 running_tasks=1)  # fmt: skip
    matches = Engine(book).match([demand, fleet], 0.0)
    grow = [m for m in matches if m.key == "rule:grow-when-fewer-active-than-pending"]
    assert bool(grow) is fires
    if fires:
        assert grow[0].facts == {"demand": "demand:all", "fleet": "fleet"}


# -- bad files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", cases(BAD))
def test_bad_rules_file_reports_its_error(path: Path) -> None:
    assert_reported([path])


def test_duplicate_rule_name_across_files() -> None:
    for path in DUP:
        load_texts([(rel(path), read(path))])  # each file alone is fine
    assert_reported(DUP)


def test_bad_folder_holds_the_errors_the_brief_lists() -> None:
    stems = {p.stem for p in BAD}
    assert {
        "yaml_syntax",
        "duplicate_key",
        "unknown_top_level_key",
        "rules_not_list",
        "rule_not_mapping",
        "missing_name",
        "missing_when",
        "missing_then",
        "missing_confidence",
        "bad_name",
        "unknown_rule_key",
        "unknown_kind",
        "unknown_field",
        "unknown_operator",
        "in_not_list",
        "matches_bad_regex",
        "exists_not_bool",
        "gt_string",
        "plain_list_value",
        "ref_kind_not_earlier",
        "ref_unknown_field",
        "unknown_action",
        "unknown_parameter",
        "jinja_syntax_error",
        "expr_unbound_name",
        "confidence_out_of_range",
        "confidence_not_number",
        "priority_not_integer",
        "normal_matches",
        "several_errors",
    } <= stems
    assert len(DUP) == 2


# -- known loader bugs that need more than one file --------------------------------------------

RULE = """rules:
  - name: r
    when: {instance: {%s}}
    then: {action: hold, reason: "{{ instance.id }}"}
    confidence: 0.5
"""


@pytest.mark.parametrize("cond", ["{neq: prefetch}", "{in: [preferred, other]}"])
def test_normal_value_containing_ref_is_not_a_reference(cond: str) -> None:
    book = load_texts([("normal.yaml", f"normal:\n  instance: {{label: {cond}}}\n")])
    assert book.normal["instance"]


@pytest.mark.parametrize(
    "when", ["", "    when: {}\n", "    when: instance\n"], ids=["missing", "empty", "scalar"]
)
def test_a_broken_when_is_reported_once(when: str) -> None:
    text = RULE.replace("    when: {instance: {%s}}\n", when)
    exc = load_error([("r.yaml", text)])
    assert len(exc.problems) == 1, str(exc)


def test_a_field_without_a_value_is_not_told_to_use_in() -> None:
    exc = load_error([("r.yaml", RULE % "daemon: ")])
    assert len(exc.problems) == 1
    assert exc.problems[0].line == 3 and "'daemon'" in exc.problems[0].message
    assert "in: [...]" not in exc.problems[0].message


def test_merge_key_override_is_not_a_duplicate_key() -> None:
    text = (
        "rules:\n"
        "  - &base {name: a, when: {instance: {}}, then: {action: hold}, confidence: 0.5}\n"
        "  - <<: *base\n"
        "    name: b\n"
    )
    try:
        book = load_texts([("merge.yaml", text)])
    except RulesError as exc:
        assert "merge" in exc.problems[0].message  # refusing them is fine, if it says so
    else:
        assert [r.name for r in book.rules] == ["a", "b"]


def test_a_file_that_is_not_utf8_is_a_rules_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("# café\nrules: []\n".encode("latin-1"))
    with pytest.raises(RulesError) as caught:
        read_rulebook([path])
    assert str(caught.value).startswith(f"{path}:")


def test_deeply_nested_yaml_is_a_rules_error() -> None:
    exc = load_error([("deep.yaml", "rules: " + "[" * 3000 + "]" * 3000 + "\n")])
    assert exc.problems[0].line == 1


# -- reading from disk --------------------------------------------------------------------------


def test_missing_file_is_a_file_level_problem(tmp_path: Path) -> None:
    with pytest.raises(RulesError) as caught:
        read_rulebook([tmp_path / "nope.yaml"])
    (problem,) = caught.value.problems
    assert (problem.line, problem.path) == (0, str(tmp_path / "nope.yaml"))
    assert problem.message.startswith("cannot read: ")


def test_folder_without_rules_files_is_a_problem(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.yaml").write_text("rules: []\n")  # sub-folders are not read
    with pytest.raises(RulesError) as caught:
        read_rulebook([tmp_path])
    assert str(caught.value) == f"{tmp_path}: no rules files found"


# -- shipped rules ----------------------------------------------------------------------------


def test_shipped_rules_load_without_problems() -> None:
    book = read_rulebook([SHIPPED])
    assert book.rules
    assert set(book.paths) == {str(p) for p in SHIPPED.glob("*.yaml")}
    assert len(book.definition) > len(book.rules)


def test_every_shipped_rule_has_a_description() -> None:
    book = read_rulebook([SHIPPED])
    assert [r.name for r in book.rules if not r.description] == []


# -- fleetgate check ----------------------------------------------------------------------------


def shipped_count() -> int:
    return len(read_rulebook([SHIPPED]).rules)


def fleetgate() -> list[str]:
    script = Path(sys.executable).with_name("fleetgate")
    if script.exists():
        return [str(script)]
    return [
        sys.executable,
        "-c",
        "import sys; from controller.service.cli import main; sys.exit(main())",
    ]


@pytest.mark.usefixtures("restore_logging")
def test_check_shipped_rules(capsys: pytest.CaptureFixture[str], monkeypatch: Any) -> None:
    monkeypatch.chdir(ROOT)
    assert cli.main(["check", "rules"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"ok: {shipped_count()} rules in ")
    assert err == ""


@pytest.mark.usefixtures("restore_logging")
def test_check_bad_file(capsys: pytest.CaptureFixture[str], monkeypatch: Any) -> None:
    monkeypatch.chdir(ROOT)
    assert cli.main(["check", "tests/data/rules/bad/unknown_operator.yaml"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "tests/data/rules/bad/unknown_operator.yaml:8: rule 'restart-daemon': unknown operator "
        "'greater' (expected one of gt, gte, lt, lte, eq, neq, in, matches, exists)\n"
    )


def test_check_console_script_on_shipped_rules() -> None:
    done = subprocess.run(
        [*fleetgate(), "check", "rules"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.startswith(f"ok: {shipped_count()} rules in ")


def test_check_console_script_on_bad_files() -> None:
    bad = "tests/data/rules/bad/several_errors.yaml"
    done = subprocess.run(
        [*fleetgate(), "check", "rules", bad],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == len(EXPECT.findall(read(ROOT / bad)))
    assert all(re.match(rf"{re.escape(bad)}:\d+: \S", line) for line in lines), done.stderr


# -- robustness -------------------------------------------------------------------------------

SHIPPED_FILES = sorted(SHIPPED.glob("*.yaml"))
GARBAGE = [
    "{", "}", "[", "]", ":", "- ", "?", "&a", "*a", "!!binary", "!!timestamp", "!!set", "'", '"',
    "#", "|", ">-", "%", "@", "`", "{{", "}}", "{% if %}", "~", "null", "-.inf", ".nan", "yes",
    "<<:", "greater:", "instanse:", "daemn:", "{ref: demand.pending}", "{in: x}", "{lt: {}}",
    "[]", "{}", "zzz", "\t", "é", "1_000", "0x1F", "2024-05-01", "{{ nope }}", "\\", ",",
]  # fmt: skip
WORDS = [
    "instance", "demand", "fleet", "sensor", "instanse", "daemon", "daemn", "status", "pending",
    "gt", "lt", "in", "matches", "exists", "greater", "ref", "when", "then", "whenn", "name",
    "action", "confidence", "priority", "hold", "notify", "launch", "restart_deamon", "round",
    "int", "zzz", "true", "null", "1.5", "-3",
]  # fmt: skip


def mutate(text: str, rng: random.Random) -> str:
    """One to three random edits: delete, duplicate, re-indent or swap lines, garble a token,
    or swap a word for another (often valid YAML with a semantic mistake)."""
    lines = text.split("\n")
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(lines))
        op = rng.choice(["delete", "duplicate", "indent", "swap", "token", "word", "word"])
        if op == "delete" and len(lines) > 1:
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "indent":
            lines[i] = " " * rng.randint(0, 8) + lines[i].lstrip(" ")
        elif op == "swap":
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            pattern, pool = (r"\S+", GARBAGE) if op == "token" else (r"[A-Za-z_]\w*", WORDS)
            tokens = list(re.finditer(pattern, lines[i]))
            if tokens:
                t = rng.choice(tokens)
                lines[i] = lines[i][: t.start()] + rng.choice(pool) + lines[i][t.end() :]
    return "\n".join(lines)


@pytest.mark.parametrize("seed", range(200))
def test_mutated_shipped_rules_fail_cleanly(seed: int) -> None:
    rng = random.Random(seed)
    source = rng.choice(SHIPPED_FILES)
    text = mutate(read(source), rng)
    path = f"mutated/{source.name}"
    try:
        load_texts([(path, text)])
    except RulesError as exc:
        assert exc.problems
        for p in exc.problems:
            assert p.path == path
            assert 1 <= p.line <= len(text.splitlines()) + 1, f"{p}\n---\n{text}"
            assert p.message.strip(), f"{p}\n---\n{text}"


# -- conditions that can never match: warnings, not errors ------------------------------------

NEVER = """\
settings: {fast: 2000}
rules:
  - name: r
    when:
      instance: {COND}
    then: {action: hold}
    confidence: 0.9
"""


@pytest.mark.parametrize(
    ("cond", "warning"),
    [
        (
            "bench_rate: {gt: 1000}",
            "field 'bench_rate': gt 1000 is outside what it takes (bench_rate is from 0 to 1000)",
        ),
        ("bench_rate: {gte: {setting: fast}}", "field 'bench_rate': gte 2000 is outside"),
        ("age_s: {lt: 0}", "field 'age_s': lt 0 is outside what it takes (age_s is at least 0)"),
        ("restarts_1h: {gt: 5, lt: 3}", "field 'restarts_1h': gt 5 and lt 3 exclude each other"),
        (
            "restarts_1h: {gt: 2, lt: 3}",
            "gt 2 and lt 3 exclude each other (counts are whole numbers)",
        ),
        ("dph: {gte: 2, lte: 1.5}", "field 'dph': gte 2 and lte 1.5 exclude each other"),
        (
            "restarts_1h: {gt: 3, eq: 2}",
            "field 'restarts_1h': eq 2 is outside what it may be (restarts_1h is a whole "
            "number at least 0, gt 3)",
        ),
        ("restarts_1h: 1.5", "field 'restarts_1h': eq 1.5 is outside what it may be"),
        (
            "restarts_1h: {in: [-1, -2]}",
            "none of in [-1, -2] is possible (restarts_1h is a whole number at least 0)",
        ),
        ("restarts_1h: {eq: '3'}", "restarts_1h holds number, never text '3'"),
        ("drained: 'no'", "field 'drained': drained holds bool, never text 'no'"),
        ("label: {gt: 3}", "field 'label': gt compares numbers, and label holds text"),
        ("label: {eq: a, neq: a}", "field 'label': eq and neq 'a' together"),
        ("label: {eq: a, in: [b, c]}", "field 'label': eq 'a' is not among in ['b', 'c']"),
        ("bench_rate: {exists: false, gt: 3}", "exists: false, yet gt needs the field"),
        ("parked: 'no'", "field 'parked': parked holds bool, never text 'no'"),
        ("gpu_name: {matches: '^RTX 4090'}", "'^RTX 4090': '^' is a plain character in the"),
        ("label: {matches: 'fg-.*$'}", "matches 'fg-.*$': '$' is a plain character"),
        ("gpu_name: {matches: 'RTX 30\\d0'}", "'\\d' is a plain character"),
        ("parked_for_s: {lt: 0}", "field 'parked_for_s': lt 0 is outside what it takes"),
        ("starting_for_s: {gt: 5, lt: 3}", "field 'starting_for_s': gt 5 and lt 3 exclude"),
    ],
)
def test_a_condition_that_can_never_match_is_a_warning_at_its_line(cond: str, warning: str) -> None:
    book = load_texts([("rules/never.yaml", NEVER.replace("{COND}", "{" + cond + "}"))])
    [only] = book.warnings
    assert str(only).startswith("rules/never.yaml:5: rule 'r': field ")
    assert warning in only.message
    assert only.message.endswith(": the rule can never fire")
    Engine(book)  # a warning, not an error: the rules load and run


@pytest.mark.parametrize(
    ("kind", "cond", "warning"),
    [
        ("demand", "forecast_instances: {eq: 'two'}", "forecast_instances holds number, never"),
        ("demand", "forecast_pending: {lt: 0}", "field 'forecast_pending': lt 0 is outside"),
        ("demand", "backlog_slots: true", "backlog_slots holds number, never bool True"),
        ("demand", "task_s: {gt: 9, lt: 3}", "field 'task_s': gt 9 and lt 3 exclude"),
        ("demand", "forecast_horizon_s: {lt: 0}", "field 'forecast_horizon_s': lt 0 is"),
        ("fleet", "parked: 'none'", "field 'parked': parked holds number, never text 'none'"),
        ("fleet", "starts_1h: {gt: 1, lt: 2}", "field 'starts_1h': gt 1 and lt 2 exclude"),
    ],
)
def test_a_forecast_or_warm_pool_field_that_can_never_match_is_a_warning(
    kind: str, cond: str, warning: str
) -> None:
    text = NEVER.replace("instance: {COND}", f"{kind}: {{{cond}}}")
    [only] = load_texts([("rules/never.yaml", text)]).warnings
    assert warning in only.message and only.message.endswith(": the rule can never fire")


def test_every_fact_field_has_a_type_for_the_warnings() -> None:
    """A field without one is never judged: `parked: "no"` loaded without a word."""
    assert {k: set(v) for k, v in INFO.items()} == {k: set(v) for k, v in FIELDS.items()}


@pytest.mark.parametrize(
    "cond",
    [
        "bench_rate: {gt: 999}", "bench_rate: {lte: 1000, gte: 1000}", "age_s: {lte: 0}",
        "restarts_1h: {gt: 2, lte: 3}", "restarts_1h: {in: [-1, 2]}", "dph: {gt: 1, lt: 1.5}",
        "drained: false", "label: {eq: a, neq: b}", "bench_rate: {exists: false}",
        "host_rate: {gte: {setting: fast}, exists: true, lt: 3000}",
        "gpu_name: {matches: 'RTX 30%d0'}", "status_msg: {matches: '^.*'}",
    ],
)  # fmt: skip
def test_a_condition_that_can_match_gives_no_warning(cond: str) -> None:
    text = NEVER.replace("{COND}", "{" + cond + "}").replace("fast: 2000", "fast: 10")
    assert load_texts([("rules/never.yaml", text)]).warnings == ()


def test_good_and_shipped_rules_give_no_warnings() -> None:
    assert load_texts([(rel(p), read(p)) for p in GOOD]).warnings == ()
    assert read_rulebook([SHIPPED]).warnings == ()


@pytest.mark.usefixtures("restore_logging")
def test_check_prints_warnings_and_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "never.yaml"
    path.write_text(NEVER.replace("{COND}", "{bench_rate: {gt: 1000}, age_s: {lt: 0}}"))
    assert cli.main(["--state", str(tmp_path / "s"), "check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("ok: 1 rules in 1 file(s)")
    assert err.splitlines() == [
        f"warning: {path}:5: rule 'r': field 'bench_rate': gt 1000 is outside what it takes "
        "(bench_rate is from 0 to 1000): the rule can never fire",
        f"warning: {path}:5: rule 'r': field 'age_s': lt 0 is outside what it takes (age_s is "
        "at least 0): the rule can never fire",
    ]

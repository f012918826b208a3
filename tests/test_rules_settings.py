"""Thresholds from settings: a rules file defines `settings`, conditions compare with
`{setting: NAME}`, the config's `settings` (and a rule test's) override the file's values.

An unknown setting, a value that does not fit the field it is compared with, a setting defined
twice, are errors at their `file:line`.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from support import book_of, fact

from controller.core.policy import DecideSettings
from controller.rules.engine import Engine
from controller.rules.fire import proposals_from
from controller.rules.rulebook import RulesError, load_texts
from controller.rules.ruletest import run_file
from controller.rules.source import RulesSource, read_rulebook
from controller.service import cli

IDLE = """\
settings:
  idle_wait_s: 600
  spare: 1
normal:
  demand: {}
rules:
  - name: scale-down-idle-instance
    when:
      demand: {task: all, pending: 0}
      instance: {status: running, idle_for_s: {gte: {setting: idle_wait_s}}}
    then: {action: destroy, instance: "{{ instance.id }}"}
    confidence: 0.9
"""


def fires(book: Any, idle_for_s: float) -> bool:
    facts = [fact("demand", pending=0), fact("instance", "i1", idle_for_s=idle_for_s)]
    return any(m.rule for m in Engine(book).match(facts, 0.0))


def problems(files: list[tuple[str, str]], overrides: dict[str, Any] | None = None) -> list[str]:
    with pytest.raises(RulesError) as err:
        load_texts(files, overrides)
    return [str(p) for p in err.value.problems]


def test_a_condition_compares_with_the_files_setting() -> None:
    book = book_of(IDLE)
    assert book.settings == {"idle_wait_s": 600, "spare": 1}
    assert (fires(book, 599.0), fires(book, 600.0)) == (False, True)


def test_an_override_replaces_the_files_value_without_editing_it() -> None:
    book = load_texts([("rules/idle.yaml", IDLE)], {"idle_wait_s": 300})
    assert book.settings["idle_wait_s"] == 300
    assert (fires(book, 299.0), fires(book, 300.0)) == (False, True)


def test_a_setting_defined_in_one_file_serves_every_file() -> None:
    defs = "settings: {idle_wait_s: 120}\n"
    rules = IDLE.split("normal:", 1)[1]
    book = load_texts([("rules/a.yaml", defs), ("rules/b.yaml", "normal:" + rules)])
    assert (fires(book, 119.0), fires(book, 120.0)) == (False, True)


def test_parameters_read_the_files_settings_and_the_config_wins() -> None:
    text = IDLE.replace('then: {action: destroy, instance: "{{ instance.id }}"}',
                        'then: {action: launch, count: "{{ settings.spare }}"}')  # fmt: skip
    for overrides, want in (({}, 1), ({"spare": 4}, 4)):
        book = load_texts([("rules/idle.yaml", text)], overrides)
        facts = [fact("demand", pending=0), fact("instance", "i1", idle_for_s=900.0)]
        matches = Engine(book).match(facts, 0.0)
        by_id = {f["id"]: f for f in facts}
        values = {**DecideSettings().values, **overrides}
        props, doubts = proposals_from(matches, by_id, book, DecideSettings(values=values), 0.0)
        assert not doubts
        assert [p.params["count"] for p in props] == [want]


def test_an_unknown_setting_is_an_error_at_its_line() -> None:
    text = IDLE.replace("setting: idle_wait_s}", "setting: idle_wiat_s}")
    assert problems([("rules/idle.yaml", text)]) == [
        "rules/idle.yaml:10: rule 'scale-down-idle-instance': field 'idle_for_s': unknown "
        "setting 'idle_wiat_s' (defined: idle_wait_s, spare)"
    ]
    bare = text.split("normal:", 1)[1]
    [only] = problems([("rules/idle.yaml", "normal:" + bare)])
    assert only.endswith("unknown setting 'idle_wiat_s' (defined: none: define it under a "
                         "file's top-level 'settings')")  # fmt: skip


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('"ten minutes"', "setting 'idle_wait_s': it is 'ten minutes', but operator 'gte' "
                          "needs a number"),
        ("true", "setting 'idle_wait_s': it is True, but operator 'gte' needs a number"),
    ],
)  # fmt: skip
def test_a_value_that_does_not_fit_its_field_is_an_error_at_the_condition(
    value: str, message: str
) -> None:
    text = IDLE.replace("idle_wait_s: 600", f"idle_wait_s: {value}")
    assert problems([("rules/idle.yaml", text)]) == [
        f"rules/idle.yaml:10: rule 'scale-down-idle-instance': field 'idle_for_s': {message}"
    ]


def test_an_overrides_type_is_checked_and_named() -> None:
    [line] = problems([("rules/idle.yaml", IDLE)], {"idle_wait_s": "600"})
    assert line == ("rules/idle.yaml:10: rule 'scale-down-idle-instance': field 'idle_for_s': "
                    "setting 'idle_wait_s': the config's settings sets it to '600', but operator "
                    "'gte' needs a number")  # fmt: skip


@pytest.mark.parametrize(
    ("cond", "setting", "message"),
    [
        ("status: {eq: {setting: s}}", "froze", "status takes one of provisioning"),
        ("drained: {eq: {setting: s}}", "1", "drained holds bool, not number"),
        ("label: {neq: {setting: s}}", "3", "label holds text, not number"),
        ("label: {gt: {setting: s}}", "3", "operator 'gt' compares numbers and label holds text"),
    ],
)
def test_the_setting_must_fit_the_field_it_is_compared_with(
    cond: str, setting: str, message: str
) -> None:
    text = (f"settings: {{s: {setting}}}\nrules:\n  - name: r\n    when:\n"
            f"      instance: {{{cond}}}\n"
            "    then: {action: hold}\n    confidence: 0.9\n")  # fmt: skip
    [line] = problems([("rules/x.yaml", text)])
    assert line.startswith("rules/x.yaml:5: rule 'r': field ") and message in line, line


def test_a_fitting_setting_on_a_closed_field_compiles() -> None:
    text = (
        "settings: {s: frozen}\nrules:\n  - name: r\n    when:\n      instance: "
        "{status: {eq: {setting: s}}}\n    then: {action: hold}\n    confidence: 0.9\n"
    )
    book = book_of(text)
    assert {"status": "frozen"} in book.definition["rule:r"]["all"][0]["instance"]["$and"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("settings: [a, b]\n", "x.yaml:1: 'settings' must map names to values"),
        ("settings: {Idle: 3}\n", "x.yaml:1: setting name 'Idle' must be lowercase letters"),
        ("settings:\n  a: [1, 2]\n", "x.yaml:2: setting 'a' must be a number, text or a boolean"),
        ("settings:\n  a: .inf\n", "x.yaml:2: setting 'a' must be a finite number"),
    ],
)
def test_a_settings_section_is_read_strictly(text: str, expected: str) -> None:
    [line] = problems([("x.yaml", text)])
    assert line.startswith(expected), line


def test_a_setting_defined_twice_is_an_error_at_the_second() -> None:
    assert problems([("a.yaml", "settings: {w: 1}\n"), ("b.yaml", "\nsettings: {w: 2}\n")]) == [
        "b.yaml:2: setting 'w' is defined twice (first at a.yaml:1)"
    ]


@pytest.mark.parametrize(
    ("cond", "message"),
    [
        ("{setting: idle_wait_s}", "a setting needs an operator, e.g. gte: {setting: ...}"),
        ("{in: {setting: idle_wait_s}}", "operator 'in' cannot take a setting"),
        ("{gte: {setting: 7}}", "a setting is named by lowercase letters, digits and '_', got 7"),
    ],
)
def test_a_setting_is_written_where_a_comparison_takes_a_value(cond: str, message: str) -> None:
    text = IDLE.replace("{gte: {setting: idle_wait_s}}", cond)
    [line] = problems([("rules/idle.yaml", text)])
    assert line == f"rules/idle.yaml:10: rule 'scale-down-idle-instance': field 'idle_for_s': " \
                   f"{message}"  # fmt: skip


def test_normal_patterns_may_not_use_settings() -> None:
    text = "settings: {w: 5}\nnormal:\n  instance:\n    - {age_s: {lt: {setting: w}}}\n"
    assert problems([("x.yaml", text)]) == [
        "x.yaml:4: normal pattern for instance: field 'age_s' may not use settings (they are "
        "for rules' conditions)"
    ]


# -- where overrides come from -----------------------------------------------------------------


def test_the_rules_source_applies_overrides_on_reload_too(tmp_path: Path) -> None:
    path = tmp_path / "idle.yaml"
    path.write_text(IDLE)
    source = RulesSource([path], settings={"idle_wait_s": 60})
    assert source.book.settings["idle_wait_s"] == 60
    path.write_text(IDLE.replace("spare: 1", "spare: 2"))
    reloaded = source.reload()
    assert reloaded is not None and reloaded.ok
    assert source.book.settings == {"idle_wait_s": 60, "spare": 2}
    assert (fires(source.book, 59.0), fires(source.book, 60.0)) == (False, True)


@pytest.mark.usefixtures("restore_logging")
def test_check_applies_the_configs_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "idle.yaml").write_text(IDLE)
    config = tmp_path / "fleetgate.yaml"
    config.write_text(f"rules: [{rules}]\nsettings: {{idle_wait_s: 300}}\n")
    assert cli.main(["--config", str(config), "--state", str(tmp_path / "s"), "check"]) == 0
    assert capsys.readouterr().out.startswith("ok: 1 rules in 1 file(s)")
    config.write_text(f"rules: [{rules}]\nsettings: {{idle_wait_s: five minutes}}\n")
    assert cli.main(["--config", str(config), "--state", str(tmp_path / "s"), "check"]) == 1
    err = capsys.readouterr().err
    assert (f"{rules / 'idle.yaml'}:10: rule 'scale-down-idle-instance': field 'idle_for_s': "
            "setting 'idle_wait_s': the config's settings sets it to 'five minutes', but "
            "operator 'gte' needs a number") in err, err  # fmt: skip


# -- rule tests ----------------------------------------------------------------------------------


def test_rule_tests_override_settings_per_file_and_per_test(tmp_path: Path) -> None:
    (tmp_path / "idle.yaml").write_text(IDLE)
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "idle_test.yaml").write_text(
        textwrap.dedent("""\
        rule_files: [../idle.yaml]
        settings: {idle_wait_s: 300}
        tests:
          - name: the file's override - 300 s idle is enough
            facts: [{kind: demand, pending: 0}, {kind: instance, id: i1, idle_for_s: 300.0}]
            expect: {proposals: [{rule: scale-down-idle-instance, params: {instance: i1}}]}
          - name: the test's own - 300 s idle is not enough at 900
            settings: {idle_wait_s: 900}
            facts: [{kind: demand, pending: 0}, {kind: instance, id: i1, idle_for_s: 300.0}]
            expect: {proposals: []}
          - name: the rules file's own value, with no override, would not fire here
            settings: {idle_wait_s: 600}
            facts: [{kind: demand, pending: 0}, {kind: instance, id: i1, idle_for_s: 300.0}]
            expect: {proposals: [{rule: scale-down-idle-instance}]}
          - name: a test's setting that does not fit is a problem of that test
            settings: {idle_wait_s: soon}
            facts: [{kind: demand, pending: 0}]
            expect: {proposals: []}
    """)
    )
    results = run_file(tests / "idle_test.yaml")
    assert [r.ok for r in results] == [True, True, False, False], [r.problems for r in results]
    assert "expected proposal not made" in results[2].problems[0]
    assert "the settings of the test at" in results[3].problems[0]
    assert "sets it to 'soon', but operator 'gte' needs a number" in results[3].problems[0]


def test_read_rulebook_names_where_overrides_came_from(tmp_path: Path) -> None:
    (tmp_path / "idle.yaml").write_text(IDLE)
    with pytest.raises(RulesError, match="the test file's settings sets it to 'x'"):
        read_rulebook([tmp_path], {"idle_wait_s": "x"}, "the test file's settings")


# -- settings in parameters ----------------------------------------------------------------------

TELL = """\
settings: {floor: 1}
rules:
  - name: tell
    when: {demand: {pending: {gt: 0}}}
    then:
      action: notify
      message: "MESSAGE"
    confidence: 0.9
"""


def test_a_parameter_reading_a_setting_nobody_sets_is_an_error_at_its_line() -> None:
    # it would fail at every tick as a rule error; `check` says so at the parameter's line
    text = TELL.replace("MESSAGE", "{{ settings.flor }} at least")
    assert problems([("rules/tell.yaml", text)]) == [
        "rules/tell.yaml:7: rule 'tell': parameter 'message': unknown setting 'flor' (set: "
        "floor, tasks_per_instance; `settings.flor | default(...)` if it may be absent)"
    ]
    indexed = TELL.replace("MESSAGE", "{{ settings['flor'] }}")
    assert "unknown setting 'flor'" in problems([("rules/tell.yaml", indexed)])[0]


@pytest.mark.parametrize(
    "expr",
    [
        "{{ settings.floor }} and {{ settings.tasks_per_instance }}",  # a file's, the built-in
        "{{ settings.extra | default(3) }}",
        "{{ settings.extra | d(3) }}",
        "{{ settings.extra if settings.extra is defined else 3 }}",
        "{{ settings.get('extra', 3) }}",
    ],
)
def test_a_parameter_may_read_a_setting_that_is_set_or_say_what_stands_in(expr: str) -> None:
    book = load_texts([("rules/tell.yaml", TELL.replace("MESSAGE", f"at least {expr}"))])
    facts = [fact("demand", pending=1)]
    matches = Engine(book).match(facts, 0.0)
    props, doubts = proposals_from(matches, {f["id"]: f for f in facts}, book,
                                   DecideSettings(), 0.0)  # fmt: skip
    assert not doubts and [p.action for p in props] == ["notify"]


def test_a_parameter_may_read_a_setting_only_the_config_sets() -> None:
    text = TELL.replace("MESSAGE", "{{ settings.extra }}")
    assert "unknown setting 'extra'" in problems([("rules/tell.yaml", text)])[0]
    book = load_texts([("rules/tell.yaml", text)], {"extra": 3})
    assert book.rules[0].params["message"].settings == {"extra"}


def test_the_configs_new_settings_reach_the_rules_conditions(tmp_path: Path) -> None:
    # SIGHUP applies `settings` at once: the rules are read again with them, so a condition
    # comparing with a file's setting the config overrides follows the new value
    path = tmp_path / "idle.yaml"
    path.write_text(IDLE)
    source = RulesSource([path], settings={"idle_wait_s": 60})
    before = source.book.digest
    assert source.reload() is None  # nothing changed
    source.use_settings({"idle_wait_s": 900})
    reloaded = source.reload()
    assert reloaded is not None and reloaded.ok and reloaded.digest == before
    assert (fires(source.book, 899.0), fires(source.book, 900.0)) == (False, True)
    source.use_settings({"idle_wait_s": "soon"})  # does not fit: the last good rules stay
    reloaded = source.reload()
    assert reloaded is not None and not reloaded.ok and "'soon'" in reloaded.problems
    assert (fires(source.book, 899.0), fires(source.book, 900.0)) == (False, True)


def test_sighup_reads_the_rules_with_the_configs_new_settings(tmp_path: Path) -> None:
    import time

    from controller.service.assemble import assemble
    from controller.service.config import load_config
    from controller.service.hup import ConfigReload

    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "idle.yaml").write_text(IDLE)
    cfg = tmp_path / "fleetgate.yaml"
    cfg.write_text(f"rules: ['{rules}']\nsettings: {{idle_wait_s: 300}}\n")
    app = assemble(load_config(str(cfg)), state=tmp_path / "s", clock=time.time,
                   sleep=time.sleep, config_path=str(cfg))  # fmt: skip
    try:
        assert app.controller.rules.book.settings["idle_wait_s"] == 300
        cfg.write_text(f"rules: ['{rules}']\nsettings: {{idle_wait_s: 1200}}\n")
        hup = ConfigReload(app, str(cfg))
        hup.request()
        assert hup.apply() is not None
        app.controller.tick()
        book = app.controller.rules.book
        assert book.settings["idle_wait_s"] == 1200
        assert (fires(book, 1199.0), fires(book, 1200.0)) == (False, True)
    finally:
        app.close()

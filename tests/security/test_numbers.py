"""Numbers in the config and in rules files are input: one too long to read, one beyond every
float, an infinity or a NaN is an error at its file:line, never a traceback, a hung tick or a
reload that vanishes."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import app_on_rules_copy

from controller.rules.rulebook import RulesError, load_texts
from controller.rules.source import RulesSource
from controller.service.config import ConfigError, parse_config

ROOT = Path(__file__).resolve().parents[2]
RULE = """rules:
  - name: big
    when: {{instance: {{idle_for_s: {{gte: {}}}}}}}
    then: {{action: hold}}
    confidence: 0.9
"""


@pytest.mark.parametrize(
    "number",
    ["1" + "0" * 5_000,  # Python refuses to read an int of over 4,300 digits
     "1" + "0" * 400,  # beyond every float: the rules compare it with one
     "1" + "0" * 400 + ".5",  # read as a float: inf
     "-0b" + "1" * 60],
)  # fmt: skip
def test_a_number_too_long_is_refused_at_its_line_in_rules_and_config(number: str) -> None:
    with pytest.raises(RulesError) as caught:
        load_texts([("rules/x.yaml", RULE.format(number))])
    assert str(caught.value) == (
        f"rules/x.yaml:3: invalid YAML: a number of {len(number)} characters (at most 40)"
    )
    with pytest.raises(ConfigError) as refused:
        parse_config("fleetgate.yaml", f"sim: {{seed: 1}}\ninterval_s: {number}\n")
    assert str(refused.value) == (
        f"fleetgate.yaml:2: invalid YAML: a number of {len(number)} characters (at most 40)"
    )


def test_a_long_number_that_fits_still_reads() -> None:
    book = load_texts([("rules/x.yaml", RULE.format("1_000_000_000_000_000_000_000_000_000"))])
    assert book.rules[0].when["instance"]["idle_for_s"] == {"gte": 10**27}


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("interval_s: .inf\n", 1, "interval_s: Input should be a finite number"),
        ("guards:\n  max_spend_per_hour: .inf\n", 2,
         "guards.max_spend_per_hour: Input should be a finite number"),
        ("guards:\n  cooldowns_s: {drain: .nan}\n", 2,
         "guards.cooldowns_s.drain: Input should be a finite number"),
        ("escalation:\n  outbox_step_s: .inf\n", 2,
         "escalation.outbox_step_s: Input should be a finite number"),
        ("sim:\n  seconds_per_tick: .inf\n", 2,
         "sim.seconds_per_tick: Input should be a finite number"),
        ("settings:\n  idle_wait_s: .inf\n", 2,
         "settings.idle_wait_s: a setting must be a finite number, got inf"),
        ("settings:\n  idle_wait_s: .nan\n", 2,
         "settings.idle_wait_s: a setting must be a finite number, got nan"),
        ("settings:\n  idle_wait_s: [600]\n", 2,
         "settings.idle_wait_s: a setting must be a number, text or a boolean, got a list"),
    ],
)  # fmt: skip
def test_infinities_and_nans_in_the_config_are_refused_at_their_line(
    text: str, line: int, problem: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("fleetgate.yaml", text)
    assert str(caught.value).splitlines() == [f"fleetgate.yaml:{line}: {problem}"]


def test_a_rules_edit_that_fails_to_read_for_any_reason_is_a_journaled_failed_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error no check foresaw while reading the files is a failed reload: journaled, the
    last good rules in force, the tick carried out, and the file tried again once it changes
    (it was raised out of the tick, after the files' fingerprint had moved on: the broken edit
    was then ignored in silence)."""
    app, rules = app_on_rules_copy(tmp_path)
    try:
        app.controller.tick()
        first = app.controller.rules.book.digest
        real = RulesSource.__init__.__globals__["read_rulebook"]

        def breaks(*args: object, **kwargs: object) -> object:
            raise OverflowError("int too large to convert to float")

        monkeypatch.setitem(RulesSource.__init__.__globals__, "read_rulebook", breaks)
        (rules / "zz.yaml").write_text(RULE.format(600))
        app.controller.tick()
        monkeypatch.setitem(RulesSource.__init__.__globals__, "read_rulebook", real)
        app.controller.tick()  # the files did not change since: nothing to read again
        (rules / "zz.yaml").write_text(RULE.format(900))
        app.controller.tick()
        reloads = [(r["ok"], r["digest"], r["problems"]) for r in app.journal.meta.reloads()]
        assert reloads[0] == (0, first, f"{rules}: the rules could not be read: OverflowError: "
                              "'int too large to convert to float'")  # fmt: skip
        assert [ok for ok, *_ in reloads] == [0, 1]
        assert len(app.journal.meta.ticks(9)) == 4
        assert "big" in {r.name for r in app.controller.rules.book.rules}
    finally:
        app.close()

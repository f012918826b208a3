"""Named settings in rules files, and the conditions that compare a field with one.

A rules file may define settings at its top level; a condition names one where it would
write a number or a value:

    settings: {idle_wait_s: 600}
    rules:
      - name: scale-down-idle-instance
        when: {instance: {idle_for_s: {gte: {setting: idle_wait_s}}}}

The config's `settings` (or a rule test's) override a file's values without editing it. A
setting is defined in one file only; a condition naming one that no file defines is an error
at its line, and so is a value (the file's, or an override's) that does not fit the field it
is compared with (a number for `gt`, one of the values of a closed field, the field's type for
`eq` and `neq`). The values also reach parameter expressions as `settings.NAME`.

Pure: checks and resolves the data it is given.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from controller.core.facts import VALUES
from controller.rules.fieldinfo import info, type_of
from controller.rules.limits import show
from controller.rules.model import Collector, Problem, Rule
from controller.rules.yamlsrc import Located

NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
COMPARE = ("gt", "gte", "lt", "lte", "eq", "neq")  # the operators that may take a setting
_ORDER = ("gt", "gte", "lt", "lte")


@dataclass(frozen=True)
class Setting:
    value: Any
    path: str
    line: int


def is_setting(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"setting"}


def resolve(value: Any, settings: Mapping[str, Any]) -> Any:
    """A condition's value, with `{setting: NAME}` replaced by the setting's value."""
    return settings[str(value["setting"])] if is_setting(value) else value


def parse_settings(col: Collector, raw: Any, line: int) -> dict[str, Setting]:
    """One file's top-level `settings:` mapping, each value a plain number, text or boolean."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        col.add(line, "'settings' must map names to values, e.g. settings: {idle_wait_s: 600}")
        return {}
    out: dict[str, Setting] = {}
    for name, value in raw.items():
        kline = raw.line_of(name) if isinstance(raw, Located) else line
        if not NAME.match(name):
            col.add(kline, f"setting name {show(name)} must be lowercase letters, digits and '_'")
        elif isinstance(value, float) and not math.isfinite(value):
            col.add(kline, f"setting {name!r} must be a finite number, got {value!r}")
        elif not isinstance(value, bool | int | float | str):
            col.add(kline, f"setting {name!r} must be a number, text or a boolean, got "
                           f"{type(value).__name__} {show(value)}")  # fmt: skip
        else:
            out[name] = Setting(value, col.path, kline)
    return out


@dataclass(frozen=True)
class Use:
    rule: Rule
    kind: str
    field: str
    op: str
    name: str
    line: int


def uses(rules: tuple[Rule, ...] | list[Rule]) -> Iterator[Use]:
    """Every condition of every rule that names a setting."""
    for rule in rules:
        for kind, pattern in rule.when.items():
            for fld, cond in (pattern or {}).items():
                if not isinstance(cond, dict):
                    continue
                line = pattern.line_of(fld) if isinstance(pattern, Located) else rule.line
                for op, value in cond.items():
                    if is_setting(value):
                        yield Use(rule, kind, str(fld), op, str(value["setting"]), line)


def fit_problem(kind: str, fld: str, op: str, value: Any) -> str | None:
    """Why `value` cannot stand in `fld: {op: value}`; None when it fits."""
    field = info(kind, fld)
    if op in _ORDER:
        if type_of(value) != "number":
            return f"operator {op!r} needs a number"
        if field is not None and field.type != "number":
            return f"operator {op!r} compares numbers and {fld} holds {field.type}"
        return None
    closed = VALUES.get(kind, {}).get(fld)
    if closed is not None and value not in closed:
        return f"{fld} takes one of {', '.join(closed)}"
    if field is not None and type_of(value) != field.type:
        return f"{fld} holds {field.type}, not {type_of(value)}"
    return None


def effective(defined: Mapping[str, Setting], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Every setting's value: an override's where there is one, else its file's."""
    return {name: overrides.get(name, s.value) for name, s in defined.items()}


def check(rules: list[Rule], defined: Mapping[str, Setting], overrides: Mapping[str, Any],
          origin: str, builtin: Iterable[str] = ()) -> list[Problem]:  # fmt: skip
    """Unknown settings, and values that do not fit where they are used (`origin` says where
    `overrides` come from, for the message). A condition names a setting a file defines; a
    parameter may also read one only the overrides (the config's) or `builtin` give."""
    values = effective(defined, overrides)
    known = ", ".join(sorted(defined)) or "none: define it under a file's top-level 'settings'"
    problems: list[Problem] = []
    for use in uses(rules):
        where = (use.rule.path, use.line)
        if use.name not in defined:
            message = f"field {use.field!r}: unknown setting {use.name!r} (defined: {known})"
            problems.append(Problem(*where, message, use.rule.name))
            continue
        value = values[use.name]
        why = fit_problem(use.kind, use.field, use.op, value)
        if why:
            src = f"{origin} sets it to" if use.name in overrides else "it is"
            message = f"field {use.field!r}: setting {use.name!r}: {src} {show(value)}, but {why}"
            problems.append(Problem(*where, message, use.rule.name))
    readable = set(defined) | set(overrides) | set(builtin)
    shown = ", ".join(sorted(readable)) or "none"
    for rule in rules:  # a parameter reading one nobody sets would fail at every tick
        for key, expr in rule.params.items():
            for name in sorted(expr.settings - readable):
                message = (f"parameter {key!r}: unknown setting {name!r} (set: {shown}; "
                           f"`settings.{name} | default(...)` if it may be absent)")  # fmt: skip
                problems.append(Problem(rule.path, rule.param_lines.get(key, rule.line),
                                        message, rule.name))  # fmt: skip
    return problems

"""The checks on a `when` or `normal` pattern: fact kinds, fields, operators and their values.

A pattern maps a fact kind's fields to a plain value (equality) or to a condition
`{operator: value}`; a value may be a reference `{ref: kind.field}` to a kind named earlier in
the same `when`, or a setting `{setting: name}` (`controller.rules.settings`). Every problem
goes to the file's `Collector` with the line of the field it is about, worded for the
operator: what was wrong and what was expected.

Pure: checks the data it is given.
"""

from __future__ import annotations

import math
from typing import Any

from controller.core.facts import FIELDS, VALUES
from controller.rules.limits import show
from controller.rules.model import Collector
from controller.rules.regex_dialect import matches_problem
from controller.rules.settings import COMPARE, NAME, is_setting
from controller.rules.yamlsrc import Located

OPERATORS = ("gt", "gte", "lt", "lte", "eq", "neq", "in", "matches", "exists")
_NEGATE = {"gt": "lte", "gte": "lt", "lt": "gte", "lte": "gt"}


def check_pattern(
    col: Collector,
    kind: str,
    pattern: Any,
    line: int,
    rule: str | None,
    before: tuple[str, ...],
    kind_line: int | None = None,
) -> None:
    """Report what is wrong with `pattern` for facts of `kind`; `before`: the kinds a
    reference may name (those listed earlier in the same `when`)."""
    if kind not in FIELDS:
        col.add(
            kind_line or line,
            f"unknown fact kind {kind!r} (expected one of {', '.join(FIELDS)})",
            rule,
        )
        return
    if pattern is None:
        return
    if not isinstance(pattern, dict):
        col.add(line, f"pattern for {kind!r} must be a mapping of field: condition", rule)
        return
    for fld, cond in pattern.items():
        fline = pattern.line_of(fld) if isinstance(pattern, Located) else line
        if fld not in FIELDS[kind]:
            known = ", ".join(sorted(FIELDS[kind]))
            col.add(
                fline, f"unknown field {fld!r} for {kind} facts (expected one of {known})", rule
            )
            continue
        _check_condition(col, fld, cond, fline, rule, before)
        values = VALUES.get(kind, {}).get(fld)
        if values is not None:
            _check_closed(col, fld, cond, values, fline, rule)


def _check_closed(col: Collector, fld: str, cond: Any, values: tuple[str, ...], fline: int,
                  rule: str | None) -> None:  # fmt: skip
    """A value a field of a closed set never takes (`status: froze`): the rule could not match."""
    named: list[Any] = []
    if isinstance(cond, str):
        named = [cond]
    elif isinstance(cond, dict):
        for op in ("eq", "neq"):
            if isinstance(cond.get(op), str):
                named.append(cond[op])
        if isinstance(cond.get("in"), list):
            named += [v for v in cond["in"] if isinstance(v, str)]
    for value in named:
        if value not in values:
            col.add(fline, f"field {fld!r}: {show(value)} is not a value it takes "
                           f"(one of {', '.join(values)})", rule)  # fmt: skip


def _check_condition(
    col: Collector, fld: str, cond: Any, fline: int, rule: str | None, before: tuple[str, ...]
) -> None:
    if cond is None:
        col.add(fline, f"field {fld!r} has no value (write a value or a condition)", rule)
        return
    if isinstance(cond, list):
        col.add(fline, f"field {fld!r}: use 'in: [...]' for a list of values", rule)
        return
    if not isinstance(cond, dict):
        problem = _plain(cond)
        if problem:
            col.add(fline, f"field {fld!r} {problem}", rule)
        return
    if not cond:
        col.add(fline, f"field {fld!r}: an empty condition (name an operator)", rule)
        return
    if set(cond) == {"ref"}:
        col.add(fline, f"field {fld!r}: a reference needs an operator, e.g. lt: {{ref: ...}}", rule)
        return
    if set(cond) == {"setting"}:
        col.add(fline, f"field {fld!r}: a setting needs an operator, e.g. gte: {{setting: ...}}",
                rule)  # fmt: skip
        return
    for op, value in cond.items():
        if op not in OPERATORS:
            expected = ", ".join(OPERATORS)
            col.add(fline, f"unknown operator {op!r} (expected one of {expected})", rule)
            continue
        problem = _check_value(op, value, before)
        if problem:
            col.add(fline, f"field {fld!r}: {problem}", rule)


def _check_value(op: str, value: Any, kinds_before: tuple[str, ...]) -> str | None:
    if is_setting(value):
        name = value["setting"]
        if op not in COMPARE:
            return f"operator {op!r} cannot take a setting"
        if not isinstance(name, str) or not NAME.match(name):
            return f"a setting is named by lowercase letters, digits and '_', got {show(name)}"
        return None  # known and fitting: checked across files (`controller.rules.settings`)
    if isinstance(value, dict) and set(value) == {"ref"}:
        ref = str(value["ref"])
        kind, _, fld = ref.partition(".")
        if op not in ("gt", "gte", "lt", "lte", "eq", "neq"):
            return f"operator {op!r} cannot take a reference"
        if kind not in kinds_before:
            return f"reference {ref!r} must name a kind listed earlier in 'when'"
        if fld not in FIELDS.get(kind, ()):
            return f"reference {ref!r}: unknown field {fld!r} for {kind} facts"
        return None
    if op == "in":
        if not isinstance(value, list) or not value:
            return "operator 'in' expects a non-empty list"
        if any(_plain(v) for v in value):
            return "operator 'in' expects a list of plain values (strings, numbers, booleans)"
        return None
    if op == "exists":
        return None if isinstance(value, bool) else "operator 'exists' expects true or false"
    if op == "matches":
        if not isinstance(value, str):
            return "operator 'matches' expects a regular expression string"
        return matches_problem(value)
    problem = _plain(value)
    if problem:
        return f"operator {op!r} {problem}"
    if op in _NEGATE and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return f"operator {op!r} expects a number, got {show(value)}"
    return None


def _plain(value: Any) -> str | None:
    """Facts hold JSON strings, finite numbers and booleans; anything else never matches."""
    if isinstance(value, bool | str | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"expects a finite number, got {value!r}"
    return f"expects a number, string or boolean, got {type(value).__name__} {show(value)}"

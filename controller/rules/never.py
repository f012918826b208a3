"""Conditions that can never match: warnings `fleetgate check` shows, not errors.

A rule whose condition no fact can meet loads and runs, and silently never fires. Per field of
a rule's `when` (settings replaced by their values; references to other facts are not judged):

- a comparison outside the values the field takes (`bench_rate: {gt: 1000}`, `age_s: {lt: 0}`,
  `restarts_1h: {gt: 2, lt: 3}`: counts are whole numbers);
- bounds that contradict each other (`{gt: 10, lt: 5}`), or an `eq` / `in` outside them;
- a value of another type than the field's (`drained: "no"`, `restarts_1h: {eq: "3"}`), or
  `gt`... on a field that is not a number;
- `eq` and `neq` of the same value, and `exists: false` beside a condition that needs the field;
- a `matches` in Python's syntax (`^RTX 30\\d0$`): the engine's `^`, `$` and `\\` are plain
  characters, which no id, label, GPU name or status holds.

Fields and values a kind never has are errors already (`controller.rules.patterns`).

Pure: reads the rules it is given.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from controller.rules.fieldinfo import FieldInfo, info, type_of
from controller.rules.model import Problem, Rule
from controller.rules.settings import resolve
from controller.rules.yamlsrc import Located

_ORDER = ("gt", "gte", "lt", "lte")
FREE_TEXT = frozenset({"status_msg", "detail"})  # what vast or a sensor wrote: any character


def warnings(rules: tuple[Rule, ...] | list[Rule], settings: Mapping[str, Any]) -> list[Problem]:
    """One warning per field condition of `rules` that no fact can meet."""
    out: list[Problem] = []
    for rule in rules:
        for kind, pattern in rule.when.items():
            for fld, cond in (pattern or {}).items():
                field = info(kind, str(fld))
                if field is None:
                    continue
                line = pattern.line_of(fld) if isinstance(pattern, Located) else rule.line
                why = never(str(fld), field, _conditions(cond, settings))
                if why:
                    out.append(Problem(rule.path, line, f"field {fld!r}: {why}: the rule can "
                                                        "never fire", rule.name))  # fmt: skip
    return out


def _conditions(cond: Any, settings: Mapping[str, Any]) -> dict[str, Any]:
    """`{op: value}` with plain values, settings resolved and references left out."""
    if not isinstance(cond, dict):
        return {"eq": cond}
    out = {}
    for op, value in cond.items():
        value = resolve(value, settings)
        if not (isinstance(value, dict) and "ref" in value):
            out[str(op)] = value
    return out


def never(fld: str, field: FieldInfo, cond: Mapping[str, Any]) -> str | None:
    """Why no value of `field` meets all of `cond`; None when some value may."""
    others = [op for op in cond if op != "exists"]
    if cond.get("exists") is False and others:
        return f"exists: false, yet {others[0]} needs the field"
    for why in _types(fld, field, cond):
        return why
    if fld not in FREE_TEXT and isinstance(cond.get("matches"), str):
        syntax = _python_regex(cond["matches"])
        if syntax:
            return syntax
    if field.type != "number":
        eq, neq = cond.get("eq"), cond.get("neq")
        if "eq" in cond and "neq" in cond and eq == neq:
            return f"eq and neq {eq!r} together"
        if "eq" in cond and isinstance(cond.get("in"), list) and eq not in cond["in"]:
            return f"eq {eq!r} is not among in {cond['in']!r}"
        return None
    return _numbers(fld, field, cond)


def _python_regex(pattern: str) -> str | None:
    """A `matches` written in Python's regex syntax: the engine's dialect matches the whole
    string, and `^`, `$` and a backslash are plain characters there, which no id, label, GPU
    name or status holds (`^RTX 4090` matches only text that begins with a caret)."""
    found = re.search(r"\\[dDwWsSbB.]", pattern)
    if pattern.startswith("^"):
        plain = "'^'"
    elif pattern.endswith("$"):
        plain = "'$'"
    elif found:
        plain = f"'{found.group(0)}'"
    else:
        return None
    return (f"matches {pattern[:60]!r}: {plain} is a plain character in the rule engine's "
            "patterns (they match the whole string; %d, %w, %s and %. escape)")  # fmt: skip


def _types(fld: str, field: FieldInfo, cond: Mapping[str, Any]) -> Iterator[str]:
    for op in _ORDER:
        if op in cond and field.type != "number":
            yield f"{op} compares numbers, and {fld} holds {field.type}"
    if "eq" in cond and type_of(cond["eq"]) != field.type:
        yield f"{fld} holds {field.type}, never {type_of(cond['eq'])} {cond['eq']!r}"
    values = cond.get("in")
    if isinstance(values, list) and values and all(type_of(v) != field.type for v in values):
        yield f"{fld} holds {field.type}, and in names none"


@dataclass(frozen=True)
class _Span:
    """The numbers still possible: from lo to hi, each end included or not."""

    lo: float
    lo_in: bool
    hi: float
    hi_in: bool

    def cut(self, op: str, v: float) -> _Span:
        if op in ("gt", "gte") and (v > self.lo or (v == self.lo and op == "gt")):
            return _Span(v, op == "gte", self.hi, self.hi_in)
        if op in ("lt", "lte") and (v < self.hi or (v == self.hi and op == "lt")):
            return _Span(self.lo, self.lo_in, v, op == "lte")
        return self

    def holds(self, v: float, integer: bool) -> bool:
        if integer and v != int(v):
            return False
        above = v > self.lo or (v == self.lo and self.lo_in)
        below = v < self.hi or (v == self.hi and self.hi_in)
        return above and below

    def empty(self, integer: bool) -> bool:
        if integer and self.lo != -math.inf:
            first = math.ceil(self.lo) if self.lo_in else math.floor(self.lo) + 1
            return first > self.hi or (first == self.hi and not self.hi_in)
        if self.lo < self.hi:
            return False
        return not (self.lo == self.hi and self.lo_in and self.hi_in)


def _range(fld: str, field: FieldInfo) -> str:
    whole = "a whole number " if field.integer else ""
    if field.hi == math.inf:
        return f"{fld} is {whole}at least {field.lo:g}"
    return f"{fld} is {whole}from {field.lo:g} to {field.hi:g}"


def _numbers(fld: str, field: FieldInfo, cond: Mapping[str, Any]) -> str | None:
    bounds = [(op, float(cond[op])) for op in _ORDER if type_of(cond.get(op)) == "number"]
    whole = _Span(field.lo, True, field.hi, True)
    span = whole
    for op, v in bounds:
        alone = whole.cut(op, v)
        if alone.empty(field.integer):
            return f"{op} {v:g} is outside what it takes ({_range(fld, field)})"
        span = span.cut(op, v)
    if span.empty(field.integer):
        shown = " and ".join(f"{op} {v:g}" for op, v in bounds)
        return f"{shown} exclude each other" + (" (counts are whole numbers)"
                                               if field.integer else "")  # fmt: skip
    within = _range(fld, field) + "".join(f", {op} {v:g}" for op, v in bounds)
    if "eq" in cond and not span.holds(float(cond["eq"]), field.integer):
        return f"eq {cond['eq']!r} is outside what it may be ({within})"
    if "eq" in cond and "neq" in cond and cond["eq"] == cond["neq"]:
        return f"eq and neq {cond['eq']!r} together"
    values = cond.get("in")
    if isinstance(values, list) and values:
        numbers = [float(v) for v in values if type_of(v) == "number"]
        if numbers and not any(span.holds(v, field.integer) for v in numbers):
            return f"none of in {values!r} is possible ({within})"
    return None

"""One rules file's text read into normal patterns, rules and problems.

`parse` loads the YAML (aliases capped, every mapping knowing its keys' lines), checks the
top-level keys, the file's `settings` (`controller.rules.settings`), each rule's keys, name,
`when` (through `patterns`), `for` (a duration), `confidence`, `priority` and `then` (the
action and its parameters, literals checked against the action's schema now, not at run
time), and each `normal` pattern. It never stops at the first problem: every one
found is returned, each with the line it is about.

Pure: reads the text it is given (the caller reads files).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from controller.core import actions
from controller.rules.durations import parse_duration
from controller.rules.expr import Expr, ExprError, compile_expr
from controller.rules.limits import show
from controller.rules.model import Collector, Problem, Rule
from controller.rules.patterns import check_pattern
from controller.rules.settings import Setting, is_setting, parse_settings
from controller.rules.yamlsrc import Located, LocatedList, YamlError, load

FILE_KEYS = ("normal", "rules", "settings")
RULE_KEYS = ("name", "description", "when", "then", "confidence", "priority", "for")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")

KeyLine = Callable[[str], int]  # the line of a key of the mapping at hand


@dataclass(frozen=True)
class Parsed:
    """One file: its normal patterns, rules, settings and problems."""

    normal: dict[str, list[dict[str, Any]]]
    rules: list[Rule]
    settings: dict[str, Setting]
    problems: list[Problem]


def parse(path: str, text: str) -> Parsed:
    """One file's normal patterns, rules, settings and problems."""
    col = Collector(path)
    try:
        doc = load(text)
    except YamlError as exc:
        col.add(exc.line, exc.message)
        return Parsed({}, [], {}, col.problems)
    if doc is None:
        doc = Located()
    if not isinstance(doc, dict):
        col.add(_line(doc, 1), "a rules file must be a mapping with 'normal' and/or 'rules'")
        return Parsed({}, [], {}, col.problems)
    for key in doc:
        if key not in FILE_KEYS:
            line = doc.line_of(key) if isinstance(doc, Located) else 1
            col.add(line, f"unknown top-level key {key!r} (expected one of {', '.join(FILE_KEYS)})")
    settings = parse_settings(col, doc.get("settings"), doc.line_of("settings")
                              if "settings" in doc and isinstance(doc, Located) else 1)  # fmt: skip
    normal = _parse_normal(col, doc.get("normal"), doc)
    rules: list[Rule] = []
    raw_rules = doc.get("rules", [])
    if raw_rules is None:
        raw_rules = []
    if not isinstance(raw_rules, list):
        col.add(doc.line_of("rules") if isinstance(doc, Located) else 1, "'rules' must be a list")
        raw_rules = []
    lines = raw_rules.item_lines if isinstance(raw_rules, LocatedList) else [1] * len(raw_rules)
    for raw, line in zip(raw_rules, lines, strict=True):
        rule = _parse_rule(col, raw, line)
        if rule:
            rules.append(rule)
    return Parsed(normal, rules, settings, col.problems)


def _line(obj: Any, fallback: int) -> int:
    return int(getattr(obj, "line", 0)) or fallback


def _parse_rule(col: Collector, raw: Any, line: int) -> Rule | None:
    if not isinstance(raw, dict):
        col.add(line, "a rule must be a mapping with name, when, then, confidence")
        return None
    line = _line(raw, line)
    name = raw.get("name")
    rname = name if isinstance(name, str) else None
    start = len(col.problems)

    def at(key: str) -> int:
        return raw.line_of(key) if isinstance(raw, Located) else line

    _check_rule_keys(col, raw, at, line, rname)
    when = _parse_when(col, raw, at, line, rname)
    confidence, priority = _check_numbers(col, raw, at, rname)
    for_s = _parse_for(col, raw, at, rname)
    kinds = tuple(when) if isinstance(when, dict) and when else None
    params = _parse_then(col, raw.get("then"), at("then"), rname, kinds)
    if len(col.problems) > start or params is None or not isinstance(when, dict):
        return None
    description = raw.get("description", "")
    if not isinstance(description, str | None):
        col.add(at("description"), "description must be text", rname)
        return None
    return Rule(
        name=str(name), description=str(description or "").strip(), when=dict(when),
        action=params[0], params=params[1], confidence=float(confidence), priority=int(priority),
        path=col.path, line=line, for_s=for_s, param_lines=params[2],
    )  # fmt: skip


def _parse_for(col: Collector, raw: dict[str, Any], at: KeyLine, rname: str | None) -> float | None:
    """`for:`, the time the condition must hold before the rule fires (None: at once)."""
    if "for" not in raw:
        return None
    try:
        return parse_duration(raw["for"])
    except ValueError as exc:
        col.add(at("for"), f"for: {exc}", rname)
        return None


def _check_rule_keys(
    col: Collector, raw: dict[str, Any], at: KeyLine, line: int, rname: str | None
) -> None:
    """Unknown keys, the name, and the required keys of one rule."""
    name = raw.get("name")
    for key in raw:
        if key not in RULE_KEYS:
            col.add(at(key), f"unknown key {key!r} (expected one of {', '.join(RULE_KEYS)})", rname)
    if isinstance(name, str) and len(name) > 63:
        col.add(at("name"), f"rule name {name[:70]!r} is {len(name)} characters (at most 63)")
    elif not isinstance(name, str) or not _NAME.match(name):
        col.add(
            at("name"),
            "rule needs a 'name' of lowercase letters, digits, '-', '_', '.' "
            f"(at most 63 characters), got {show(name)}",
        )
    for key in ("when", "then", "confidence"):
        if key not in raw:
            col.add(line, f"missing required key {key!r}", rname)


def _parse_when(
    col: Collector, raw: dict[str, Any], at: KeyLine, line: int, rname: str | None
) -> Any:
    """The rule's `when` as written, its patterns checked; None when it is not a mapping."""
    when = raw.get("when")
    if "when" in raw and (not isinstance(when, dict) or not when):
        col.add(at("when"), "'when' must map fact kinds to patterns", rname)
        when = None
    before: tuple[str, ...] = ()
    for kind, pattern in (when or {}).items():
        kline = when.line_of(kind) if isinstance(when, Located) else line
        check_pattern(col, kind, pattern, _line(pattern, kline), rname, before, kline)
        before += (kind,)
    return when


def _check_numbers(
    col: Collector, raw: dict[str, Any], at: KeyLine, rname: str | None
) -> tuple[Any, Any]:
    """The rule's confidence and priority as written, each reported when out of its range."""
    confidence = raw.get("confidence", 0.0)
    if "confidence" in raw and (
        isinstance(confidence, bool) or not isinstance(confidence, (int, float))
        or not 0.0 <= confidence <= 1.0
    ):  # fmt: skip
        col.add(
            at("confidence"),
            f"confidence must be a number from 0 to 1, got {show(confidence)}",
            rname,
        )
    priority = raw.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        col.add(at("priority"), f"priority must be an integer, got {show(priority)}", rname)
    return confidence, priority


def _parse_then(
    col: Collector, then: Any, line: int, rule: str | None, kinds: tuple[str, ...] | None
) -> tuple[str, dict[str, Expr], dict[str, int]] | None:
    """The action, its parameters and their lines. `kinds` is None when `when` is broken (its
    problems are already reported; checking expressions against it would only add noise)."""
    if then is None:
        return None
    if not isinstance(then, dict) or not isinstance(then.get("action"), str):
        col.add(line, "'then' must be a mapping with an 'action'", rule)
        return None
    action = then["action"]
    aline = then.line_of("action") if isinstance(then, Located) else line
    schema = actions.ACTIONS.get(action)
    if schema is None:
        col.add(aline, f"unknown action {action!r} (expected one of {', '.join(actions.ACTIONS)})",
                rule)  # fmt: skip
        return None
    fields = {f.alias or n: f for n, f in schema.model_fields.items()}
    params: dict[str, Expr] = {}
    lines: dict[str, int] = {}
    for key, value in then.items():
        if key == "action":
            continue
        kline = then.line_of(key) if isinstance(then, Located) else line
        problem = _param_problem(action, key, value, fields, kinds)
        if problem:
            col.add(kline, problem, rule)
            continue
        params[key], lines[key] = compile_expr(value), kline
    missing = [k for k, f in fields.items() if f.is_required() and k not in then]
    if missing:
        col.add(aline, f"action {action!r} needs {', '.join(missing)}", rule)
    return action, params, lines


def _param_problem(
    action: str, key: str, value: Any, fields: dict[str, Any], kinds: tuple[str, ...] | None
) -> str | None:
    if key not in fields:
        expected = ", ".join(sorted(fields)) or "no parameters"
        return f"action {action!r} has no parameter {key!r} (expected {expected})"
    try:
        expr = compile_expr(value)
    except ExprError as exc:
        return str(exc)
    if not expr.names and (not isinstance(value, str) or "{{" not in value):
        try:  # a literal: check it against the parameter's type now, not at run time
            field = fields[key]
            kind = field.annotation
            if field.metadata:
                kind = Annotated[field.annotation, *field.metadata]
            TypeAdapter(kind).validate_python(value)
        except ValidationError as exc:
            return f"action {action!r}: {key}: {exc.errors()[0]['msg']} (got {show(value)})"
    if kinds is None:
        return None
    unknown = expr.names - set(kinds) - {"settings", "now"}
    if unknown:
        return (
            f"expression uses {', '.join(sorted(unknown))}, which 'when' does not match "
            f"(available: {', '.join(kinds + ('settings', 'now'))})"
        )
    return None


def _parse_normal(col: Collector, normal: Any, doc: Any) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    if normal is None:
        return out
    if not isinstance(normal, dict):
        col.add(doc.line_of("normal"), "'normal' must map fact kinds to patterns")
        return out
    for kind, patterns in normal.items():
        kline = normal.line_of(kind) if isinstance(normal, Located) else 1
        for pattern in patterns if isinstance(patterns, list) else [patterns]:
            pline = _line(pattern, kline)
            pattern = pattern if pattern is not None else {}
            check_pattern(col, kind, pattern, pline, None, ())
            if isinstance(pattern, dict):
                for fld, cond in pattern.items():
                    refs = isinstance(cond, dict) and any(
                        isinstance(v, dict) and "ref" in v for v in cond.values()
                    )
                    if isinstance(cond, dict) and ("matches" in cond or refs):
                        col.add(
                            pline,
                            f"normal pattern for {kind}: field {fld!r} may not use "
                            "'matches' or references (normal facts are matched by negation)",
                        )
                    elif isinstance(cond, dict) and any(map(is_setting, cond.values())):
                        col.add(pline, f"normal pattern for {kind}: field {fld!r} may not use "
                                       "settings (they are for rules' conditions)")  # fmt: skip
                out.setdefault(kind, []).append(dict(pattern))
    return out

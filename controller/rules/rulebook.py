"""Rules files: load strictly, validate, compile to durable_rules ruleset definitions.

Pure: reads the text it is given (the caller reads files), imports no network, database or
clock module, and never imports durable_rules (that is `controller.rules.engine`'s job). The
compiled definition is plain JSON-able data.

A rules file:

    normal:            # facts that match one of these need no rule
      instance: {status: running, daemon: up}
    rules:
      - name: restart-silently-exited-daemon
        when: {instance: {daemon: down, restarts_1h: {lt: 3}}}
        then: {action: restart_daemon, instance: "{{ instance.id }}"}
        confidence: 0.95
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from controller.core import actions
from controller.core.facts import FIELDS
from controller.rules.compile import definition
from controller.rules.expr import Expr, ExprError, compile_expr
from controller.rules.limits import MAX_PROBLEMS, cap, show
from controller.rules.regex_dialect import matches_problem
from controller.rules.yamlsrc import Located, LocatedList, YamlError, load

OPERATORS = ("gt", "gte", "lt", "lte", "eq", "neq", "in", "matches", "exists")
FILE_KEYS = ("normal", "rules")
RULE_KEYS = ("name", "description", "when", "then", "confidence", "priority")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
_NEGATE = {"gt": "lte", "gte": "lt", "lt": "gte", "lte": "gt"}


@dataclass(frozen=True)
class Problem:
    path: str
    line: int
    message: str
    rule: str | None = None

    def __post_init__(self) -> None:  # a message names what was wrong, never echoes huge input
        object.__setattr__(self, "message", cap(self.message))
        if self.rule is not None:
            object.__setattr__(self, "rule", cap(self.rule, 80))

    def __str__(self) -> str:
        where = f"rule {self.rule!r}: " if self.rule else ""
        return f"{self.path}:{self.line}: {where}{self.message}"


class RulesError(ValueError):
    """One or more rules files are invalid; `problems` says where and why."""

    def __init__(self, problems: list[Problem]) -> None:
        lines = [str(p) for p in problems[:MAX_PROBLEMS]]
        if len(problems) > MAX_PROBLEMS:
            lines.append(f"… and {len(problems) - MAX_PROBLEMS} more problems")
        super().__init__("\n".join(lines))
        self.problems = problems


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    when: dict[str, dict[str, Any]]  # kind -> pattern (as written)
    action: str
    params: dict[str, Expr]
    confidence: float
    priority: int
    path: str
    line: int

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.when)


@dataclass(frozen=True)
class Rulebook:
    rules: tuple[Rule, ...]
    normal: dict[str, tuple[dict[str, Any], ...]]
    paths: tuple[str, ...] = ()
    digest: str = ""
    definition: dict[str, Any] = field(default_factory=dict)  # durable_rules, without `run`

    def rule(self, name: str) -> Rule:
        return next(r for r in self.rules if r.name == name)

    def fields_used(self) -> dict[str, frozenset[str]]:
        """Per fact kind, the fields a rule or a normal pattern names (references included):
        all the rule engine needs to see of a fact, besides its kind and id."""
        used: dict[str, set[str]] = {}
        patterns = [(k, p) for r in self.rules for k, p in r.when.items()]
        patterns += [(k, p) for k, ps in self.normal.items() for p in ps]
        for kind, pat in patterns:
            for fld, cond in (pat or {}).items():
                used.setdefault(kind, set()).add(str(fld))
                for value in cond.values() if isinstance(cond, dict) else ():
                    if isinstance(value, dict) and set(value) == {"ref"}:
                        ref_kind, _, ref_field = str(value["ref"]).partition(".")
                        used.setdefault(ref_kind, set()).add(ref_field)
        return {kind: frozenset(names) for kind, names in used.items()}


class _Collector:
    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[Problem] = []

    def add(self, line: int, message: str, rule: str | None = None) -> None:
        self.problems.append(Problem(self.path, line, message, rule))


def _line(obj: Any, fallback: int) -> int:
    return int(getattr(obj, "line", 0)) or fallback


def _check_value(op: str, value: Any, kinds_before: tuple[str, ...]) -> str | None:
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


def _check_pattern(
    col: _Collector,
    kind: str,
    pattern: Any,
    line: int,
    rule: str | None,
    before: tuple[str, ...],
    kind_line: int | None = None,
) -> None:
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
        if cond is None:
            col.add(fline, f"field {fld!r} has no value (write a value or a condition)", rule)
            continue
        if isinstance(cond, list):
            col.add(fline, f"field {fld!r}: use 'in: [...]' for a list of values", rule)
            continue
        if not isinstance(cond, dict):
            problem = _plain(cond)
            if problem:
                col.add(fline, f"field {fld!r} {problem}", rule)
            continue
        if not cond:
            col.add(fline, f"field {fld!r}: an empty condition (name an operator)", rule)
            continue
        if set(cond) == {"ref"}:
            col.add(
                fline, f"field {fld!r}: a reference needs an operator, e.g. lt: {{ref: ...}}", rule
            )
            continue
        for op, value in cond.items():
            if op not in OPERATORS:
                expected = ", ".join(OPERATORS)
                col.add(fline, f"unknown operator {op!r} (expected one of {expected})", rule)
                continue
            problem = _check_value(op, value, before)
            if problem:
                col.add(fline, f"field {fld!r}: {problem}", rule)


def _parse_rule(col: _Collector, raw: Any, line: int) -> Rule | None:
    if not isinstance(raw, dict):
        col.add(line, "a rule must be a mapping with name, when, then, confidence")
        return None
    line = _line(raw, line)
    name = raw.get("name")
    rname = name if isinstance(name, str) else None
    start = len(col.problems)

    def at(key: str) -> int:
        return raw.line_of(key) if isinstance(raw, Located) else line

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
    when = raw.get("when")
    if "when" in raw and (not isinstance(when, dict) or not when):
        col.add(at("when"), "'when' must map fact kinds to patterns", rname)
        when = None
    before: tuple[str, ...] = ()
    for kind, pattern in (when or {}).items():
        kline = when.line_of(kind) if isinstance(when, Located) else line
        _check_pattern(col, kind, pattern, _line(pattern, kline), rname, before, kline)
        before += (kind,)
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
        path=col.path, line=line,
    )  # fmt: skip


def _parse_then(
    col: _Collector, then: Any, line: int, rule: str | None, kinds: tuple[str, ...] | None
) -> tuple[str, dict[str, Expr]] | None:
    """The action and its parameters. `kinds` is None when `when` is broken (its problems are
    already reported; checking expressions against it would only add noise)."""
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
    for key, value in then.items():
        if key == "action":
            continue
        kline = then.line_of(key) if isinstance(then, Located) else line
        problem = _param_problem(action, key, value, fields, kinds)
        if problem:
            col.add(kline, problem, rule)
            continue
        params[key] = compile_expr(value)
    missing = [k for k, f in fields.items() if f.is_required() and k not in then]
    if missing:
        col.add(aline, f"action {action!r} needs {', '.join(missing)}", rule)
    return action, params


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


def parse(
    path: str, text: str
) -> tuple[dict[str, list[dict[str, Any]]], list[Rule], list[Problem]]:
    """One file's normal patterns, rules and problems."""
    col = _Collector(path)
    try:
        doc = load(text)
    except YamlError as exc:
        col.add(exc.line, exc.message)
        return {}, [], col.problems
    if doc is None:
        doc = Located()
    if not isinstance(doc, dict):
        col.add(_line(doc, 1), "a rules file must be a mapping with 'normal' and/or 'rules'")
        return {}, [], col.problems
    for key in doc:
        if key not in FILE_KEYS:
            line = doc.line_of(key) if isinstance(doc, Located) else 1
            col.add(line, f"unknown top-level key {key!r} (expected one of {', '.join(FILE_KEYS)})")
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
    return normal, rules, col.problems


def _parse_normal(col: _Collector, normal: Any, doc: Any) -> dict[str, list[dict[str, Any]]]:
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
            _check_pattern(col, kind, pattern, pline, None, ())
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
                out.setdefault(kind, []).append(dict(pattern))
    return out


def load_texts(files: Iterable[tuple[str, str]]) -> Rulebook:
    """Build a rulebook from (path, text) pairs; raise RulesError listing every problem."""
    problems: list[Problem] = []
    rules: list[Rule] = []
    normal: dict[str, list[dict[str, Any]]] = {}
    paths: list[str] = []
    digest = hashlib.sha256()
    for path, text in files:
        paths.append(path)
        digest.update(path.encode() + b"\0" + text.encode() + b"\0")
        n, r, p = parse(path, text)
        problems += p
        rules += r
        for kind, pats in n.items():
            normal.setdefault(kind, []).extend(pats)
    seen: dict[str, Rule] = {}
    for rule in rules:
        if rule.name in seen:
            first = seen[rule.name]
            problems.append(
                Problem(
                    rule.path,
                    rule.line,
                    f"duplicate rule name (first defined at {first.path}:{first.line})",
                    rule.name,
                )
            )
        seen[rule.name] = rule
    if problems:
        raise RulesError(problems)
    frozen_normal = {k: tuple(v) for k, v in normal.items()}
    return Rulebook(
        tuple(rules),
        frozen_normal,
        tuple(paths),
        digest.hexdigest()[:12],
        definition(rules, frozen_normal),
    )

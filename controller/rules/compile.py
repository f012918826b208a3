"""Compile validated rules and normal patterns to a durable_rules ruleset definition.

Pure data in, pure data out (JSON-able dicts); durable_rules itself is only touched by
`controller.rules.engine`. Keys of the definition:

- `rule:<name>`      one per rule: a join over the kinds in its `when`, one alias per kind;
- `abnormal:<kind>`  fires for a fact of that kind that matches none of its normal patterns
                     (normal is compiled by negation, so routine facts fire nothing);
- `sink`             a join that never completes: it makes every fact "handled", so asserting
                     a fact no rule wants does not raise;
- `tick`             fires on the marker fact every batch carries: durable_rules 2.0.28
                     segfaults in `delete_state` for a session in which no action ever ran.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from controller.core.matches import ABNORMAL, RULE
from controller.rules.settings import resolve

if TYPE_CHECKING:
    from controller.rules.model import Rule

SINK = "sink"
TICK = "tick"
TICK_KIND = "__tick__"
_OPS = {"gt": "$gt", "gte": "$gte", "lt": "$lt", "lte": "$lte", "neq": "$neq"}
_NEG = {"gt": "$lte", "gte": "$lt", "lt": "$gte", "lte": "$gt", "eq": "$neq", "neq": None}


def _ref(value: Any, settings: Mapping[str, Any]) -> Any:
    """A reference as durable_rules writes one; a setting's value in place of its name."""
    if isinstance(value, dict) and set(value) == {"ref"}:
        kind, _, fld = str(value["ref"]).partition(".")
        return {kind: fld}
    return resolve(value, settings)


def _field(fld: str, cond: Any, settings: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Conditions on one field; a plain value means equality."""
    if not isinstance(cond, dict):
        return [{fld: cond}]
    out: list[dict[str, Any]] = []
    for op, value in cond.items():
        value = _ref(value, settings)
        if op == "eq":
            out.append({fld: value} if not isinstance(value, dict) else {"$eq": {fld: value}})
        elif op in _OPS:
            out.append({_OPS[op]: {fld: value}})
        elif op == "in":
            out.append({"$or": [{fld: v} for v in value]})
        elif op == "matches":
            out.append({"$mt": {fld: value}})
        elif op == "exists":
            out.append({"$ex" if value else "$nex": {fld: 1}})
    return out


def pattern(
    kind: str, pat: Mapping[str, Any] | None, settings: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    conds: list[dict[str, Any]] = [{"kind": kind}]
    for fld, cond in (pat or {}).items():
        conds += _field(fld, cond, settings or {})
    return {"$and": conds}


def _negate_field(fld: str, cond: Any) -> list[dict[str, Any]]:
    """Ways one field can fail its normal condition (a missing field fails it too)."""
    missing = {"$nex": {fld: 1}}
    if not isinstance(cond, dict):
        return [{"$neq": {fld: cond}}, missing]
    out: list[dict[str, Any]] = []
    for op, value in cond.items():
        if op == "exists":
            out.append({"$nex" if value else "$ex": {fld: 1}})
            continue
        if op == "in":
            out.append({"$and": [{"$neq": {fld: v}} for v in value]})
        elif op == "neq":
            out.append({fld: value})
        else:
            out.append({_NEG[op]: {fld: value}})  # type: ignore[dict-item]
        out.append(missing)
    return out


def abnormal(kind: str, patterns: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """A condition true for a fact of `kind` that matches none of `patterns`; None if never."""
    conds: list[dict[str, Any]] = [{"kind": kind}]
    for pat in patterns:
        if not pat:
            return None  # an empty normal pattern: every fact of this kind is normal
        alternatives: list[dict[str, Any]] = []
        for fld, cond in pat.items():
            alternatives += _negate_field(fld, cond)
        conds.append({"$or": alternatives})
    return {"$and": conds}


def definition(
    rules: Sequence[Rule],
    normal: Mapping[str, Sequence[Mapping[str, Any]]],
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole ruleset, keyed as the module docstring says; a condition naming a setting
    compares with its value in `settings` (checked to exist and fit by then)."""
    from controller.core.facts import FIELDS

    out: dict[str, Any] = {
        SINK: {"all": [{"a": {"$ex": {"kind": 1}}}, {"b": {"kind": "__never__"}}]},
        TICK: {"all": [{"m": {"kind": TICK_KIND}}]},
    }
    for kind in FIELDS:
        cond = abnormal(kind, normal.get(kind, ()))
        if cond is not None:
            out[ABNORMAL + kind] = {"all": [{"m": cond}]}
    for rule in rules:
        out[RULE + rule.name] = {
            "all": [{kind: pattern(kind, pat, settings)} for kind, pat in rule.when.items()]
        }
    return out

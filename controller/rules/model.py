"""The rulebook's data: a `Rule`, the `Rulebook` of all files, and the `Problem`s found in them.

Plain frozen dataclasses that `parse` builds and the compiler, the engine and the rule tests
read. `Collector` gathers one file's problems while it is parsed; `RulesError` carries them all
to the operator, one `path:line: rule 'name': message` line each.

Pure data: no parsing here (`controller.rules.parse`), no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller.rules.expr import Expr
from controller.rules.limits import MAX_PROBLEMS, cap


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
        at = f"{self.path}:{self.line}" if self.line else self.path  # 0: the file (or folder)
        return f"{at}: {where}{self.message}"


class RulesError(ValueError):
    """One or more rules files are invalid; `problems` says where and why."""

    def __init__(self, problems: list[Problem]) -> None:
        lines = [str(p) for p in problems[:MAX_PROBLEMS]]
        if len(problems) > MAX_PROBLEMS:
            lines.append(f"… and {len(problems) - MAX_PROBLEMS} more problems")
        super().__init__("\n".join(lines))
        self.problems = problems


class Collector:
    """The problems of one file, in the order they were found."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[Problem] = []

    def add(self, line: int, message: str, rule: str | None = None) -> None:
        self.problems.append(Problem(self.path, line, message, rule))


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
    for_s: float | None = None  # `for:`: the condition must have held this long to fire
    param_lines: dict[str, int] = field(default_factory=dict)  # each parameter's line

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
    settings: dict[str, Any] = field(default_factory=dict)  # the files' settings, overridden
    warnings: tuple[Problem, ...] = ()  # conditions that can never match (`check` shows them)

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

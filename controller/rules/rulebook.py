"""Rules files: load strictly, validate, compile to durable_rules ruleset definitions.

Pure: reads the text it is given (the caller reads files), imports no network, database or
clock module, and never imports durable_rules (that is `controller.rules.engine`'s job). The
compiled definition is plain JSON-able data.

`load_texts` builds the `Rulebook` of all files: each file is read by `parse`
(`controller.rules.parse`, its patterns checked by `controller.rules.patterns`), rule and
setting names are checked across files here, and so are the conditions that name a setting
(`controller.rules.settings`, with the config's or a test's overrides); the conditions that can
never match become the book's warnings (`controller.rules.never`), and the whole is compiled
(`controller.rules.compile`). The data
types (`Rule`, `Rulebook`, `Problem`, `RulesError`) live in `controller.rules.model`; they are
importable from here too, where the rest of the controller has always found them.

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
from collections.abc import Iterable, Mapping
from typing import Any

from controller.core.policy import BUILTIN_VALUES
from controller.rules import never
from controller.rules import settings as settings_
from controller.rules.compile import definition
from controller.rules.model import Problem, Rule, Rulebook, RulesError
from controller.rules.parse import parse
from controller.rules.settings import Setting

__all__ = ["Problem", "Rule", "Rulebook", "RulesError", "load_texts"]


def load_texts(
    files: Iterable[tuple[str, str]],
    overrides: Mapping[str, Any] | None = None,
    origin: str = "the config's settings",
) -> Rulebook:
    """Build a rulebook from (path, text) pairs; raise RulesError listing every problem.
    `overrides` replace the files' settings of the same name (`origin` names them in errors)."""
    problems: list[Problem] = []
    rules: list[Rule] = []
    normal: dict[str, list[dict[str, Any]]] = {}
    defined: dict[str, Setting] = {}
    paths: list[str] = []
    digest = hashlib.sha256()
    for path, text in files:
        paths.append(path)
        digest.update(path.encode() + b"\0" + text.encode() + b"\0")
        parsed = parse(path, text)
        problems += parsed.problems
        rules += parsed.rules
        for kind, pats in parsed.normal.items():
            normal.setdefault(kind, []).extend(pats)
        for name, setting in parsed.settings.items():
            if name in defined:
                was = defined[name]
                problems.append(Problem(path, setting.line, f"setting {name!r} is defined "
                                        f"twice (first at {was.path}:{was.line})"))  # fmt: skip
            else:
                defined[name] = setting
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
    problems += settings_.check(rules, defined, overrides or {}, origin, BUILTIN_VALUES)
    if problems:
        raise RulesError(problems)
    frozen_normal = {k: tuple(v) for k, v in normal.items()}
    values = settings_.effective(defined, overrides or {})
    return Rulebook(
        tuple(rules),
        frozen_normal,
        tuple(paths),
        digest.hexdigest()[:12],
        definition(rules, frozen_normal, values),
        values,
        tuple(never.warnings(rules, values)),
    )

"""Rules files: load strictly, validate, compile to durable_rules ruleset definitions.

Pure: reads the text it is given (the caller reads files), imports no network, database or
clock module, and never imports durable_rules (that is `controller.rules.engine`'s job). The
compiled definition is plain JSON-able data.

`load_texts` builds the `Rulebook` of all files: each file is read by `parse`
(`controller.rules.parse`, its patterns checked by `controller.rules.patterns`), rule names are
checked across files here, and the whole is compiled (`controller.rules.compile`). The data
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
from collections.abc import Iterable
from typing import Any

from controller.rules.compile import definition
from controller.rules.model import Problem, Rule, Rulebook, RulesError
from controller.rules.parse import parse

__all__ = ["Problem", "Rule", "Rulebook", "RulesError", "load_texts"]


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

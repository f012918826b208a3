"""Step 1 of deciding: each rule firing → a proposal, its parameters from the rule's
bounded expressions, validated against the action's schema. A rule whose parameters do not
evaluate is a `rule_error` doubt naming its file and line. Pure, like `controller.core.decide`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controller.core import actions
from controller.core.decide import Doubt, subject_of
from controller.core.matches import Match
from controller.core.model import Proposal
from controller.core.policy import DecideSettings
from controller.rules.expr import ExprError
from controller.rules.rulebook import Rulebook


def proposals_from(
    matches: Sequence[Match], facts: dict[str, dict[str, Any]], book: Rulebook,
    settings: DecideSettings, now: float,
) -> tuple[list[Proposal], list[Doubt]]:  # fmt: skip
    """Step 1: one proposal per rule firing."""
    out: list[Proposal] = []
    doubts: list[Doubt] = []
    values = {**settings.values, **book.settings}  # the rules files' (the config's over them)
    for m in matches:
        if m.rule is None:
            continue
        rule = book.rule(m.rule)
        bound = {alias: facts[fid] for alias, fid in m.facts.items() if fid in facts}
        context = dict(bound, settings=values, now=now)
        try:
            raw = {k: e.evaluate(context) for k, e in rule.params.items()}
            params = actions.validate(rule.action, raw)
        except (ExprError, actions.ActionError) as exc:
            subject = next((subject_of(f) for f in bound.values()), "fleet")
            doubts.append(
                Doubt(
                    "rule_error",
                    subject,
                    f"rule {rule.name!r} ({rule.path}:"
                    f"{rule.line}) could not build its action: {exc}",
                    tuple(bound.values()),
                    {"rule": rule.name},
                )
            )
            continue
        reason = rule.description or f"rule {rule.name}"
        out.append(
            Proposal(
                rule.action,
                params,
                f"rule:{rule.name}",
                reason,
                rule.confidence,
                rule.priority,
                tuple(m.facts.values()),
            )
        )
    return out, doubts

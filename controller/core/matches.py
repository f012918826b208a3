"""What the rule engine returns, as plain data (importable by the pure core)."""

from __future__ import annotations

from dataclasses import dataclass

RULE = "rule:"  # a rule's engine key: RULE + name
ABNORMAL = "abnormal:"  # a fact kind's outside-`normal` detector: ABNORMAL + kind


@dataclass(frozen=True)
class Match:
    """One firing: a rule (or an abnormal-kind detector) and the ids of the facts it joined."""

    key: str  # "rule:<name>" or "abnormal:<kind>"
    facts: dict[str, str]  # alias (fact kind) -> fact id

    @property
    def rule(self) -> str | None:
        return self.key[len(RULE) :] if self.key.startswith(RULE) else None

    @property
    def abnormal_kind(self) -> str | None:
        return self.key[len(ABNORMAL) :] if self.key.startswith(ABNORMAL) else None

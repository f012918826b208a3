"""The LLM budget's memory, in the journal: calls per hour and tokens per day survive restarts
and are shared by `fleetgate tick` runs."""

from __future__ import annotations

from controller.store.journal import Journal


class JournalUsage:
    """`escalation.llm.UsageStore` over the journal's `llm_usage` table."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def record(self, at: float, tokens: int) -> None:
        self.journal.llm.add_llm_usage(at, tokens)

    def calls_since(self, t: float) -> int:
        return self.journal.llm.llm_usage_since(t)[0]

    def tokens_since(self, t: float) -> int:
        return self.journal.llm.llm_usage_since(t)[1]

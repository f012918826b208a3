"""The LLM's part in escalations, and the budget it spends.

Tables: `llm_calls` (each call: model, prompt digest, answer or error, tokens, latency, where
its proposal was routed), `llm_usage` (each call that reached the endpoint: when, how many
tokens; what the budget counts).
"""

from __future__ import annotations

from typing import Any

from controller.store.aggregate import Aggregate, dumps, loads
from controller.store.backend import Row


class LlmUsage(Aggregate):
    """What was asked of the LLM, what it answered, and what that cost."""

    SCHEMA = """
CREATE TABLE IF NOT EXISTS llm_calls (
  id INTEGER PRIMARY KEY, escalation_id INTEGER, at REAL NOT NULL, model TEXT NOT NULL,
  prompt_digest TEXT, status TEXT NOT NULL, action TEXT, params TEXT, confidence REAL,
  rationale TEXT, error TEXT, tokens INTEGER NOT NULL DEFAULT 0, latency_ms REAL,
  routed TEXT
);
CREATE INDEX IF NOT EXISTS llm_calls_at ON llm_calls(at);
CREATE TABLE IF NOT EXISTS llm_usage (id INTEGER PRIMARY KEY, at REAL NOT NULL, tokens INTEGER);
CREATE INDEX IF NOT EXISTS llm_usage_at ON llm_usage(at);
"""

    def add_llm_call(
        self,
        *,
        escalation_id: int | None,
        now: float,
        model: str,
        status: str,
        prompt_digest: str = "",
        action: str | None = None,
        params: dict[str, Any] | None = None,
        confidence: float | None = None,
        rationale: str = "",
        error: str = "",
        tokens: int = 0,
        latency_ms: float | None = None,
        routed: str = "",
    ) -> int:
        with self.tx() as db:
            return db.insert(
                "INSERT INTO llm_calls(escalation_id, at, model, prompt_digest, status, action, "
                "params, confidence, rationale, error, tokens, latency_ms, routed) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (escalation_id, now, model, prompt_digest, status, action,
                 dumps(params) if params is not None else None, confidence, rationale, error,
                 tokens, latency_ms, routed))  # fmt: skip

    def llm_calls(self, escalation_id: int | None = None) -> list[Row]:
        """Every call (for one escalation, if given), oldest first, params decoded."""
        where, args = ("WHERE escalation_id = ?", [escalation_id]) if escalation_id else ("", [])
        rows = self._all(f"SELECT * FROM llm_calls {where} ORDER BY id", args)
        for r in rows:
            r["params"] = loads(r["params"])
        return rows

    def add_llm_usage(self, at: float, tokens: int) -> None:
        with self.tx() as db:
            db.execute("INSERT INTO llm_usage(at, tokens) VALUES (?, ?)", (at, tokens))

    def llm_usage_since(self, since: float) -> tuple[int, int]:
        """(calls, tokens) since `since`: every call that reached the endpoint counts."""
        row = self._one(
            "SELECT COUNT(*) AS calls, COALESCE(SUM(tokens), 0) AS tokens "
            "FROM llm_usage WHERE at >= ?",
            (since,),
        )
        return (int(row["calls"]), int(row["tokens"])) if row else (0, 0)

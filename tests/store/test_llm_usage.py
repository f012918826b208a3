"""The contract of `journal.llm`: calls kept per escalation, the budget's usage by time."""

from __future__ import annotations

from support import peer

from controller.store.journal import Journal


def test_calls_are_kept_per_escalation_with_their_params_decoded(j: Journal) -> None:
    call = j.llm.add_llm_call(escalation_id=7, now=3.0, model="m", status="ok", action="hold",
                              params={"why": "x"}, confidence=0.5, tokens=120,
                              latency_ms=812.5, routed="approval")  # fmt: skip
    failed = j.llm.add_llm_call(escalation_id=None, now=4.0, model="m", status="error",
                                error="timeout")  # fmt: skip
    [row] = j.llm.llm_calls(7)
    assert row["id"] == call and row["params"] == {"why": "x"} and row["tokens"] == 120
    assert (row["latency_ms"], row["routed"], row["confidence"]) == (812.5, "approval", 0.5)
    assert [c["id"] for c in j.llm.llm_calls()] == [call, failed]
    assert j.llm.llm_calls()[1]["params"] is None and j.llm.llm_calls()[1]["error"] == "timeout"


def test_usage_is_counted_since_a_time_by_every_process(j: Journal) -> None:
    assert j.llm.llm_usage_since(0.0) == (0, 0)
    j.llm.add_llm_usage(3.0, 120)
    j.llm.add_llm_usage(4.0, 80)
    other = peer(j)
    assert other.llm.llm_usage_since(0.0) == (2, 200)
    assert other.llm.llm_usage_since(3.5) == (1, 80) and other.llm.llm_usage_since(10.0) == (0, 0)
    other.close()

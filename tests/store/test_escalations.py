"""The contract of `journal.escalations`: escalations answered once, their statuses, their
deliveries."""

from __future__ import annotations

from typing import Any

from controller.store.journal import Journal


def _raise(j: Journal, fingerprint: str = "f", now: float = 1.0, **kw: Any) -> int:
    fields: dict[str, Any] = dict(fingerprint=fingerprint, kind="unmatched",
                                  subject="instance:1", summary="s", now=now, deadline=now + 99,
                                  situation={"proposals": []},
                                  default_action={"action": "hold", "params": {}})  # fmt: skip
    fields.update(kw)
    return j.escalations.add_escalation(**fields)


def test_an_escalation_is_answered_once(j: Journal) -> None:
    eid = _raise(j)
    assert j.escalations.answer(eid, status="approved", by="ana", now=2.0,
                                answer={"action": "hold"})  # fmt: skip
    assert not j.escalations.answer(eid, status="denied", by="bob", now=3.0, answer=None)
    esc = j.escalations.escalation(eid)
    assert esc and esc["status"] == "approved" and esc["answered_by"] == "ana"
    assert esc["answer"] == {"action": "hold"} and esc["answered_at"] == 2.0
    assert j.escalations.escalation(eid + 1) is None


def test_the_last_escalation_of_a_fingerprint(j: Journal) -> None:
    assert j.escalations.last_escalation("f") is None
    first = _raise(j, "f", 1.0)
    _raise(j, "g", 2.0)
    again = _raise(j, "f", 3.0)
    last = j.escalations.last_escalation("f")
    assert last is not None and last["id"] == again != first and last["created_at"] == 3.0


def test_escalations_of_several_statuses_in_one_read_as_each_one_alone(j: Journal) -> None:
    ids = [_raise(j, f"f{n}", float(n)) for n in range(7)]
    for eid in ids[1::3]:
        j.escalations.answer(eid, status="approved", by="ana", now=9.0, answer={"action": "x"})
    j.escalations.answer(ids[2], status="denied", by="ana", now=9.0, answer=None)
    for limit in (200, 2):
        got = j.escalations.by_status(("approved", "pending"), limit=limit)
        assert set(got) == {"approved", "pending"}
        for status in ("approved", "pending"):
            assert got[status] == j.escalations.recent(status=status, limit=limit)
    assert [e["id"] for e in got["approved"]] == ids[1::3]
    assert [e["id"] for e in got["pending"]] == [ids[5], ids[6]]
    assert j.escalations.by_status(("expired",)) == {"expired": []}


def test_recent_escalations_by_status_decoded(j: Journal) -> None:
    a = _raise(j, situation={"a": [1]}, default_action={"action": "hold"})
    b = _raise(j, "g", 2.0)
    assert [e["id"] for e in j.escalations.recent()] == [a, b]
    assert [e["id"] for e in j.escalations.recent(limit=1)] == [b]
    j.escalations.set_escalation_status(a, "executed", 42)
    esc = j.escalations.escalation(a)
    assert esc and esc["status"] == "executed" and esc["executed_action_id"] == 42
    assert esc["situation"] == {"a": [1]} and esc["default_action"] == {"action": "hold"}
    assert esc["answer"] is None
    assert [e["id"] for e in j.escalations.recent("pending")] == [b]
    [done] = j.escalations.recent("executed")
    assert done["situation"] == {"a": [1]}
    assert not j.escalations.answer(a, status="approved", by="ana", now=5.0, answer=None)


def test_deliveries_are_kept_per_escalation_in_order(j: Journal) -> None:
    eid, other = _raise(j), _raise(j, "g")
    j.escalations.add_delivery(eid, "slack", 2.0, True, "200")
    j.escalations.add_delivery(other, "ntfy", 2.0, True, "200")
    j.escalations.add_delivery(eid, "email", 3.0, False, "refused")
    rows = j.escalations.deliveries(eid)
    assert [(d["channel"], d["ok"], d["at"], d["detail"]) for d in rows] == [
        ("slack", 1, 2.0, "200"), ("email", 0, 3.0, "refused")]  # fmt: skip
    assert j.escalations.deliveries(other + 1) == []

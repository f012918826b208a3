"""situation.py: fingerprint, dedup window, sanitizing, storage round trip, purity."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from escalation import situation as situation_module
from escalation.situation import (
    Situation,
    fingerprint,
    from_dict,
    sanitize,
    sanitize_fact,
    should_escalate,
    to_dict,
)


def make(**changes: Any) -> Situation:
    s = Situation(
        kind="unmatched",
        subject="instance:10007",
        summary="Instance 10007 is frozen and no rule covers it.",
        facts=(
            {"id": "10007", "status": "frozen", "down_for_s": 120.0},
            {"id": "10007", "kind": "health", "daemon": "down"},
        ),
        key={"status": "frozen", "stage": "running"},
        proposals=(
            {
                "action": "reboot",
                "params": {"instance": "10007"},
                "proposer": "rule:a",
                "confidence": 0.4,
                "reason": "frozen",
            },
            {
                "action": "destroy",
                "params": {"instance": "10007"},
                "proposer": "rule:b",
                "confidence": 0.3,
                "reason": "frozen twice",
            },
        ),
        recent_actions=(
            {"at": 1000.0, "action": "reboot", "params": {}, "status": "ok", "proposer": "rule:a"},
        ),
        fleet={"running": 10, "spend_per_h": 4.5},
        budget={"spend_left_per_h": 5.5, "launches_left_1h": 3},
        allowed_actions=("hold", "reboot", "destroy"),
        default_action={"action": "hold", "params": {"reason": "nobody answered"}},
        created_at=1_700_000_000.0,
    )
    return dataclasses.replace(s, **changes)


# --- fingerprint ---------------------------------------------------------------------------


def test_fingerprint_is_the_documented_digest() -> None:
    canonical = '["unmatched","instance:10007",{"stage":"running","status":"frozen"}]'
    expected = hashlib.sha256(canonical.encode()).hexdigest()[:16]
    assert fingerprint(make()) == expected
    assert len(expected) == 16


def test_fingerprint_ignores_time_facts_proposals_and_their_order() -> None:
    s = make()
    later = make(
        created_at=s.created_at + 3600,
        summary="worded differently",
        facts=tuple(reversed([{**f, "down_for_s": 999.0} for f in s.facts])),
        proposals=tuple(reversed(s.proposals)),
        recent_actions=(),
        fleet={"running": 3},
        budget={},
        key={"stage": "running", "status": "frozen"},  # same key, other insertion order
    )
    assert fingerprint(later) == fingerprint(s)


@pytest.mark.parametrize(
    "changes",
    [
        {"key": {"status": "exited", "stage": "running"}},
        {"key": {"status": "frozen"}},
        {"subject": "instance:10008"},
        {"kind": "low_confidence"},
    ],
)
def test_fingerprint_differs_when_kind_subject_or_key_differ(changes: dict[str, Any]) -> None:
    assert fingerprint(make(**changes)) != fingerprint(make())


def test_fingerprint_rejects_a_key_that_is_not_json() -> None:
    with pytest.raises(TypeError):
        fingerprint(make(key={"when": object()}))


# --- dedup window --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("last", "now", "expected"),
    [
        (None, 1000.0, True),  # never raised
        (1000.0, 1000.0, False),  # just raised
        (1000.0, 1599.9, False),  # inside the window
        (1000.0, 1600.0, True),  # the window has passed
        (1000.0, 5000.0, True),
        (1000.0, 900.0, False),  # clock went backwards: stay quiet
    ],
)
def test_should_escalate_once_per_window(last: float | None, now: float, expected: bool) -> None:
    assert should_escalate(last, now, window_s=600.0) is expected


# --- sanitize ------------------------------------------------------------------------------


def test_sanitize_leaves_short_plain_text_alone() -> None:
    assert sanitize("fg-a1b2 running ok") == "fg-a1b2 running ok"
    assert sanitize("x" * 200) == "x" * 200


def test_sanitize_caps_long_text_and_says_how_much_was_cut() -> None:
    out = sanitize("a" * 250, cap=200)
    assert out == "a" * 200 + "…[truncated 50 chars]"


def test_sanitize_escapes_control_characters_visibly() -> None:
    assert sanitize("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"
    assert sanitize("line1\nline2\r\tend") == "line1\\nline2\\r\\tend"
    assert sanitize("nul\x00 del\x7f c1\x9b") == "nul\\x00 del\\x7f c1\\x9b"
    assert sanitize("evil\u202etxt.exe") == "evil\\u202etxt.exe"  # bidi override
    assert sanitize("zero\u200bwidth") == "zero\\u200bwidth"
    assert sanitize("café ✓") == "café ✓"  # printable non-ASCII is kept


def test_sanitize_never_cuts_inside_an_escape() -> None:
    out = sanitize("abcd\x1bxyz", cap=6)  # "abcd" fits, "\x1b" (4 chars) would not
    assert out == "abcd…[truncated 4 chars]"


def test_sanitize_is_recursive_and_leaves_non_strings_alone() -> None:
    value = {
        "label": "\x07bell",
        "tags": ["ok", "x" * 10],
        "pair": ("\n", 3),
        "n": 5,
        "f": 1.5,
        "none": None,
        "yes": True,
        "nested": {"msg": "\x1b"},
        "key\x1b": 1,
    }
    assert sanitize(value, cap=5) == {
        "label": "\\x07b…[truncated 3 chars]",
        "tags": ["ok", "xxxxx…[truncated 5 chars]"],
        "pair": ("\\n", 3),
        "n": 5,
        "f": 1.5,
        "none": None,
        "yes": True,
        "nested": {"msg": "\\x1b"},  # keys are escaped, never cut
        "key\\x1b": 1,
    }


def test_sanitize_fact_keeps_field_names_and_sanitizes_values() -> None:
    fact: dict[str, Any] = {
        "status_msg": "oom\x1b" + "!" * 300,
        "num_gpus": 2,
        "labels": {"a": "\n"},
    }
    out = sanitize_fact(fact)
    assert list(out) == ["status_msg", "num_gpus", "labels"]
    assert out["status_msg"].startswith("oom\\x1b!!!")
    assert out["status_msg"].endswith("…[truncated 107 chars]")
    assert out["num_gpus"] == 2
    assert out["labels"] == {"a": "\\n"}
    assert fact["status_msg"].startswith("oom\x1b")  # the input is not changed


def test_sanitize_rejects_a_negative_cap() -> None:
    with pytest.raises(ValueError, match="cap"):
        sanitize("x", cap=-1)


# --- storage round trip --------------------------------------------------------------------


def test_to_dict_from_dict_round_trip_is_exact_through_json() -> None:
    s = make()
    stored = json.dumps(to_dict(s))
    back = from_dict(json.loads(stored))
    assert back == s
    assert isinstance(back.facts, tuple)
    assert isinstance(back.allowed_actions, tuple)
    assert to_dict(back) == to_dict(s)


def test_situation_stores_lists_as_tuples() -> None:
    s = make(facts=[{"id": "1"}], allowed_actions=["hold"])
    assert s.facts == ({"id": "1"},)
    assert s.allowed_actions == ("hold",)


def test_from_dict_rejects_unknown_and_missing_keys() -> None:
    record = to_dict(make())
    record["colour"] = "red"
    del record["budget"]
    with pytest.raises(ValueError, match=r"unknown keys \['colour'\], missing keys \['budget'\]"):
        from_dict(record)


def test_an_unknown_kind_is_an_error() -> None:
    record = to_dict(make())
    record["kind"] = "panic"
    with pytest.raises(ValueError, match="'panic' is not one of unmatched"):
        from_dict(record)


# --- purity --------------------------------------------------------------------------------

FORBIDDEN = {
    "requests",
    "sqlite3",
    "psycopg",
    "time",
    "socket",
    "datetime",
    "os",
    "subprocess",
    "urllib",
    "http",
    "logging",
}


def test_situation_module_imports_no_io_and_no_clock() -> None:
    source = Path(situation_module.__file__).read_text(encoding="utf-8")
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported, "the import scan found nothing: the test is broken"
    assert not imported & FORBIDDEN

"""What is escalated: a situation, its fingerprint, the dedup window, untrusted-text hygiene.

Pure: no I/O, no clock, no network, no database. This module must NOT import requests, sqlite3,
psycopg, time or socket (tests/escalation/test_situation.py checks), and must NOT decide what to
do about a situation. `now` is always a float of epoch seconds handed in by the caller.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

SituationKind = Literal[
    "unmatched",  # a fact outside the declared steady state that no rule claims
    "low_confidence",  # a proposal below the confidence threshold
    "conflict",  # two rules want contradictory things for the same target
    "guard_veto",  # a guard vetoed an action and a person has to look
    "sensing_failure",  # sensing failed in a way that blocks decisions
    "approval",  # the operator's autonomy says "propose" for this action
    "rule_error",  # a rule matched but its parameters did not evaluate to a valid action
    "requested",  # a rule (or the LLM) chose the `escalate` action
]
SITUATION_KINDS: tuple[str, ...] = get_args(SituationKind)

# Fields that hold tuples of dicts; JSON turns them into lists, from_dict turns them back.
_TUPLE_FIELDS = ("facts", "proposals", "recent_actions", "allowed_actions")

# Characters never shown raw: controls (C0, C1, DEL), format characters (bidi overrides,
# zero-width), lone surrogates, and line/paragraph separators.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


@dataclass(frozen=True)
class Situation:
    """Something the rules could not decide, with everything a reader needs to decide it."""

    kind: SituationKind
    subject: str  # what it is about: "instance:10007", "fleet", "sensor:provider"
    summary: str  # one line, plain words
    facts: tuple[dict[str, Any], ...]  # the relevant facts, already sanitized
    key: dict[str, Any]  # the values that make this situation different; fingerprinted
    proposals: tuple[dict[str, Any], ...]  # {"action","params","proposer","confidence","reason"}
    recent_actions: tuple[dict[str, Any], ...]  # {"at","action","params","status","proposer"}
    fleet: dict[str, Any]  # counts by status/stage, spend_per_h, launches_1h, pending tasks
    budget: dict[str, Any]  # spend left per hour, launches left this hour
    allowed_actions: tuple[str, ...]
    default_action: dict[str, Any]  # what happens if nobody answers: normally {"action": "hold"}
    created_at: float

    def __post_init__(self) -> None:
        if self.kind not in SITUATION_KINDS:
            raise ValueError(
                f"situation kind {self.kind!r} is not one of {', '.join(SITUATION_KINDS)}"
            )
        for name in _TUPLE_FIELDS:  # accept lists, store tuples
            value = getattr(self, name)
            if not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))


def fingerprint(s: Situation) -> str:
    """Identify a situation by kind, subject and key only: 16 hex chars of a sha256.

    Time, facts and proposals are left out on purpose, so the same trouble seen on the next tick
    has the same fingerprint. `key` must hold JSON values (a TypeError says otherwise); note that
    1 and 1.0 are different keys.
    """
    canonical = json.dumps(
        [s.kind, s.subject, s.key],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def should_escalate(last_raised_at: float | None, now: float, window_s: float) -> bool:
    """Dedup: raise when never raised before or when `window_s` has passed since the last time.

    A clock that went backwards (now < last_raised_at) keeps the situation quiet until the
    window has passed by the new clock.
    """
    return last_raised_at is None or now - last_raised_at >= window_s


def sanitize(value: Any, cap: int = 200) -> Any:
    """Make untrusted text safe to show to a person or an LLM.

    Strings: control, format and separator characters become visible escapes ("\\x1b", "\\n",
    "\\u202e"), and a string whose escaped form is longer than `cap` is cut (never inside an
    escape) and ends with "…[truncated N chars]", N counting the original characters dropped.
    Dicts, lists and tuples are sanitized recursively (dict keys are escaped but never cut, so
    two keys cannot merge); anything else is returned unchanged.
    """
    if cap < 0:
        raise ValueError(f"sanitize cap must be >= 0, got {cap!r}")
    if isinstance(value, str):
        return _sanitize_text(value, cap)
    if isinstance(value, Mapping):
        return {_escape_key(k): sanitize(v, cap) for k, v in value.items()}
    if isinstance(value, list):
        return [sanitize(v, cap) for v in value]
    if isinstance(value, tuple):
        return tuple(sanitize(v, cap) for v in value)
    return value


def sanitize_fact(fact: Mapping[str, Any], cap: int = 200) -> dict[str, Any]:
    """A copy of `fact` with every string value (at any depth) sanitized; field names kept."""
    return {name: sanitize(value, cap) for name, value in fact.items()}


def _sanitize_text(text: str, cap: int) -> str:
    if len(text) <= cap and text.isprintable():  # fast path: nothing to escape or cut
        return text
    pieces: list[str] = []
    used = 0
    for index, char in enumerate(text):
        piece = _escape_char(char)
        if used + len(piece) > cap:
            return "".join(pieces) + f"…[truncated {len(text) - index} chars]"
        pieces.append(piece)
        used += len(piece)
    return "".join(pieces)


def escape_controls(text: str) -> str:
    """`text` with control, format and separator characters as visible escapes, uncut: one
    line that moves no cursor, for a terminal or a log (`sanitize` without its cap)."""
    if text.isprintable():
        return text
    return "".join(_escape_char(char) for char in text)


def _escape_key(key: Any) -> Any:
    if not isinstance(key, str) or key.isprintable():
        return key
    return "".join(_escape_char(char) for char in key)


def _escape_char(char: str) -> str:
    named = _NAMED_ESCAPES.get(char)
    if named is not None:
        return named
    if unicodedata.category(char) not in _ESCAPED_CATEGORIES:
        return char
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def to_dict(s: Situation) -> dict[str, Any]:
    """The situation as plain JSON-ready data (tuples become lists), for the journal.

    `from_dict(to_dict(s)) == s`, also through `json.dumps`/`json.loads`, for any situation
    whose contents are JSON values (str keys; dict, list, str, int, float, bool, None).
    """
    return {f.name: _plain(getattr(s, f.name)) for f in fields(Situation)}


def from_dict(d: Mapping[str, Any]) -> Situation:
    """Rebuild a situation stored with `to_dict`. Unknown or missing keys are errors."""
    names = [f.name for f in fields(Situation)]
    unknown = sorted(set(d) - set(names))
    missing = [n for n in names if n not in d]
    if unknown or missing:
        raise ValueError(
            f"situation record: unknown keys {unknown!r}, missing keys {missing!r}"
            f" (expected exactly {', '.join(names)})"
        )
    if not isinstance(d["created_at"], int | float) or isinstance(d["created_at"], bool):
        raise ValueError(f"situation record: created_at must be a number, got {d['created_at']!r}")
    for name in ("key", "fleet", "budget", "default_action"):
        if not isinstance(d[name], Mapping):
            raise ValueError(f"situation record: {name} must be an object, got {d[name]!r}")
    for name in _TUPLE_FIELDS:
        if not isinstance(d[name], list | tuple):
            raise ValueError(f"situation record: {name} must be a list, got {d[name]!r}")
    values = {n: _plain(d[n]) for n in names}
    for name in _TUPLE_FIELDS:
        values[name] = tuple(values[name])
    return Situation(**values)


def _plain(value: Any) -> Any:
    """A deep copy with tuples as lists and mappings as dicts."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value

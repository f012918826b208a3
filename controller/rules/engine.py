"""The only module that imports durable_rules.

durable_rules (2.0.28, unmaintained since 2020) keeps global state, starts timer threads from
`engine.Host`, has no locking, swallows exceptions raised in action callbacks and cannot replace
a registered ruleset. This adapter makes it a pure-looking function `match(facts) -> matches`:

- a Host subclass that never starts the dispatch/timer threads; actions fire synchronously
  inside `assert_facts`;
- every rulebook is registered under a fresh ruleset name (its digest plus a counter), so a
  reload never collides with the old one;
- each call uses its own session id (`sid`) and deletes that session's state afterwards: no rule
  state survives between ticks;
- every batch carries a marker fact that a no-op rule fires on: durable_rules segfaults in
  `delete_state` for a session in which no action ever ran;
- a fact given twice, field for field, is asserted once, and two other facts with one id are
  refused before the engine sees them: durable_rules knows a fact by its id and rejects a
  batch that repeats one (MessageObservedException), and deleting the session of a rejected
  batch corrupts its memory (the process segfaults or aborts a call or two later); a rejected
  batch's session is left as it is (a few facts, kept until the process ends);
- callbacks only record (rule key, {alias: fact id}); they cannot raise;
- a fact is asserted with only the fields the rulebook names (`Rulebook.fields_used`), its
  kind and id: the engine parses every field it is given, and the rest of a fact is read from
  the caller's copy by id (about a fifth of a tick at 10,000 instances);
- a batch is written as JSON once: each fact's text is both the key that tells a batch
  asserted as the last one was and, with the session's stamps, the text durable_rules is
  given (the very text its own `json.dumps(batch, ensure_ascii=False)` writes; at 10,000
  instances writing the batch twice more cost about a tenth of a tick);
- a join condition (a reference to another fact) is never the last of its alias's `$and`:
  when the last one is false, durable_rules skips past the group's end marker and scans the
  memory beyond the expression array for another (events.c, `reduceExpressionSequence`),
  which crashes the process at random; an always-true comparison of the session stamp `t`
  with the referenced fact's is appended after them;
- one lock serialises all use, since the library has none.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import sys
import threading
from collections.abc import Callable, Sequence
from json import encoder as _json_encoder
from typing import Any

import durable_rules_engine as _native
from durable import engine as _dr

from controller.core.matches import Match
from controller.rules.compile import SINK, TICK, TICK_KIND
from controller.rules.rulebook import Rulebook

_LOCK = threading.Lock()
_COUNTER = itertools.count(1)
_KEYS = json.JSONEncoder(sort_keys=True)  # a fact as the key that finds its repeats
_STAMPS = frozenset({"sid", "t"})  # what each asserted fact carries for the session alone
_PLAIN = json.JSONEncoder(ensure_ascii=False)  # as durable_rules writes what it asserts
_KIND_ID = ("kind", "id")  # what a fact of a kind no rule names is asserted with


class EngineError(RuntimeError):
    """durable_rules refused a ruleset or a batch of facts."""


class _QuietHost(_dr.Host):  # type: ignore[misc]
    """A Host without background dispatch threads (all actions run inside assert_facts)."""

    def _run(self) -> None:
        return None

    def assert_json(self, ruleset_name: str, text: str) -> None:
        """`assert_facts` of a batch already written as JSON, as `Host.assert_facts` writes
        it (`json.dumps(facts, ensure_ascii=False)`), with the same actions and exceptions."""
        rules = self.get_ruleset(ruleset_name)

        def asserted(batch: str) -> Any:
            return rules._handle_result(_native.assert_facts(rules._handle, batch), batch)

        self._handle_function(rules, asserted, text, None)


_HOST: _QuietHost | None = None


def _host() -> _QuietHost:
    global _HOST
    if _HOST is None:
        _HOST = _QuietHost()
    return _HOST


class Engine:
    """A compiled rulebook registered in durable_rules, matched one batch of facts at a time."""

    def __init__(self, book: Rulebook, *, every_field: bool = False) -> None:
        """`every_field`: assert facts whole, not only the fields the rules name."""
        self.book = book
        self._keep: dict[str, tuple[str, ...]] | None = None
        if not every_field:
            self._keep = {kind: ("kind", "id", *sorted(names - {"kind", "id"} - _STAMPS))
                          for kind, names in book.fields_used().items()}  # fmt: skip
        self._fired: list[Match] = []
        self._name = f"fleetgate_{book.digest or 'rules'}_{next(_COUNTER)}"
        definition: dict[str, Any] = {}
        for key, rule in book.definition.items():
            definition[key] = dict(_guarded(rule), run=self._recorder(key))
        try:
            with _LOCK:
                _host().register_rulesets({self._name: definition})
        except Exception as exc:  # the C extension raises its own error type
            raise EngineError(f"durable_rules refused the rules ({book.digest}): {exc}") from exc
        self._sids = itertools.count(1)
        self._last: tuple[list[str], tuple[Match, ...]] | None = None  # its facts, what fired

    def _recorder(self, key: str) -> Any:
        fired = self._fired

        def record(c: Any) -> None:
            message = getattr(c, "_m", None) or {}
            fired.append(Match(key, {alias: str(f.get("id")) for alias, f in message.items()}))

        record.__name__ = f"record_{key}"
        return record

    def _slim(self, fact: dict[str, Any]) -> dict[str, Any]:
        """The fields of `fact` the rules read (all when asserted whole), without the ones
        the session stamps (`sid`, `t`)."""
        # `_number` for a float only where its test fails: a call per value was a tenth of
        # the match at 10,000 instances
        if self._keep is None:
            return {k: v if type(v) is not float or 1e-4 <= abs(v) < 1e16 or v == 0.0
                    else _number(v) for k, v in fact.items() if k not in _STAMPS}  # fmt: skip
        keep = self._keep.get(str(fact.get("kind")), _KIND_ID)
        return {k: v if type(v) is not float or 1e-4 <= abs(v) < 1e16 or v == 0.0
                else _number(v) for k in keep if k in fact for v in (fact[k],)}  # fmt: skip

    def match(self, facts: Sequence[dict[str, Any]], stamp: float, *,
              reuse: bool = True) -> list[Match]:  # fmt: skip
        """Assert `facts` in a fresh session, return what fired, drop the session.

        Facts asserted as the previous call's were (the same fields, values and order) match
        as they did: a session starts empty, so what fires depends on the facts alone (a
        quiet fleet asserts the same facts tick after tick). `reuse=False` asserts them all
        the same (what a benchmark of the engine times)."""
        slim = [self._slim(f) for f in facts]
        try:
            texts = _texts(slim)
        except (TypeError, ValueError) as exc:  # from the JSON encoder: no session began
            raise EngineError(f"a fact is not JSON, nothing was asserted: {exc}") from exc
        once = _once(slim)
        if once is not slim:
            texts = _texts(once)
        if reuse and self._last is not None and self._last[0] == texts:
            return list(self._last[1])
        sid = f"{self._name}.{next(self._sids)}"
        stamp = _number(float(stamp))
        tick = {"kind": TICK_KIND, "id": TICK_KIND, "sid": sid, "t": stamp}
        fired = self._match(_batch(tick, texts), sid)
        self._last = (texts, tuple(fired))
        return fired

    def _match(self, batch: str, sid: str) -> list[Match]:
        """Assert `batch` (the JSON text of a list of facts, each carrying `sid`)."""
        with _LOCK:
            self._fired.clear()
            host = _host()
            started = True  # a session exists once the batch reached the engine
            try:
                host.assert_json(self._name, batch)
            except (_dr.MessageNotHandledException, _dr.MessageObservedException) as exc:
                started = False  # deleting a rejected batch's session corrupts the engine
                raise EngineError(
                    f"durable_rules rejected the batch: {type(exc).__name__}"
                ) from exc
            finally:
                if started:
                    with contextlib.suppress(Exception):  # a missing session: nothing to clean
                        host.delete_state(self._name, sid)
            fired = [m for m in self._fired if m.key not in (SINK, TICK)]
            self._fired.clear()
        return fired


def _texts(facts: list[dict[str, Any]]) -> list[str]:
    """Each fact's JSON text, as `json.dumps(..., ensure_ascii=False)` writes it (TypeError or
    ValueError when a fact is not JSON). One encoder for the batch: building one per fact (what
    `json.dumps` does) costs a third more at 10,000 facts."""
    make: Any = getattr(_json_encoder, "c_make_encoder", None)
    if make is None:  # CPython without its C accelerator
        return [_PLAIN.encode(f) for f in facts]
    write: Callable[[Any, int], Sequence[str]] = make(
        {}, _PLAIN.default, _json_encoder.encode_basestring, None,
        _PLAIN.key_separator, _PLAIN.item_separator, False, False, True,
    )  # fmt: skip
    return ["".join(write(f, 0)) for f in facts]


def _batch(tick: dict[str, Any], texts: list[str]) -> str:
    """The JSON text of `[tick, *facts]`, each fact with the tick's `sid` and `t` last, as
    `json.dumps([tick, *(dict(f, sid=..., t=...) for f in facts)], ensure_ascii=False)`
    writes it, from the facts' texts (`_texts`)."""
    (tick_text,) = _texts([tick])
    stamps = tick_text[tick_text.index('"sid"') : -1]  # '"sid": "...", "t": ...'
    sep = _PLAIN.item_separator
    parts = [tick_text]
    parts += [f"{t[:-1]}{sep}{stamps}}}" if t != "{}" else f"{{{stamps}}}" for t in texts]
    return "[" + sep.join(parts) + "]"


def _guarded(rule: dict[str, Any]) -> dict[str, Any]:
    """`rule` with `t >= <kind>.t` after the join conditions of each alias that has any.

    durable_rules evaluates an alias's join conditions in order and, on the first false one,
    steps once past it before looking for the group's end: after the last condition that step
    lands beyond the end marker, and the search runs on through whatever memory follows
    (a segfault at random, about one process in four over a thousand matches). A last
    condition that always holds (every fact of a batch carries the same `t`) is never the
    false one. The condition compares with the kind named by the alias's last reference,
    which is matched by then; it is not an equality, so the engine's hash join is unchanged."""
    joins = rule.get("all")
    if not isinstance(joins, list):
        return rule
    out: list[Any] = []
    for alias in joins:
        name, cond = next(iter(alias.items())) if len(alias) == 1 else (None, None)
        conds: list[Any] = []
        if isinstance(cond, dict) and list(cond) == ["$and"] and isinstance(cond["$and"], list):
            conds = cond["$and"]
        named = [k for k in map(_referenced, conds) if k is not None]
        if name is None or not named:
            out.append(alias)
            continue
        out.append({name: {"$and": [*conds, {"$gte": {"t": {named[-1]: "t"}}}]}})
    return dict(rule, all=out)


def _referenced(cond: Any) -> str | None:
    """The kind a join condition `{op: {field: {kind: field}}}` names, or None."""
    if not isinstance(cond, dict) or len(cond) != 1:
        return None
    op, body = next(iter(cond.items()))
    if not str(op).startswith("$") or not isinstance(body, dict) or len(body) != 1:
        return None
    ref = next(iter(body.values()))
    if isinstance(ref, dict) and len(ref) == 1:
        kind, fld = next(iter(ref.items()))
        if isinstance(fld, str):
            return str(kind)
    return None


def _number(value: Any) -> Any:
    """`value`, or for a float the engine's JSON parser misreads, the nearest one it reads.

    Python writes a float below 1e-4 or from 1e16 up as `5e-05` or `1e+16`; durable_rules
    reads a number with an exponent but no decimal point as nothing, and drops the whole
    batch without a word (no rule fires on any fact; a down_for_s of 5e-05 after a float
    subtraction would blind every rule for the tick). Such a float is asserted as the next
    float away from zero (one unit in the last place, written `5.000000000000001e-05`), and
    an infinity as the largest finite float (`Infinity` is dropped alike); NaN is read as it
    is (no comparison holds). Other values are returned as they are."""
    if type(value) is not float or value != value:
        return value
    size = abs(value)
    if 1e-4 <= size < 1e16 or size == 0.0:
        return value  # written without an exponent
    if size == math.inf:
        return math.copysign(sys.float_info.max, value)
    away = math.copysign(math.inf, value)
    while "." not in repr(value):  # one step, or a few for the smallest subnormals
        value = math.nextafter(value, away)
    return value


def _once(facts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`facts` without the repeats of a fact given before, field for field (JSON facts).
    durable_rules knows a fact by its id: two other facts with one id are refused here,
    before a session exists (EngineError naming the id)."""
    if len({str(f.get("id")) for f in facts}) == len(facts):
        return facts  # the usual batch: ids are unique within a tick
    seen: set[str] = set()
    ids: set[str] = set()
    kept: list[dict[str, Any]] = []
    for f in facts:
        key = _KEYS.encode(f)
        if key in seen:
            continue
        fid = str(f.get("id"))
        if fid in ids:
            raise EngineError(f"two different facts have the id {fid!r}; nothing was asserted")
        seen.add(key)
        ids.add(fid)
        kept.append(f)
    return kept

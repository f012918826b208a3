"""`for:`: a rule fires only once its condition has held for one subject that long.

Derived from history, never from engine state: each tick passes in, per (rule, subject), since
when the condition has held and when a tick last saw it hold (the journal's `rule_pending`
table), and gets back the new state to store. The subject is the facts the rule joined
(`instance=i7`, or `demand=demand:all,fleet=fleet`). Per tick:

1. a rule without `for:` fires as it matched;
2. a match of a `for:` rule keeps the time its subject's condition started holding, or starts
   it now; it fires once `now - since` reaches the rule's `for`, and waits otherwise (its facts
   count as claimed meanwhile: a rule that waits is not an unmatched fact to escalate);
3. a (rule, subject) that did not match this tick is dropped: a gap resets the clock;
4. so is one no tick saw for over `GAP_S` (the controller was down): a condition nobody
   watched is not known to have held, as in Prometheus's `for-outage-tolerance`.

Pure: `now` and the stored state are arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controller.core.matches import Match
from controller.rules.model import Rulebook

GAP_S = 3600.0  # an unwatched stretch longer than this restarts a hold

Key = tuple[str, str]  # (rule name, subject)
Since = tuple[float, float]  # (since when the condition has held, the last tick that saw it)


@dataclass(frozen=True)
class Waiting:
    """A `for:` rule whose condition holds, not yet long enough."""

    rule: str
    subject: str
    since: float
    for_s: float
    now: float

    @property
    def held_s(self) -> float:
        return self.now - self.since

    @property
    def left_s(self) -> float:
        return max(self.for_s - self.held_s, 0.0)


@dataclass(frozen=True)
class Held:
    fire: list[Match]  # what fires this tick (every match of a rule without `for:`)
    pending: dict[Key, Since]  # the state to store
    waiting: tuple[Waiting, ...]  # matched, still short of `for`


def subject(m: Match) -> str:
    """The facts a match joined, as one stable string."""
    return ",".join(f"{alias}={fid}" for alias, fid in sorted(m.facts.items()))


def hold(book: Rulebook, matches: Sequence[Match], before: Mapping[Key, Since],
         now: float) -> Held:  # fmt: skip
    """Steps 1-4 of the module docstring."""
    waits = {r.name: r.for_s for r in book.rules if r.for_s}
    fire: list[Match] = []
    pending: dict[Key, Since] = {}
    waiting: list[Waiting] = []
    for m in matches:
        for_s = waits.get(m.rule or "")
        if for_s is None:
            fire.append(m)
            continue
        key = (str(m.rule), subject(m))
        was = before.get(key)
        since = min(was[0], now) if was is not None and now - was[1] <= GAP_S else now
        pending[key] = (since, now)
        if now - since >= for_s:
            fire.append(m)
        else:
            waiting.append(Waiting(key[0], key[1], since, for_s, now))
    return Held(fire, pending, tuple(sorted(waiting, key=lambda w: (w.rule, w.subject))))

"""Plan: the second step of a tick. From the gathered snapshot to the plan and the bookkeeping.

No I/O: reconcile what the journal expected with what was sensed, advance each instance's
history, build facts, match them in the rule engine, hold back `for:` rules whose condition has
not held long enough yet (`controller.rules.hold`, from the holds the journal keeps), decide,
and run the one guard pass over every decision (rules', approved answers', follow-ups' and
expired escalations' defaults). What to write comes back as data (`Planned.books`,
`Planned.tracks`, `Planned.events`, `Planned.pending`); the apply step writes it. `fleetgate
explain` prints a plan and writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from controller.core import guards, reconcile
from controller.core.decide import Decided, Doubt, decide
from controller.core.facts import build_facts
from controller.core.matches import Match
from controller.core.model import Decision, Observation, Plan, Proposal
from controller.core.policy import DecideSettings
from controller.core.reconcile import Book
from controller.core.track import NO_DEBOUNCE, Debounce, Event, History, Track, advance, debounced
from controller.rules.fire import proposals_from
from controller.rules.hold import Key, Since, Waiting, hold
from controller.rules.source import RulesSource
from controller.service.gather import Gathered


@dataclass(frozen=True)
class Planned:
    """Everything one tick worked out before acting (what `explain` shows)."""

    now: float
    observation: Observation
    history: History
    tracks: dict[str, Track]
    events: list[Event]
    facts: list[dict[str, Any]]
    matches: list[Match]
    decided: Decided
    plan: Plan
    doubts: tuple[Doubt, ...]
    by_id: dict[str, dict[str, Any]]
    """The facts by id."""
    books: tuple[Book, ...] = ()
    """Bookkeeping to write with the tick's intents."""
    vetoes: frozenset[tuple[str, ...]] = frozenset()
    """Vetoes journaled recently (not journaled again)."""
    pending: dict[Key, Since] = field(default_factory=dict)
    """The `for:` holds to store: since when each (rule, subject) condition has held."""
    waiting: tuple[Waiting, ...] = ()
    """`for:` rules that matched and wait (what `explain` shows, with the time left)."""
    escalations: tuple[dict[str, Any], ...] = ()
    """The pending escalations as gathered."""


def plan(g: Gathered, rules: RulesSource, settings: DecideSettings,
         extra: Sequence[Proposal] = (), debounce: Debounce = NO_DEBOUNCE,
         holds: Mapping[Key, Since] | None = None) -> Planned:  # fmt: skip
    """Track, reconcile, facts, match, hold (`holds`: the journal's), decide, guard."""
    now, lim = g.now, settings.guards
    tracks, events = advance(g.history, g.observation, now, debounce)
    obs = debounced(g.observation, tracks)  # a failed probe that did not persist is no death
    books = reconcile.interrupted(g.intents, obs)
    pending, launch_books = reconcile.launches(g.launches, obs, g.seen, now,
                                               pending_s=lim.launch_pending_s,
                                               unknown_s=lim.launch_unknown_s)  # fmt: skip
    follow, follow_books = reconcile.followups(g.replacements, obs, now)
    defaults, expire_books = reconcile.expired(g.pending, now)
    books += launch_books + follow_books + expire_books + reconcile.carried(g.carried)
    recent = tuple(e for e in events if e.kind in ("death", "restart"))
    hist = replace(g.history, instances=tracks, events=g.history.events + recent,
                   pending_launches=len(pending))  # fmt: skip
    facts = build_facts(obs, hist, now)
    by_id = {str(f["id"]): f for f in facts}
    matches = rules.engine.match(facts, now)
    held = hold(rules.book, matches, holds or {}, now)  # a waiting rule still claims its facts
    fired = proposals_from(held.fire, by_id, rules.book, settings, now)
    decided = decide(facts, matches, fired, settings, [*g.approved, *follow, *extra])
    limits = lim.model_copy(update={"paused": g.paused or lim.paused})
    ctx = guards.Context(by_id, hist, limits, now)
    checked, vetoes = guards.check([*decided.decisions, *defaults], ctx)
    decided = _drop_moot(decided, checked)
    return Planned(now, obs, hist, tracks, events, facts, matches, decided, Plan(tuple(checked)),
                   decided.doubts + tuple(vetoes), by_id, tuple(books), g.vetoes,
                   held.pending, held.waiting, g.pending)  # fmt: skip


def _drop_moot(decided: Decided, checked: Sequence[Decision]) -> Decided:
    """An ask the guards turned into a noop or a veto: nothing a person could approve, so its
    approval doubt is not raised."""
    moot = {id(was.proposal) for was, now_ in zip(decided.decisions, checked, strict=False)
            if was.verdict == "ask" and now_.verdict != "ask"}  # fmt: skip
    if not moot:
        return decided
    doubts = tuple(x for x in decided.doubts if not any(id(p) in moot for p in x.proposals))
    return replace(decided, doubts=doubts)

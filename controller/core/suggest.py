"""Candidate rules learned from people's answers to escalations (`fleetgate suggest-rules`).

Escalations in (`Answer`s, one per escalation), candidate rules and their replay out:

1. take the escalations a person answered (not the LLM, not a deadline, not the controller
   resolving one that cleared), each with the fact its subject names (the situation stored
   with the escalation holds the facts);
2. per situation kind and subject kind (`instance`, `sensor`), group those answers by the
   subject's shape, from the most general (an instance's `status`) to the most specific
   (`status`, `stage`, `daemon`, `sidecar`); a value a rule cannot name (one outside the
   field's closed set: a status vast sends that fleetgate does not know) is nothing to match
   on, and its answers teach nothing. A group whose answers all agree, with at least
   `min_answers` of them, and whose shape does not describe a healthy fact, is a candidate; a
   group that disagrees (or describes a healthy fact) is split by the next field. At the most
   specific shape the answer most people gave is the candidate if it has `min_answers`; the
   others are its contradictions;
3. each candidate is replayed on every escalation of its situation kind and subject kind:
   *handled* (its pattern matches the subject and the answer, a person's or the LLM's, chose
   what it chooses), *contradicted* (it matches and a person answered otherwise, or denied what
   it chooses), *unanswered* (it matches; nobody's answer to compare, or the LLM's differed).

An answer's way is its action with its parameters, the subject's own id written as
`{{ instance.id }}` (its machine as `{{ instance.machine_id }}`), free text (`reason`) left
out. A denial means "not that": the action it denied (the proposal the escalation showed), or
anything but `hold` when the escalation proposed nothing.

A candidate's confidence is the rule of succession over people's answers to what it matches:
(agreeing + 1) / (answers + 2), rounded down to hundredths, at most 0.95: three agreeing
answers and none against give 0.80.

Pure: no I/O, no clock, no rule engine (a candidate's pattern is plain equalities, matched here;
its rule test runs through the engine under `fleetgate test-rules`).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.core.facts import FIELDS, VALUES

SHAPES: dict[str, tuple[str, ...]] = {
    "instance": ("status", "stage", "daemon", "sidecar"),
    "sensor": ("name", "state"),
}
"""Per subject kind, the fields that describe its shape, most general first."""

NOBODY = frozenset({"", "deadline", "controller"})  # "answered" by no one: expiry, clearing
SKIPPED_KINDS = frozenset({"approval"})  # a rule already proposes it: autonomy's business
FREE_TEXT = frozenset({"reason"})  # parameters left out of an answer's way
SUBJECT_FIELDS = ("id", "machine_id")  # parameters written as the subject's own fields
MAX_TEST_FACTS = 5
_NAME_CHARS = re.compile(r"[^a-z0-9_.-]+")

Way = tuple[str, tuple[tuple[str, str], ...]]
"""An answer's action and its parameters (name, JSON literal or `{{ kind.field }}`), sorted."""


@dataclass(frozen=True)
class Answer:
    """One escalation as the replay sees it."""

    esc_id: int
    kind: str  # the situation kind
    subject: str  # "instance:10004"
    fact: Mapping[str, Any] | None  # the subject's fact, from the stored situation
    by: str  # a person's name, "llm:<model>", or "" (nobody)
    way: Way | None  # the answer's action as a way; None: no action was answered
    denied: str | None  # a denial: the action denied, "" when nothing was proposed

    @property
    def subject_kind(self) -> str:
        return self.subject.partition(":")[0]

    @property
    def by_person(self) -> bool:
        return bool(self.by) and not self.by.startswith("llm:")


@dataclass(frozen=True)
class Contradiction:
    esc_id: int
    by: str
    answered: str  # in words: "destroy instance=10012", "denied replace"


@dataclass(frozen=True)
class Replay:
    kind_total: int  # escalations of the candidate's situation kind and subject kind
    matched: tuple[int, ...]
    handled: tuple[int, ...]
    contradicted: tuple[Contradiction, ...]
    unanswered: tuple[int, ...]

    @property
    def share(self) -> float:
        """Handled, of the escalations the candidate matches."""
        return len(self.handled) / len(self.matched) if self.matched else 0.0


@dataclass(frozen=True)
class Candidate:
    name: str
    kind: str
    subject_kind: str
    pattern: dict[str, Any]
    way: Way
    support: tuple[int, ...]  # the escalations whose people's answers taught it
    confidence: float
    replay: Replay
    tests: tuple[dict[str, Any], ...]  # the subject facts of (some of) `support`

    @property
    def action(self) -> str:
        return self.way[0]

    def params(self) -> dict[str, Any]:
        """The rule's `then` parameters: templates as text, literals as their values (a text
        with `{{` in it, which a rule would render as a template, as an expression that gives
        the text back)."""
        return {k: v if v.startswith("{{") else _literal(json.loads(v)) for k, v in self.way[1]}

    def params_for(self, fact: Mapping[str, Any]) -> dict[str, Any]:
        """What the rule proposes for `fact` (its templates filled in)."""
        out = {}
        for key, value in self.way[1]:
            ref = _template_field(value)
            out[key] = str(fact.get(ref)) if ref is not None else json.loads(value)
        return out

    def shape(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.pattern.items())


def way_of(action: str, params: Mapping[str, Any], fact: Mapping[str, Any] | None,
           subject_kind: str) -> Way:  # fmt: skip
    """An answer's way: the subject's own fields as templates, free text left out."""
    out = []
    for key, value in params.items():
        if key in FREE_TEXT:
            continue
        text = json.dumps(value, sort_keys=True)
        for field in SUBJECT_FIELDS if fact is not None and isinstance(value, str) else ():
            if value and str(fact.get(field)) == value:  # type: ignore[union-attr]
                text = "{{ " + f"{subject_kind}.{field}" + " }}"
                break
        out.append((str(key), text))
    return action, tuple(sorted(out))


def from_row(row: Mapping[str, Any], shown: Mapping[str, Any] | None = None) -> Answer:
    """An escalation as the journal holds it (JSON columns decoded); `shown`: the proposal its
    message showed (what a denial denied)."""
    situation = row.get("situation") or {}
    skind, _, ident = str(row["subject"]).partition(":")
    fact = next((f for f in situation.get("facts") or []
                 if f.get("kind") == skind and str(f.get("id")) == ident), None)  # fmt: skip
    by = str(row.get("answered_by") or "")
    by = "" if by in NOBODY else by
    answer = row.get("answer")
    way, denied = None, None
    if by and row.get("status") == "denied":
        denied = str(shown["action"]) if shown and "action" in shown else ""
    elif by and isinstance(answer, Mapping) and isinstance(answer.get("action"), str):
        way = way_of(answer["action"], answer.get("params") or {}, fact, skind)
    return Answer(int(row["id"]), str(row["kind"]), str(row["subject"]), fact, by, way, denied)


Steady = Mapping[str, Sequence[Mapping[str, Any]]]


def suggest(answers: Sequence[Answer], *, min_answers: int = 3,
            steady: Steady | None = None) -> list[Candidate]:  # fmt: skip
    """Steps 1 to 3. `steady`: per subject kind, facts known to be healthy (a candidate whose
    pattern matches one is refined, or dropped)."""
    if min_answers < 1:
        raise ValueError(f"min_answers must be at least 1, got {min_answers!r}")
    taught = [a for a in answers if a.by_person and a.fact is not None
              and a.subject_kind in SHAPES and a.kind not in SKIPPED_KINDS
              and (a.way is not None or a.denied is not None)]  # fmt: skip
    groups: dict[tuple[str, str], list[Answer]] = {}
    for a in taught:
        groups.setdefault((a.kind, a.subject_kind), []).append(a)
    out = []
    for (kind, skind), members in sorted(groups.items()):
        healthy = (steady or {}).get(skind, ())
        for pattern, way, support in _split(members, skind, 1, min_answers, healthy):
            out.append(_candidate(kind, skind, pattern, way, support, answers))
    return out


def _split(members: Sequence[Answer], skind: str, level: int, min_answers: int,
           healthy: Sequence[Mapping[str, Any]]
           ) -> Iterator[tuple[dict[str, Any], Way, tuple[int, ...]]]:  # fmt: skip
    """Step 2 at one level of the shape: (pattern, way, supporting escalations) per candidate."""
    fields = SHAPES[skind][:level]
    finest = level == len(SHAPES[skind])
    by_shape: dict[tuple[Any, ...], list[Answer]] = {}
    for a in members:
        assert a.fact is not None
        by_shape.setdefault(tuple(a.fact.get(f) for f in fields), []).append(a)
    closed = VALUES.get(skind, {})
    for shape, group in sorted(by_shape.items(), key=lambda kv: json.dumps(kv[0])):
        if any(not isinstance(v, str) or not v for v in shape):
            continue  # a field the facts lack: nothing to match on
        if any(f in closed and v not in closed[f] for f, v in zip(fields, shape, strict=True)):
            continue  # a value `check` refuses in a rule: nothing a rule can match on
        pattern = dict(zip(fields, shape, strict=True))
        ways = Counter(a.way for a in group if a.way is not None)
        top = ways.most_common(1)[0] if ways else None
        agree = top is not None and len(ways) == 1 and not any(_denies(a, top[0]) for a in group)
        fits = not any(matches(pattern, f) for f in healthy)
        if top is not None and top[1] >= min_answers and fits and (agree or finest):
            yield pattern, top[0], tuple(a.esc_id for a in group if a.way == top[0])
        elif not finest and len(group) >= min_answers:
            yield from _split(group, skind, level + 1, min_answers, healthy)


def matches(pattern: Mapping[str, Any], fact: Mapping[str, Any] | None) -> bool:
    """A candidate's pattern (plain equalities) on a fact."""
    return fact is not None and all(fact.get(k) == v for k, v in pattern.items())


def _denies(a: Answer, way: Way) -> bool:
    return a.denied is not None and (a.denied == way[0] or (a.denied == "" and way[0] != "hold"))


def _candidate(kind: str, skind: str, pattern: dict[str, Any], way: Way,
               support: tuple[int, ...], answers: Sequence[Answer]) -> Candidate:  # fmt: skip
    replay = replay_on(kind, skind, pattern, way, answers)
    people = [a for a in answers if a.esc_id in set(replay.matched) and a.by_person]
    agreeing = sum(1 for a in people if a.way == way)
    confidence = min(0.95, math.floor(100 * (agreeing + 1) / (len(people) + 2)) / 100)
    by_id = {a.esc_id: a for a in answers}
    facts: dict[str, dict[str, Any]] = {}
    for esc_id in support:
        fact = by_id[esc_id].fact or {}
        facts.setdefault(str(fact.get("id")), _test_fact(skind, fact))
    name = _name(kind, pattern, way[0])
    return Candidate(name, kind, skind, pattern, way, support, confidence, replay,
                     tuple(list(facts.values())[:MAX_TEST_FACTS]))  # fmt: skip


def replay_on(kind: str, skind: str, pattern: Mapping[str, Any], way: Way,
              answers: Sequence[Answer]) -> Replay:  # fmt: skip
    """Step 3: the candidate on every escalation of its situation kind and subject kind."""
    same = [a for a in answers if a.kind == kind and a.subject_kind == skind]
    matched, handled, unanswered = [], [], []
    contradicted = []
    for a in same:
        if not matches(pattern, a.fact):
            continue
        matched.append(a.esc_id)
        if a.way == way:
            handled.append(a.esc_id)
        elif a.by_person and (a.way is not None or _denies(a, way)):
            contradicted.append(Contradiction(a.esc_id, a.by, _said(a)))
        else:
            unanswered.append(a.esc_id)
    return Replay(len(same), tuple(matched), tuple(handled), tuple(contradicted),
                  tuple(unanswered))  # fmt: skip


def _said(a: Answer) -> str:
    if a.way is None:
        return f"denied {a.denied}" if a.denied else "denied"
    return describe(a.way)


def describe(way: Way) -> str:
    params = " ".join(f"{k}={v}" for k, v in way[1])
    return f"{way[0]} {params}".strip()


def _test_fact(skind: str, fact: Mapping[str, Any]) -> dict[str, Any]:
    """The subject's fact as a rule test states it: the fields a rule may name."""
    return {"kind": skind, **{k: fact[k] for k in sorted(fact) if k in FIELDS[skind]}}


def _literal(value: Any) -> Any:
    """`value` as a rule's parameter that evaluates to it: a text with `{{` in it as a jinja
    string literal (JSON's escapes are jinja's), else as it is."""
    if isinstance(value, str) and "{{" in value:
        return "{{ " + json.dumps(value, ensure_ascii=False) + " }}"
    return value


def _template_field(value: Any) -> str | None:
    if isinstance(value, str) and value.startswith("{{") and value.endswith("}}"):
        return value[2:-2].strip().partition(".")[2]
    return None


def _name(kind: str, pattern: Mapping[str, Any], action: str) -> str:
    words = ["learned", kind, *(str(v) for v in pattern.values()), action]
    name = _NAME_CHARS.sub("-", "-".join(words).lower()).strip("-")
    return name[:63].rstrip("-._")

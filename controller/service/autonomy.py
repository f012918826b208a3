"""The autonomy track record on the journal: read it, journal demotions, say what is in force.

Each tick calls `review` after escalating:

1. read the snapshot the last review saved under KEY; when nothing it depends on changed
   (people's answers in the window and what became of them, the gate, the hour), stop there;
2. read the escalations answered in the window, each with the proposal its message showed,
   and the actions people's answers carried out, with the actions they may have undone;
3. `controller.core.track_record.review`; journal each new demotion as an event
   (`autonomy_demoted`) and log it;
4. save the snapshot: the record, the promotion suggestions and the demotions in force (what
   `fleetgate status` shows under `autonomy`).

`in_force` is what each plan decides with: the configured gate with the demotions in force for
rules' proposals, and the gate the LLM's answers pass, with those for the LLM's.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from controller.core import track_record
from controller.core.policy import DecideSettings, Gate, demoted
from controller.store.journal import Journal

log = logging.getLogger(__name__)

KEY = "autonomy.track_record"
REVIEW_EVERY_S = 3600.0  # the window slides: read the record again at least this often
UNDONE = ("drain", "undrain", "destroy", "replace")  # what a person's action may revert


def in_force(journal: Journal, settings: DecideSettings,
             memo: dict[str, Any] | None = None) -> tuple[DecideSettings, Gate]:  # fmt: skip
    """(the settings rules' proposals are decided with, the gate the LLM's answers pass).
    The demotion events are read once per process into `memo` (the caller's, as `review`
    takes it): `review`, in the leader that ticks, is what adds them."""
    memo = {} if memo is None else memo
    if "events" not in memo:
        memo["events"] = [e["detail"] for e in journal.escalations.autonomy_events()]
    events = memo["events"]
    if not events:  # nothing was ever demoted: the configured gate, as it is
        return settings, settings.gate
    rules, llm = track_record.demoted_actions(track_record.in_force(events, settings.gate))
    gate = settings.gate
    return settings.model_copy(update={"gate": demoted(gate, rules)}), demoted(gate, llm)


def review(journal: Journal, settings: DecideSettings, now: float,
           memo: dict[str, Any] | None = None) -> dict[str, Any] | None:  # fmt: skip
    """Steps 1 to 4; the snapshot saved (None: nothing changed since the last one). `memo`,
    kept by the caller from tick to tick, holds the gate's digest and the signature this
    process last saved, so that an unchanged record costs one query a tick."""
    a = settings.autonomy
    since = now - a.window_s
    memo = {} if memo is None else memo
    if memo.get("gate") is not settings.gate:
        memo.update(gate=settings.gate, digest=track_record.gate_digest(settings.gate))
    digest = memo["digest"]
    signature = [journal.escalations.answers_signature(since), digest,
                 int(now // REVIEW_EVERY_S)]  # fmt: skip
    if memo.get("signature") == signature:  # this process saved it: the journal holds it
        return None
    memo.pop("events", None)  # answers moved, or the hour: read the demotions again
    saved = journal.meta.get(KEY, None) or {}
    if saved.get("signature") == signature:
        memo["signature"] = signature
        return None
    gate_since = float(saved.get("gate_since", now)) if saved.get("gate") == digest else now
    events = [e["detail"] for e in journal.escalations.autonomy_events()]
    r = track_record.review(outcomes(journal, since, a.revert_window_s), settings.gate, a, now,
                            events, gate_since)  # fmt: skip
    for d in r.new_demotions:
        journal.escalations.add_autonomy_event(now, asdict(d))
        memo.pop("events", None)  # `in_force` reads them again
        log.warning("autonomy: %s (%s) demoted to propose: %s; lifted when the gate section of "
                    "the config changes", d.action, d.kind, d.why)  # fmt: skip
    for s in r.suggestions:
        if not any(x.get("action") == s.action and x.get("kind") == s.kind
                   for x in saved.get("suggestions", [])):  # fmt: skip
            log.info("autonomy: suggested: %s", s.text())
    doc = {**r.doc(), "signature": signature, "gate": digest, "gate_since": gate_since,
           "at": now}  # fmt: skip
    journal.meta.put(KEY, doc)
    memo["signature"] = signature
    return doc


def outcomes(journal: Journal, since: float, revert_s: float) -> list[track_record.Outcome]:
    """Step 2: people's answers to proposals since `since`, and the reverts of their actions."""
    from escalation.approvals import shown_proposal

    out = []
    for esc in journal.escalations.answered_since(since):
        o = track_record.answer_outcome(esc, shown_proposal(journal, esc))
        if o is not None:
            out.append(o)
    people = [p for p in journal.escalations.executed_by_people(since)
              if p["action"] in ("drain", "undrain", "launch")]  # fmt: skip
    if people:
        earlier = journal.escalations.executed_between(
            float(people[0]["at"]) - revert_s, float(people[-1]["at"]), UNDONE
        )
        out += track_record.reverts(people, earlier, revert_s)
    return out


def status_part(journal: Journal) -> dict[str, Any]:
    """The status document's `autonomy`: suggestions, demotions in force, the record."""
    saved = journal.meta.get(KEY, None) or {}
    return {k: saved.get(k, []) for k in ("suggestions", "demoted", "record")}

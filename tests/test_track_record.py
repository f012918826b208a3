"""Autonomy from the track record: promotions suggested, demotions at once, both in status.

On the simulator, a person approving every restart the shipped crash rule proposes (its
autonomy on `propose`) earns `restart_daemon` a promotion suggestion after `promote_after`
approvals, not before, shown by `fleetgate status` (run as a person would). On a journal, a
denial of a proposal and a person undoing a drain each demote the action at once: journaled as
an event, in force in the gate the next plan decides with, shown in status, lifted when the
gate changes. The core's rules (what counts, what is a revert) on hand-made records.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from controller.core import track_record
from controller.core.decide import gate
from controller.core.model import Proposal
from controller.core.policy import Autonomy, DecideSettings, Gate
from controller.core.track_record import Outcome
from controller.service import autonomy
from controller.service.assemble import assemble
from controller.service.config import load_config
from controller.service.status import status_doc
from controller.store.journal import Journal
from escalation import approvals

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "controller" / "shipped_rules"
PROMOTE_AFTER = 3


def fleetgate(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("fleetgate")
    cmd = [str(script)] if script.exists() else [
        sys.executable, "-c", "import sys; from controller.service.cli import main; "
        "sys.exit(main())"]  # fmt: skip
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


# ---- promotion, on the simulator ---------------------------------------------------------------


def test_unchanged_approvals_earn_a_promotion_suggestion_shown_in_status(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    for name in ("scaling.yaml", "crashes.yaml"):
        shutil.copy(SHIPPED / name, rules / name)
    (rules / "others.yaml").write_text(  # every other state is somebody else's business
        "normal:\n  instance:\n    - {status: {neq: running}}\n"
        "    - {stage: {in: [provisioning, loading, registered, params, bench]}}\n"
    )
    cfg = tmp_path / "fleetgate.yaml"
    cfg.write_text(f"interval_s: 0.01\nrules: [{rules}]\n"
                   "gate: {actions: {restart_daemon: propose}}\n"
                   f"autonomy: {{promote_after: {PROMOTE_AFTER}}}\n"
                   "escalation: {deadline_s: 864000, channels: [file]}\n")  # fmt: skip
    state = tmp_path / "state"
    app = assemble(load_config(str(cfg)), state=state, clock=time.time, sleep=time.sleep, seed=7)
    approved: list[int] = []  # approvals given before each tick
    first: int | None = None
    try:
        for n in range(400):
            before = len(approved)
            app.controller.tick()
            doc = app.journal.meta.get(autonomy.KEY)
            if doc["suggestions"] and first is None:
                first, at_first = n, before
                break
            for esc in app.journal.escalations.recent(status="pending"):
                now = app.controller.clock()
                if esc["kind"] == "approval":
                    assert esc["situation"]["proposals"][0]["action"] == "restart_daemon"
                    approvals.approve(app.journal, int(esc["id"]), by="ana", now=now)
                    approved.append(int(esc["id"]))
                else:
                    approvals.deny(app.journal, int(esc["id"]), by="ana", now=now)
    finally:
        app.close()
    assert first is not None, f"no suggestion after {len(approved)} approvals"
    # suggested on the tick after the promote_after-th approval, not before
    assert at_first >= PROMOTE_AFTER
    [s] = doc["suggestions"]
    assert (s["action"], s["kind"]) == ("restart_daemon", "approval")
    assert s["config"] == "gate.actions.restart_daemon: act"
    assert s["approved_unchanged"] == at_first
    # never applied: the gate still asks
    assert app.config.gate.actions == {"restart_daemon": "propose"}
    st = fleetgate("--config", str(cfg), "--state", str(state), "status", "--json")
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["autonomy"]["suggestions"][0]["action"] == "restart_daemon"
    text = fleetgate("--config", str(cfg), "--state", str(state), "status")
    assert "autonomy suggestion: promote restart_daemon (approval) to act" in text.stdout


# ---- demotion, on a journal ---------------------------------------------------------------------

FACT = {"kind": "instance", "id": "7", "machine_id": "m7", "status": "running",
        "stage": "running", "daemon": "up", "sidecar": "up"}  # fmt: skip


def escalate(j: Journal, kind: str, now: float, proposal: dict[str, Any] | None) -> int:
    situation = {"kind": kind, "subject": "instance:7", "summary": "s", "facts": [FACT],
                 "key": {}, "proposals": [proposal] if proposal else [], "recent_actions": [],
                 "fleet": {}, "budget": {}, "allowed_actions": ["drain", "undrain", "hold"],
                 "default_action": {"action": "hold"}, "created_at": now}  # fmt: skip
    return j.escalations.add_escalation(
        fingerprint=f"fp{now}",
        kind=kind,
        subject="instance:7",
        summary="s",
        now=now,
        deadline=now + 1800,
        situation=situation,
        default_action={"action": "hold"},
    )


def act(j: Journal, now: float, action: str, proposer: str, esc: int | None = None) -> int:
    aid = j.actions.record(tick_id=None, now=now, action=action, target="instance:7",
                           params={"instance": "7"}, proposer=proposer, reason="r",
                           confidence=1.0, verdict="act", why="w", status="ok",
                           escalation_id=esc)  # fmt: skip
    if esc is not None:
        j.escalations.set_escalation_status(esc, "executed", aid)
    return aid


def drain(confidence: float = 0.95) -> Proposal:
    return Proposal("drain", {"instance": "7"}, "rule:idle", "idle", confidence)


@pytest.fixture
def journal(tmp_path: Path) -> Any:
    j = Journal(tmp_path / "state" / "journal.db")
    yield j
    j.close()


def test_a_denial_demotes_at_once_until_the_gate_changes(journal: Journal, tmp_path: Path
                                                          ) -> None:  # fmt: skip
    j, settings = journal, DecideSettings()  # everything on act
    autonomy.review(j, settings, 1000.0)
    assert gate(drain(), autonomy.in_force(j, settings)[0]).verdict == "act"
    esc = escalate(j, "low_confidence", 1100.0, {"action": "drain", "params": {"instance": "7"},
                                                  "proposer": "rule:idle", "confidence": 0.5,
                                                  "reason": "idle"})  # fmt: skip
    approvals.deny(j, esc, by="ana", now=1150.0)
    doc = autonomy.review(j, settings, 1200.0)
    assert doc is not None
    [d] = doc["demoted"]
    assert (d["action"], d["kind"], d["cause"], d["ref"]) == ("drain", "low_confidence", "denied",
                                                              f"escalation:{esc}")  # fmt: skip
    [event] = j.escalations.autonomy_events()
    assert event["detail"]["action"] == "drain" and event["at"] == 1200.0
    # in force: a rule's confident drain now asks; other actions still act
    rules_settings, llm_gate = autonomy.in_force(j, settings)
    assert gate(drain(), rules_settings).verdict == "ask"
    assert "autonomy for 'drain' is propose" in gate(drain(), rules_settings).why
    assert (
        gate(Proposal("reboot", {"instance": "7"}, "rule:r", "r", 0.95), rules_settings).verdict
        == "act"
    )
    assert llm_gate.actions.get("drain", llm_gate.mode) == "act"  # a rules' kind: not the LLM's
    # journaled once, however often reviewed
    autonomy.review(j, settings, 1300.0)
    autonomy.review(j, settings, 9000.0)
    assert len(j.escalations.autonomy_events()) == 1
    st = status_doc(j, now=9000.0, provider="sim", paused=False, rules=None, ttl_s=15, sim=None)
    assert [x["action"] for x in st["autonomy"]["demoted"]] == ["drain"]
    # the operator changes the gate: the demotion lifts, and the old denial does not demote again
    changed = DecideSettings(gate=Gate(confidence_threshold=0.75))
    assert gate(drain(), autonomy.in_force(j, changed)[0]).verdict == "act"
    doc = autonomy.review(j, changed, 9100.0)
    assert doc is not None and doc["demoted"] == []
    assert len(j.escalations.autonomy_events()) == 1


def test_a_person_undoing_a_drain_demotes_it(journal: Journal, tmp_path: Path) -> None:
    j, settings = journal, DecideSettings()
    autonomy.review(j, settings, 1000.0)
    act(j, 2000.0, "drain", "rule:idle")  # the rule drained it on its own
    act(j, 2100.0, "undrain", "rule:undrain-for-demand")  # the rules' own undrain is no revert
    autonomy.review(j, settings, 2200.0)
    assert j.escalations.autonomy_events() == []
    esc = escalate(j, "unmatched", 2300.0, None)
    approvals.approve(j, esc, by="ana", now=2350.0, action="undrain")
    act(j, 2400.0, "undrain", "human:ana", esc)  # a person took it back within the hour
    doc = autonomy.review(j, settings, 2500.0)
    assert doc is not None
    [d] = doc["demoted"]
    assert (d["action"], d["kind"], d["cause"]) == ("drain", "approval", "reverted")
    assert gate(drain(), autonomy.in_force(j, settings)[0]).verdict == "ask"
    st = fleetgate("--state", str(tmp_path / "state"), "status")
    assert st.returncode == 0, st.stderr
    assert "autonomy: drain (approval) demoted to propose" in st.stdout


def test_an_undo_after_the_revert_window_is_no_revert(journal: Journal) -> None:
    j, settings = journal, DecideSettings()
    autonomy.review(j, settings, 1000.0)
    act(j, 2000.0, "drain", "rule:idle")
    esc = escalate(j, "unmatched", 5000.0, None)
    approvals.approve(j, esc, by="ana", now=5650.0, action="undrain")
    act(j, 5700.0, "undrain", "human:ana", esc)  # 3700 s later: past the hour
    autonomy.review(j, settings, 5800.0)
    assert j.escalations.autonomy_events() == []


# ---- the core -----------------------------------------------------------------------------------


def outcome(verdict: str, at: float, ref: str, action: str = "drain",
            kind: str = "approval") -> Outcome:  # fmt: skip
    return Outcome(action, kind, verdict, at, ref, "why")  # type: ignore[arg-type]


def test_promotion_needs_promote_after_clean_approvals_in_the_window_and_propose() -> None:
    on_propose = Gate(actions={"drain": "propose"})
    rules = Autonomy(promote_after=3, window_s=1000)
    clean = [outcome("unchanged", t, f"escalation:{t}") for t in (100.0, 200.0, 300.0)]
    r = track_record.review(clean, on_propose, rules, 400.0, [], 0.0)
    assert [(s.action, s.approved_unchanged) for s in r.suggestions] == [("drain", 3)]
    assert track_record.review(clean[:2], on_propose, rules, 400.0, [], 0.0).suggestions == ()
    # one changed answer, or the window sliding past the first approval: no suggestion
    changed = [*clean, outcome("changed", 350.0, "escalation:350")]
    assert track_record.review(changed, on_propose, rules, 400.0, [], 0.0).suggestions == ()
    assert track_record.review(clean, on_propose, rules, 1150.0, [], 0.0).suggestions == ()
    # already on act: nothing to promote, and approvals demote nothing
    r = track_record.review(clean, Gate(), rules, 400.0, [], 0.0)
    assert r.suggestions == () and r.new_demotions == ()


def test_demotion_is_per_action_and_kind_and_only_on_act() -> None:
    rules = Autonomy()
    denied = [outcome("denied", 100.0, "escalation:1", kind="unmatched", action="replace")]
    r = track_record.review(denied, Gate(), rules, 200.0, [], 0.0)
    [d] = r.new_demotions
    assert (d.action, d.kind) == ("replace", "unmatched")
    assert track_record.demoted_actions(r.in_force) == (set(), {"replace"})  # the LLM's
    on_propose = Gate(actions={"replace": "propose"})
    assert track_record.review(denied, on_propose, rules, 200.0, [], 0.0).new_demotions == ()
    assert track_record.review(denied, Gate(mode="observe"), rules, 200.0, [], 0.0
                               ).new_demotions == ()  # fmt: skip


def test_reverts_pair_an_action_with_a_persons_opposite_one() -> None:
    earlier = [
        {"id": 1, "at": 100.0, "action": "drain", "target": "instance:7", "kind": None},
        {"id": 2, "at": 150.0, "action": "destroy", "target": "instance:8", "kind": "unmatched"},
        {"id": 3, "at": 160.0, "action": "drain", "target": "instance:9", "kind": None},
    ]
    people = [
        {"at": 900.0, "action": "undrain", "target": "instance:7", "proposer": "human:ana"},
        {"at": 1000.0, "action": "launch", "target": "fleet", "proposer": "human:ana"},
    ]
    got = track_record.reverts(people, earlier, 3600.0)
    assert [(o.action, o.kind, o.ref) for o in got] == [
        ("drain", "approval", "action:1"),
        ("destroy", "unmatched", "action:2"),
    ]
    assert track_record.reverts(people, earlier, 500.0) == []  # both too late


def test_answer_outcomes_compare_with_the_proposal_shown() -> None:
    shown = {"action": "replace", "params": {"instance": "7", "reason": "frozen"}}
    base = {"id": 3, "kind": "unmatched", "created_at": 10.0, "answered_at": 20.0}
    same = {
        **base,
        "status": "executed",
        "answered_by": "ana",
        "answer": {"action": "replace", "params": {"instance": "7", "reason": ""}},
    }
    other = {
        **base,
        "status": "executed",
        "answered_by": "ana",
        "answer": {"action": "destroy", "params": {"instance": "7"}},
    }
    denied = {**base, "status": "denied", "answered_by": "ana", "answer": None}
    by_llm = {**same, "answered_by": "llm:fake"}
    verdicts = [track_record.answer_outcome(e, shown) for e in (same, other, denied, by_llm)]
    assert [v.verdict if v else None for v in verdicts] == ["unchanged", "changed", "denied", None]
    assert track_record.answer_outcome(same, None) is None  # nothing was proposed


def test_retention_keeps_a_demotion_in_force(journal: Journal) -> None:
    """A demotion holds until the gate changes, however old: the journal's retention (`run`'s
    pruner, `fleetgate prune`) deleted its event with the fleet's old events, and the action
    acted on its own again with the same gate."""
    from controller.store.retention import count, prune

    j, settings = journal, DecideSettings()
    autonomy.review(j, settings, 1000.0)
    esc = escalate(j, "low_confidence", 1100.0, {"action": "drain", "params": {"instance": "7"},
                                                  "proposer": "rule:idle", "confidence": 0.5,
                                                  "reason": "idle"})  # fmt: skip
    approvals.deny(j, esc, by="ana", now=1150.0)
    autonomy.review(j, settings, 1200.0)
    assert gate(drain(), autonomy.in_force(j, settings)[0]).verdict == "ask"
    later = 1200.0 + 100 * 86_400.0  # past the default 90 days
    assert "events" not in count(j.store, later, 90)
    prune(j.store, later, 90)
    assert len(j.escalations.autonomy_events()) == 1
    autonomy.review(j, settings, later)
    assert gate(drain(), autonomy.in_force(j, settings)[0]).verdict == "ask"


def test_a_leader_that_takes_the_lease_again_reads_the_demotions_made_meanwhile(
    tmp_path: Path,
) -> None:
    """The demotions are read once per process; one that led, stood by while another leader
    demoted an action, and led again planned with what it had read before."""
    from controller.service.config import Config
    from controller.store.actions import Fence

    a = assemble(Config(), state=tmp_path / "state", clock=lambda: 1000.0, sleep=lambda s: None)
    try:
        c, j = a.controller, a.controller.journal
        j.actions.fence = Fence("leader", "this", 1)
        autonomy.review(j, c.settings, 1000.0)
        c.plan(1000.0)
        assert c._autonomy["events"] == []
        # meanwhile, the other leader: a person denied a drain, and it was demoted
        esc = escalate(
            j,
            "low_confidence",
            1100.0,
            {
                "action": "drain",
                "params": {"instance": "7"},
                "proposer": "rule:idle",
                "confidence": 0.5,
                "reason": "idle",
            },
        )
        approvals.deny(j, esc, by="ana", now=1150.0)
        autonomy.review(j, c.settings, 1200.0)  # with a memo of its own: another process
        assert len(j.escalations.autonomy_events()) == 1
        c.plan(1300.0)
        assert c._autonomy["events"] == []  # the same term: nothing else wrote, by its lights
        j.actions.fence = Fence("leader", "this", 3)  # the lease again, a later term
        c.plan(1400.0)
        assert [e["action"] for e in c._autonomy["events"]] == ["drain"]
    finally:
        a.close()

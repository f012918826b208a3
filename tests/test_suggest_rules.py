"""`fleetgate suggest-rules`: answers teach the rules.

A simulated run in which a person answers every escalation (frozen instances: replace; dead
ones: destroy; a running instance whose daemon is down: restart it; anything else: deny) leaves
a journal; `suggest-rules`, run as a person would, proposes rules from it, each replayed on the
journal's history; the rules and their tests pass `fleetgate check` and `fleetgate test-rules`
(subprocesses), and adopted, the frozen-instance rule handles what people were asked about.
The grouping, the replay and the contradictions are checked on hand-made answers too.
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
import yaml

from controller.core import suggest
from controller.core.suggest import Answer
from controller.service.assemble import assemble
from controller.service.config import load_config
from controller.store.journal import Journal
from escalation import approvals

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "controller" / "shipped_rules"
TICKS = 600
NORMAL = """\
normal:
  instance:
    - {status: running, stage: running, daemon: up, sidecar: up}
    - {status: {in: [provisioning, created, loading, running]},
       stage: {in: [provisioning, loading, registered, params, bench]}}
"""


def fleetgate() -> list[str]:
    script = Path(sys.executable).with_name("fleetgate")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from controller.service.cli import main; "
            "sys.exit(main())"]  # fmt: skip


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*fleetgate(), *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)  # fmt: skip


def person(fact: dict[str, Any]) -> str | None:
    """The scripted person on call: the action they approve (None: deny)."""
    if fact.get("status") == "frozen":
        return "replace"
    if fact.get("status") in ("exited", "offline", "unknown"):
        return "destroy"
    if fact.get("status") == "running" and fact.get("daemon") == "down":
        return "restart_daemon"
    return None


def rules_dir(where: Path) -> Path:
    """Rules that leave frozen, dead and crashed instances to people: the shipped scaling
    rules and the steady state, nothing else."""
    where.mkdir(parents=True)
    shutil.copy(SHIPPED / "scaling.yaml", where / "scaling.yaml")
    (where / "instances.yaml").write_text(NORMAL)
    return where


def simulate(base: Path, rules: Path, answer: bool = True) -> tuple[Path, Path]:
    """A run of TICKS ticks on the simulator (seed 7); (config file, state directory)."""
    cfg = base / "fleetgate.yaml"
    cfg.write_text(f"interval_s: 0.01\nrules: [{rules}]\n"
                   "escalation: {deadline_s: 864000, channels: [file]}\n")  # fmt: skip
    state = base / "state"
    app = assemble(load_config(str(cfg)), state=state, clock=time.time, sleep=time.sleep, seed=7)
    try:
        for _ in range(TICKS):
            app.controller.tick()
            for esc in app.journal.escalations.recent(status="pending") if answer else []:
                fact = next((f for f in esc["situation"]["facts"] if f.get("kind") == "instance"),
                            {})  # fmt: skip
                now, action = app.controller.clock(), person(fact)
                if action is None:
                    approvals.deny(app.journal, int(esc["id"]), by="ana", now=now)
                else:
                    approvals.approve(app.journal, int(esc["id"]), by="ana", now=now,
                                      action=action)  # fmt: skip
    finally:
        app.close()
    return cfg, state


@pytest.fixture(scope="module")
def answered_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    base = tmp_path_factory.mktemp("answered")
    rules = rules_dir(base / "rules")
    cfg, state = simulate(base, rules)
    return cfg, state, rules


def frozen_escalations(state: Path) -> list[int]:
    """The unmatched escalations about frozen instances, read from the journal directly."""
    j = Journal(state / "journal.db", read_only=True)
    try:
        return [int(e["id"]) for e in j.escalations.history() if e["kind"] == "unmatched"
                and any(f.get("status") == "frozen" for f in e["situation"]["facts"])]  # fmt: skip
    finally:
        j.close()


def test_a_rule_learned_from_answers_replays_passes_check_and_its_tests(
    answered_run: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    cfg, state, rules = answered_run
    out = tmp_path / "candidates"
    done = run("--config", str(cfg), "--state", str(state), "suggest-rules", "--out", str(out))
    assert done.returncode == 0, done.stderr
    frozen = frozen_escalations(state)
    assert len(frozen) >= 3
    rule_file = out / "learned-unmatched-frozen-replace.yaml"
    doc = yaml.safe_load(rule_file.read_text())
    [rule] = doc["rules"]
    assert rule["when"] == {"instance": {"status": "frozen"}}
    assert rule["then"]["action"] == "replace" and rule["then"]["instance"] == "{{ instance.id }}"
    assert rule["confidence"] >= 0.8
    # the replay: the escalations it would have handled, against the journal read directly
    report = done.stdout.split("candidate ")
    frozen_report = next(r for r in report if r.startswith("learned-unmatched-frozen-replace"))
    handled_line = next(ln for ln in frozen_report.splitlines() if "would have handled" in ln)
    assert "contradicts 0" in handled_line
    learned = [int(x) for x in rule["description"].split("(")[-1].rstrip(").").replace(
        "#", "").split(", ")]  # fmt: skip
    assert set(learned) <= set(frozen)
    assert len(learned) / len(frozen) >= 0.8, (learned, frozen)
    # placed in the rules folder, as a person would: check and test-rules pass
    adopted = tmp_path / "adopted"
    shutil.copytree(rules, adopted)
    (adopted / "tests").mkdir()
    shutil.copy(rule_file, adopted / rule_file.name)
    test_file = out / "tests" / "learned-unmatched-frozen-replace_test.yaml"
    shutil.copy(test_file, adopted / "tests" / test_file.name)
    checked = run("check", str(adopted))
    assert checked.returncode == 0, checked.stderr
    tested = run("test-rules", str(adopted / "tests"))
    assert tested.returncode == 0, tested.stdout
    passed = [ln for ln in tested.stdout.splitlines() if ln.startswith("PASS ")]
    assert any("learned-unmatched-frozen-replace_test.yaml" in ln for ln in passed)
    assert any("a healthy instance is left alone" in ln for ln in passed)
    # adopted, the rule replaces frozen instances: nobody is asked about one again
    again = tmp_path / "again"
    again.mkdir()
    _, state2 = simulate(again, adopted, answer=False)
    assert frozen_escalations(state2) == []
    j = Journal(state2 / "journal.db", read_only=True)
    try:
        replaced = [a for a in j.actions.recent(10_000) if a["action"] == "replace"
                    and a["proposer"] == "rule:learned-unmatched-frozen-replace"]  # fmt: skip
    finally:
        j.close()
    assert replaced


def test_without_out_the_candidates_print_and_nothing_is_written(
    answered_run: tuple[Path, Path, Path],
) -> None:
    cfg, state, rules = answered_run
    before = sorted(p.name for p in rules.iterdir())
    done = run("--config", str(cfg), "--state", str(state), "suggest-rules", "--min-answers", "3")
    assert done.returncode == 0, done.stderr
    docs = done.stdout.split("# ---- ")[1:]
    names = [d.splitlines()[0] for d in docs]
    assert "learned-unmatched-frozen-replace.yaml" in names
    assert "tests/learned-unmatched-frozen-replace_test.yaml" in names
    for d in docs:
        assert yaml.safe_load(d.split("\n", 1)[1])  # every file printed is YAML
    assert sorted(p.name for p in rules.iterdir()) == before
    many = run("--config", str(cfg), "--state", str(state), "suggest-rules",
               "--min-answers", "1000")  # fmt: skip
    assert many.returncode == 0 and many.stdout.startswith("no candidates")


# ---- the core on hand-made answers ------------------------------------------------------------


def fact(ident: str, status: str, stage: str = "running", daemon: str = "up") -> dict[str, Any]:
    return {"kind": "instance", "id": ident, "machine_id": f"m{ident}", "status": status,
            "stage": stage, "daemon": daemon, "sidecar": "up"}  # fmt: skip


def answer(
    esc_id: int,
    f: dict[str, Any],
    action: str | None,
    by: str = "ana",
    params: dict[str, Any] | None = None,
    kind: str = "unmatched",
) -> Answer:
    row: dict[str, Any] = {"id": esc_id, "kind": kind, "subject": f"instance:{f['id']}",
                           "situation": {"facts": [f]}, "answered_by": by}  # fmt: skip
    if action is None:
        row.update(status="denied", answer=None)
    else:
        row.update(
            status="executed", answer={"action": action, "params": params or {"instance": f["id"]}}
        )
    return suggest.from_row(row)


HEALTHY = {"instance": [fact("h", "running")]}


def test_agreeing_answers_make_one_general_rule_with_the_subject_as_a_template() -> None:
    answers = [answer(n, fact(str(n), "frozen", stage), "replace",
                      params={"instance": str(n), "reason": f"note {n}", "block_host": False})
               for n, stage in enumerate(["bench", "running", "params"], 1)]  # fmt: skip
    [c] = suggest.suggest(answers, min_answers=3, steady=HEALTHY)
    assert c.pattern == {"status": "frozen"}
    assert c.params() == {"block_host": False, "instance": "{{ instance.id }}"}
    assert c.replay.handled == (1, 2, 3) and c.replay.contradicted == ()
    assert c.confidence == 0.8  # (3 + 1) / (3 + 2)
    assert suggest.suggest(answers, min_answers=4, steady=HEALTHY) == []


def test_disagreement_splits_by_the_next_field_and_the_other_answers_are_contradictions() -> None:
    answers = [answer(1, fact("1", "frozen", "bench"), "replace"),
               answer(2, fact("2", "frozen", "bench"), "replace"),
               answer(3, fact("3", "frozen", "bench"), "replace"),
               answer(4, fact("4", "frozen", "running"), "reboot"),
               answer(5, fact("5", "frozen", "running"), "reboot"),
               answer(6, fact("6", "frozen", "running"), "reboot"),
               answer(7, fact("7", "frozen", "running"), "destroy", by="bob")]  # fmt: skip
    found = {c.name: c for c in suggest.suggest(answers, min_answers=3, steady=HEALTHY)}
    assert set(found) == {"learned-unmatched-frozen-bench-replace",
                          "learned-unmatched-frozen-running-up-up-reboot"}  # fmt: skip
    bench, running = found.values()
    assert bench.pattern == {"status": "frozen", "stage": "bench"}
    assert bench.replay.handled == (1, 2, 3) and not bench.replay.contradicted
    # at stage running the answers disagree down to the finest shape: the majority wins there
    assert running.pattern == {"status": "frozen", "stage": "running", "daemon": "up",
                               "sidecar": "up"}  # fmt: skip
    assert running.replay.handled == (4, 5, 6)
    assert [(x.esc_id, x.by, x.answered) for x in running.replay.contradicted] == [
        (7, "bob", "destroy instance={{ instance.id }}")
    ]
    assert running.confidence == 0.66  # (3 + 1) / (4 + 2)


def test_a_shape_that_describes_a_healthy_instance_is_refined_until_it_does_not() -> None:
    answers = [answer(n, fact(str(n), "running", daemon="down"), "restart_daemon")
               for n in (1, 2, 3)]  # fmt: skip
    [c] = suggest.suggest(answers, min_answers=3, steady=HEALTHY)
    assert c.pattern == {"status": "running", "stage": "running", "daemon": "down"}
    # with no steady state given, the most general shape is taken
    [loose] = suggest.suggest(answers, min_answers=3)
    assert loose.pattern == {"status": "running"}


def test_denials_llm_and_deadline_answers_in_the_replay() -> None:
    answers = [answer(n, fact(str(n), "frozen"), "replace") for n in (1, 2, 3)]
    answers += [answer(4, fact("4", "frozen"), None),  # a denial: not replace
                answer(5, fact("5", "frozen"), "replace", by="llm:fake"),
                answer(6, fact("6", "frozen"), "hold", by="deadline"),
                answer(7, fact("7", "exited"), "destroy")]  # fmt: skip
    # the denial disagrees at every shape: the finest shape keeps the majority, and says so
    [c] = suggest.suggest(answers, min_answers=3, steady=HEALTHY)
    assert c.replay.kind_total == 7
    assert c.replay.matched == (1, 2, 3, 4, 5, 6)
    assert c.replay.handled == (1, 2, 3, 5)  # the LLM chose the same
    assert [(x.esc_id, x.answered) for x in c.replay.contradicted] == [(4, "denied")]
    assert c.replay.unanswered == (6,)  # nobody answered: the default ran
    assert c.support == (1, 2, 3)
    # the LLM's answers teach nothing
    llm = [answer(n, fact(str(n), "frozen"), "replace", by="llm:fake") for n in (1, 2, 3)]
    assert suggest.suggest(llm, min_answers=3, steady=HEALTHY) == []


def test_the_rule_test_states_the_answered_facts() -> None:
    answers = [answer(n, fact(str(n), "offline", "bench"), "destroy") for n in (1, 2, 3)]
    [c] = suggest.suggest(answers, min_answers=3, steady=HEALTHY)
    assert [f["id"] for f in c.tests] == ["1", "2", "3"]
    assert c.params_for(c.tests[0]) == {"instance": "1"}
    assert json.loads(json.dumps(c.tests[0]))["status"] == "offline"


def test_a_status_no_rule_can_name_teaches_nothing() -> None:
    """vast's `actual_status` is whatever it sends: a status outside the closed set made a
    candidate `fleetgate check` refuses ("not a value it takes"), and one with a line break in
    it wrote lines of YAML of its own into the candidate's header comments."""
    odd = ["inactive", "frozen\nnormal: {instance: {}}\n#"]
    answers = [answer(n, fact(str(n), odd[n % 2]), "destroy") for n in range(1, 7)]
    assert suggest.suggest(answers, min_answers=3, steady=HEALTHY) == []
    # a known status among them still teaches, from its own answers only
    answers += [answer(n, fact(str(n), "exited"), "destroy") for n in (7, 8, 9)]
    [c] = suggest.suggest(answers, min_answers=3, steady=HEALTHY)
    assert c.pattern == {"status": "exited"} and c.support == (7, 8, 9)


def test_text_from_the_journal_is_written_as_yaml_that_reads_back_the_same() -> None:
    """vast's `status_msg` and labels are any text: a DEL or a C1 control in one made the
    printed rule test a file YAML refuses ("special character '\\x9b' is not allowed"), and a
    NEL read back as a space; a name with a line break wrote a line of YAML of its own."""
    from controller.service.suggest_cmd import rule_text, test_text

    odd = "pull failed \x9b31m \x7f next\x85line\u2028sep \ud83d"
    facts = [{**fact(str(n), "frozen"), "status_msg": odd, "label": f"fg-{n}\x85"}
             for n in (1, 2, 3)]  # fmt: skip
    answers = [answer(n, facts[n - 1], "replace") for n in (1, 2, 3)]
    answers.append(answer(4, fact("4", "frozen"), "destroy", by="bob\nnormal: {instance: {}}"))
    [c] = suggest.suggest(answers, min_answers=3, steady=HEALTHY)
    doc = yaml.safe_load(test_text(c))
    assert [t["facts"][0]["status_msg"] for t in doc["tests"][:3]] == [odd] * 3
    assert [t["facts"][0]["label"] for t in doc["tests"][:3]] == [f["label"] for f in facts]
    text = rule_text(c)
    assert set(yaml.safe_load(text)) == {"rules"}
    head = text.split("rules:\n")[0].splitlines()
    assert all(line.startswith("# ") for line in head)
    assert any("bob\\u000anormal" in line for line in head)


def test_a_notify_message_with_braces_is_learned_as_the_text_people_approved() -> None:
    """A literal text with `{{` in it (a message people approved, written by the LLM from a
    label) became a template in the learned rule: it rendered each instance's own fields (or
    the settings) into the message, and the rule failed its own test."""
    from controller.rules.expr import compile_expr

    said = 'ask vast about {{ instance.label }} and "{{ settings }}" \\ {{'
    answers = [answer(n, fact(str(n), "frozen"), "notify", params={"message": said})
               for n in (1, 2, 3)]  # fmt: skip
    [c] = suggest.suggest(answers, min_answers=3, steady=HEALTHY)
    message = compile_expr(c.params()["message"])
    assert message.evaluate({"instance": {**fact("9", "frozen"), "label": "x"}}) == said
    assert c.params_for(c.tests[0]) == {"message": said}

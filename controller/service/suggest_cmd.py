"""`fleetgate suggest-rules [--min-answers N] [--out DIR]`: candidate rules from answers.

1. open the journal alone (as `status` does: broken rules or an unset secret do not stop it);
2. read every escalation with the proposal its message showed, as `controller.core.suggest`
   answers, and ask it for candidates (the healthy facts the rule tests start from are the
   steady state a candidate must not describe);
3. per candidate, a rules file `NAME.yaml` and its rule test `tests/NAME_test.yaml`, with the
   replay on the journal's history as comments; into DIR, or to stdout;
4. the replay in words on stderr (with --out) or as comments (stdout): what it would have
   handled, and every escalation where it contradicts a person's answer.

Nothing is adopted: the files go where they are told and no rules folder is read or changed.
Placed in a rules folder (the rule beside the others, its test in `tests/`), they pass
`fleetgate check` and `fleetgate test-rules`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from controller.core import suggest
from controller.core.suggest import Candidate
from controller.rules.ruletest import DEFAULTS
from controller.service import offline
from controller.store.journal import Journal
from escalation import approvals

# What YAML refuses in a file (DEL, C1 controls, lone surrogates, U+FFFE/F) or reads as a line
# break (NEL, U+2028/9); JSON leaves them as they are
_NOT_YAML = r"\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff"
_UNSAFE = re.compile(f"[{_NOT_YAML}]")
_UNSAFE_IN_COMMENT = re.compile(rf"[\x00-\x08\x0a-\x1f{_NOT_YAML}]")  # and line breaks


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("suggest-rules", help="candidate rules from people's answers",
                       description="Candidate rules (with rule tests) for situations people "
                       "answered the same way; each replayed on the journal first. Nothing "
                       "is adopted.")  # fmt: skip
    p.add_argument("--min-answers", type=int, default=3, metavar="N",
                   help="answers alike before a rule is suggested (default: 3)")  # fmt: skip
    p.add_argument("--out", metavar="DIR", help="write NAME.yaml and tests/NAME_test.yaml here "
                   "(default: print them)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Steps 1 to 4."""
    if args.min_answers < 1:
        print("fleetgate: --min-answers must be at least 1", file=sys.stderr)
        return 2
    with offline.opened(args.config, args.state, write=False) as off:
        found = candidates(off.journal, args.min_answers)
    if not found:
        print(f"no candidates: no situation was answered the same way {args.min_answers} "
              "times or more by people")  # fmt: skip
        return 0
    out = Path(args.out) if args.out else None
    for c in found:
        rule, test = rule_text(c), test_text(c)
        if out is None:
            print(f"# ---- {c.name}.yaml\n{rule}\n# ---- tests/{c.name}_test.yaml\n{test}")
            continue
        (out / "tests").mkdir(parents=True, exist_ok=True)
        (out / f"{c.name}.yaml").write_text(rule, encoding="utf-8")
        (out / "tests" / f"{c.name}_test.yaml").write_text(test, encoding="utf-8")
        print("\n".join(report(c)) + f"\n  wrote {out / c.name}.yaml, "
              f"{out / 'tests' / c.name}_test.yaml")  # fmt: skip
    return 0


def candidates(journal: Journal, min_answers: int) -> list[Candidate]:
    """Step 2."""
    answers = [suggest.from_row(row, approvals.shown_proposal(journal, row))
               for row in journal.escalations.history()]  # fmt: skip
    steady = {kind: [{"id": "healthy", **DEFAULTS[kind]}] for kind in suggest.SHAPES}
    return suggest.suggest(answers, min_answers=min_answers, steady=steady)


def report(c: Candidate) -> list[str]:
    """The candidate and its replay, in words."""
    r = c.replay
    whose = f"{c.kind} escalations about {c.subject_kind}s"
    lines = [
        f"candidate {c.name}: {suggest.describe(c.way)} when {c.shape()} "
        f"(confidence {c.confidence:.2f})",
        f"  learned from {len(c.support)} answers: {_ids(c.support)}",
        f"  replay on {r.kind_total} {whose}: it matches {len(r.matched)}, would have "
        f"handled {len(r.handled)} ({r.share:.0%}), contradicts {len(r.contradicted)}",
    ]
    if r.unanswered:
        lines.append(f"  matched with no person's answer to compare: {_ids(r.unanswered)}")
    lines += [f"  contradicts #{x.esc_id}: {x.by} answered {x.answered}" for x in r.contradicted]
    return lines


def rule_text(c: Candidate) -> str:
    """Step 3: the candidate as a rules file, the replay as comments."""
    then = {"action": c.action, **c.params()}
    if "reason" in _fields(c.action):
        then["reason"] = f"learned from answers to escalations {_ids(c.support)}"
    desc = (f"People answered {c.action} to {len(c.support)} {c.kind} escalations about "
            f"{c.subject_kind}s with {c.shape()} ({_ids(c.support)}).")  # fmt: skip
    head = "\n".join(f"# {_escaped(line, _UNSAFE_IN_COMMENT)}" for line in report(c))
    return (f"{head}\n# A candidate: review it, then copy it into a rules folder (its test "
            "into tests/). Nothing is adopted automatically.\n"
            "rules:\n"
            f"  - name: {c.name}\n"
            f"    description: {_flow(desc)}\n"
            f"    when:\n      {c.subject_kind}: {_flow(c.pattern)}\n"
            f"    then: {_flow(then)}\n"
            f"    confidence: {c.confidence:.2f}\n"
            "    priority: 0\n")  # fmt: skip


def test_text(c: Candidate) -> str:
    """Step 3: the rule test, one test per answered fact and one healthy fact left alone."""
    lines = [f"# Rule tests for {c.name}, from the facts people answered.",
             f"rule_files: [../{c.name}.yaml]", "tests:"]  # fmt: skip
    for fact in c.tests:
        proposal = {"rule": c.name, "action": c.action, "params": c.params_for(fact)}
        name = f"{c.subject_kind} {fact.get('id')} as a person answered"
        lines += [f"  - name: {_flow(name)}",
                  "    facts:", f"      - {_flow(fact)}",
                  "    expect:", f"      proposals:\n        - {_flow(proposal)}"]  # fmt: skip
    lines += [f"  - name: a healthy {c.subject_kind} is left alone",
              "    facts:", f"      - {_flow({'kind': c.subject_kind, 'id': 'healthy'})}",
              "    expect:", "      proposals: []"]  # fmt: skip
    return "\n".join(lines) + "\n"


def _flow(value: Any) -> str:
    """A YAML flow value (JSON is YAML), what YAML would refuse or fold escaped as `\\uXXXX`
    (they are only ever inside JSON's strings)."""
    return _escaped(json.dumps(value, ensure_ascii=False), _UNSAFE)


def _escaped(text: str, unsafe: re.Pattern[str]) -> str:
    return unsafe.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _ids(ids: tuple[int, ...]) -> str:
    return ", ".join(f"#{i}" for i in ids)


def _fields(action: str) -> set[str]:
    from controller.core.actions import ACTIONS

    return set(ACTIONS[action].model_fields)

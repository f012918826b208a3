"""`matches` patterns, compiled by durable_rules in a child process before the engine sees them.

durable_rules compiles each `matches` pattern to an automaton of its own, with fixed limits
(states, transitions) that only compiling tells; some patterns corrupt its heap and abort the
process (`a+%w%w+`), and some take seconds to refuse (`(%w*%d){20}`: 9 s), which a reload
would spend inside a tick, once per pattern. So every new pattern is compiled first in a
child process (`trial_main`), each against its own deadline (`PATTERN_S`): one the engine
refuses, crashes on, or takes longer than that to compile is a `path:line` problem, never a
dead controller or a stalled tick. A rulebook whose patterns together take over `TOTAL_S` to
compile is refused at the pattern that goes over, and trying stops after about `TOTAL_S`
(the patterns left are problems, "not tried", until the slow ones are fixed). Verdicts are
kept per pattern for the life of the process.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from controller.rules.engine import Engine, EngineError
from controller.rules.limits import show
from controller.rules.rulebook import Problem, Rule, Rulebook
from controller.rules.yamlsrc import Located

log = logging.getLogger(__name__)

START_S = 20.0  # a child's time to start and say it is ready
PATTERN_S = 1.0  # one pattern's compile time (a plain one takes about a millisecond)
TOTAL_S = 5.0  # all of a rulebook's patterns
_SMALLER = "; use fewer or smaller repeats and alternatives"
_WHY = {
    "501": "a syntax it does not read",
    "502": "too many transitions" + _SMALLER,
    "503": "too many states" + _SMALLER,
    "504": "its automaton grows too large" + _SMALLER,
    "505": "its automaton grows too large" + _SMALLER,
    "506": "its automaton grows too large" + _SMALLER,
    "507": "overlapping classes or alternatives it cannot combine",
    "508": "it finds the pattern invalid",
}
CRASHED = "the rule engine crashes or hangs compiling it"
SLOW = f"the rule engine takes over {PATTERN_S:g} s to compile it{_SMALLER}"


@dataclass(frozen=True)
class Verdict:
    why: str | None  # why durable_rules refuses it; None: it compiles
    seconds: float  # how long it took to compile


_VERDICTS: dict[str, Verdict] = {}


def _matches(book: Rulebook) -> Iterator[tuple[Rule, str, str, int]]:
    """(rule, field, pattern, line) of every `matches` condition (normal patterns have none)."""
    for rule in book.rules:
        for pattern in rule.when.values():
            for fld, cond in (pattern or {}).items():
                if isinstance(cond, dict) and isinstance(cond.get("matches"), str):
                    line = pattern.line_of(fld) if isinstance(pattern, Located) else rule.line
                    yield rule, str(fld), cond["matches"], line


def pattern_problems(book: Rulebook) -> list[Problem]:
    """The `matches` patterns of `book` the engine refuses, crashes or dwells on."""
    found = list(_matches(book))
    untried = _judge([p for _, _, p, _ in found if p not in _VERDICTS])
    problems, total, seen = [], 0.0, set()
    for rule, fld, p, line in found:
        verdict = _VERDICTS.get(p)
        if p in untried:
            verdict = Verdict(f"not tried: trying the rules' new patterns took over {TOTAL_S:g} "
                              "s (fix the ones above first)", 0.0)  # fmt: skip
        if verdict is None:  # not judged (no child could start): the engine decides
            continue
        why = verdict.why
        if why is None and p not in seen:
            seen.add(p)
            total += verdict.seconds
            if total > TOTAL_S:
                why = (f"the rules' patterns take over {TOTAL_S:g} s to compile in all (this "
                       f"one brings them to {total:.1f} s){_SMALLER}")  # fmt: skip
        if why:
            problems.append(Problem(rule.path, line,
                                    f"field {fld!r}: regular expression {show(p)}: {why}",
                                    rule.name))  # fmt: skip
    return problems


def _judge(patterns: list[str]) -> set[str]:
    """Compile `patterns` in children until each has a verdict (a child that dies, or dwells
    on one past PATTERN_S, condemns the pattern it was on; the next child goes on after it),
    for at most TOTAL_S after the first child: the patterns left untried then."""
    todo = list(dict.fromkeys(patterns))
    until = None
    while todo:
        if until is not None and time.monotonic() > until:
            return set(todo)
        verdicts, stopped = _trial(todo)
        until = until or time.monotonic() + TOTAL_S
        if verdicts is None:
            log.warning("could not try the regular expressions in a child process")
            return set()  # not judged: the engine built in this process decides
        for pattern, verdict in zip(todo, verdicts, strict=False):
            _VERDICTS[pattern] = verdict
        if len(verdicts) < len(todo):
            _VERDICTS[todo[len(verdicts)]] = Verdict(stopped or CRASHED, PATTERN_S)
        todo = todo[len(verdicts) + 1 :]
    return set()


def _verdict(line: str, seconds: float) -> Verdict:
    if line == "ok":
        return Verdict(None, seconds)
    code = line.partition(" ")[2]
    why = _WHY.get(code, "a limit of its own")
    return Verdict(f"the rule engine refuses it (durable_rules error {code}): {why}", seconds)


def _trial(patterns: list[str]) -> tuple[list[Verdict] | None, str]:
    """The verdicts of a child compiling `patterns` in turn (None if it did not even start),
    and why it stopped before the end: "" (it died, or finished), or SLOW (it was stopped)."""
    code = "from controller.rules.trial import trial_main; trial_main()"
    root = str(Path(__file__).resolve().parents[2])
    path = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    try:
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 env=env)  # fmt: skip
    except OSError:
        return None, ""
    try:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps(patterns).encode())
        child.stdin.close()
        lines = _Lines(child.stdout.fileno())
        if lines.next(START_S) != "ready":
            return None, ""
        verdicts: list[Verdict] = []
        for _ in patterns:
            started = time.monotonic()
            line = lines.next(PATTERN_S)
            if line is None:
                return verdicts, SLOW if lines.open else ""
            if line != "ok" and not line.startswith("refused "):
                return verdicts, ""
            verdicts.append(_verdict(line, time.monotonic() - started))
        return verdicts, ""
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


class _Lines:
    """Lines read from a pipe, each within its own deadline."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf, self.open = fd, b"", True

    def next(self, within_s: float) -> str | None:
        """The next line; None when the pipe closed first (`open` False) or time ran out."""
        deadline = time.monotonic() + within_s
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self.open:
                return None
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.fd, 4096)
            if not chunk:
                self.open = False
                continue
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode(errors="replace")


def trial_main() -> None:
    """In the child: compile each pattern (JSON on stdin) alone; print one verdict line each."""
    patterns = json.loads(sys.stdin.read())
    print("ready", flush=True)
    for pattern in patterns:
        definition = {"rule:p": {"all": [{"m": {"$mt": {"status_msg": pattern}}}]}}
        try:
            Engine(Rulebook((), {}, digest="pattern", definition=definition))
            print("ok", flush=True)
        except EngineError as exc:
            found = re.search(r"error code: (\d+)", str(exc))
            print(f"refused {found[1] if found else '?'}", flush=True)

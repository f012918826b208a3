"""durable_rules' own regex dialect (src/rules/regex.c in 2.0.28), for `matches` conditions.

durable_rules does not use Python's `re`: it compiles each pattern into an automaton of its own,
matched against the whole string; `%` escapes (`%d`, `%w`, `%.`), and `^`, `$`, `\\d` are plain
characters. `pattern_problem` refuses, with a reason, what its parser refuses and what it never
returns from (found by trying: `a*+`, `a?+`, `a|{2,}`, `(a*)+`, `(|b){0}`); its size limits
(states, transitions) are only known by compiling, which `rules_source` does in a child process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from controller.rules.limits import MAX_PATTERN

MAX_REPEAT = 100  # regex.c MAX_INTERVAL: {n,m} with m over 100 is refused
_ESCAPES = set(".|?*+()[]{}%acdglpsuwx")  # %d, %w, ... and %-escaped punctuation
_QUANTIFIERS = set("*+?{")
_REPEAT = re.compile(r"(\d{1,9})(,(\d{0,9}))?")


def matches_problem(pattern: str) -> str | None:
    """Why `pattern` cannot be a `matches` condition, or None: Python's `re` must read it (it
    is the documented syntax) and durable_rules' dialect must accept it."""
    if len(pattern) > MAX_PATTERN:
        return f"a regular expression of {len(pattern)} characters (at most {MAX_PATTERN})"
    try:
        re.compile(pattern)
    except (re.error, OverflowError, RecursionError, ValueError) as exc:
        return f"bad regular expression {pattern[:60]!r}: {exc}"
    problem = pattern_problem(pattern)
    if problem:
        return f"regular expression {pattern[:60]!r}: the rule engine does not support {problem}"
    return None


def pattern_problem(text: str) -> str | None:
    """What durable_rules 2.0.28 would refuse (or loop forever on) in a `$mt` pattern, or None."""
    if len(text) > MAX_PATTERN:
        return f"patterns over {MAX_PATTERN} characters"
    scan, i = _Scan(text), 0
    while i < len(text):
        i, problem = scan.token(i)
        if problem:
            return problem
    return None if scan.symbols else "an empty pattern (no character to match)"


@dataclass
class _Group:
    """An open group: can its alternative so far match "" before its last part, can the last
    part (None: no part yet), could an earlier alternative?"""

    head: bool = True
    last: bool | None = None
    earlier: bool = False

    def empty(self) -> bool:
        return self.head and self.last is not False


class _Scan:
    """One pass over a pattern, token by token as regex.c reads it."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.symbols = 0
        self.before = "("  # the token before: "atom", "repeat", "(" or "|"
        self.groups = [_Group()]

    def token(self, i: int) -> tuple[int, str | None]:
        ch = self.text[i]
        if ch in _QUANTIFIERS:
            return self._quantifier(i)
        self.before = ch if ch in "(|" else "atom"
        group = self.groups[-1]
        if ch == "(":
            self.groups.append(_Group())
        elif ch == ")" and len(self.groups) > 1:
            self.groups.pop()
            self._part(group.earlier or group.empty())
        elif ch == "|":
            group.earlier, group.head, group.last = group.earlier or group.empty(), True, None
        else:
            self.symbols += 1
            self._part(False)
            if ch == "%":
                return _escape(self.text, i)
            if ch == "[":
                return _char_class(self.text, i)
        return i + 1, None

    def _part(self, empty: bool) -> None:
        group = self.groups[-1]
        group.head, group.last = group.empty(), empty

    def _quantifier(self, i: int) -> tuple[int, str | None]:
        ch, before, self.before = self.text[i], self.before, "repeat"
        where = repr(self.text[max(0, i - 10) : i + 1])
        if before == "repeat":
            return i, f"a repeat right after a repeat (at {where}: no lazy *? or possessive *+)"
        if before in "(|" and not (ch == "?" and before == "(" and i):  # `(?i)` is let be
            return i, f"a repeat with nothing before it to repeat (at {where})"
        if ch == "{":
            end, problem, low, _ = _repeat(self.text, i)
        else:  # + repeats at least once, * and ? may not at all
            end, problem, low = i + 1, None, int(ch == "+")
        group = self.groups[-1]
        if not problem and group.last:  # regex.c can loop forever on these (`(a*)+`, `(|b){2,}`)
            problem = f"a repeat {self.text[i:end]!r} of a part that can match nothing"
        if low == 0:
            group.last = True
        return end, problem


def _escape(text: str, i: int) -> tuple[int, str | None]:
    if i + 1 >= len(text) or text[i + 1] not in _ESCAPES:
        bad = text[i : i + 2]
        return i + 2, (f"the escape {bad!r} (it escapes with %: %d %w %s %a %l %u %x %c %g %p, "
                       "or % before one of .|?*+()[]{}%; write %% for a %)")  # fmt: skip
    return i + 2, None


def _char_class(text: str, i: int) -> tuple[int, str | None]:
    """From '[' to past ']' as regex.c readRange reads it."""
    i += 1
    i += text.startswith("^", i)
    i += text.startswith("]", i)  # a leading ']' is literal
    last, after_dash = "", False
    while i < len(text) and text[i] != "]":
        if after_dash:
            if not last:
                return i, "a '-' range from the start of a [...] class or from an escape"
            i, after_dash = i + 1, False
        elif text[i] == "-":
            i, after_dash = i + 1, True
        elif text[i] == "%":
            i, problem = _escape(text, i)
            if problem:
                return i, problem
            last = ""
        else:
            last, i = text[i], i + 1
    if i >= len(text):
        return i, "an unclosed [...] class"
    return i + 1, None


def _repeat(text: str, i: int) -> tuple[int, str | None, int, int]:
    """From '{' to past '}': {n}, {n,} or {n,m} with n <= m <= 100; and n, m (0: no bound)."""
    end = text.find("}", i)
    form = _REPEAT.fullmatch(text[i + 1 : end]) if end > 0 else None
    if form is None:
        return len(text), f"the repeat {text[i : i + 12]!r} (write {{n}}, {{n,}} or {{n,m}})", 0, 0
    low, high = int(form[1]), int(form[3] or 0) if form[2] else int(form[1])
    if max(low, high) > MAX_REPEAT or (high and low > high):
        return end + 1, f"the repeat {{{form[0]}}} (at most {MAX_REPEAT}, and n <= m)", low, high
    return end + 1, None, low, high

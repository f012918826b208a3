"""Bounds on what a rules file may cost: parameter expressions, YAML aliases, error messages.

Pure: constants, `size` (what a value costs, estimated without walking all of a huge one) and
two helpers that keep text short (every rules error message goes through `cap`).
"""

from __future__ import annotations

import reprlib
from typing import Any

MAX_MESSAGE = 2_000  # characters of one error message (a problem, an expression error)
MAX_PROBLEMS = 100  # problems listed in one RulesError's text (all stay in `.problems`)
MAX_SOURCE = 2_000  # characters of one parameter expression
MAX_SIZE = 10_000  # characters of a string, or items (counted deep) of a list, a value may have
MAX_RANGE = 1_000  # items of range()
MAX_EXPONENT = 1_000  # |exponent| of an integer `**`
MAX_INT_BITS = 4_096  # bits of an integer result of `*` or `**` (about 1,233 digits)
MAX_ALIAS_NODES = 10_000  # YAML values that aliases (*name) may add to a document by expansion
MAX_NUMBER_CHARS = 40  # characters of a number written in YAML (underscores and signs included)
MAX_PATTERN = 1_000  # characters of a `matches` regular expression
MAX_ROUND = 100  # |precision| of the round filter (it computes 10 ** precision)


class _Repr(reprlib.Repr):
    """reprlib picks a method by the exact type name; subclasses (YAML's `Located` mappings,
    jinja2's `Markup`) would get a full repr. Dispatch by isinstance instead."""

    def repr1(self, x: Any, level: int) -> str:
        if isinstance(x, str):
            return self.repr_str(x, level)
        if isinstance(x, dict):
            return self.repr_dict(x, level)
        if isinstance(x, list):
            return self.repr_list(x, level)
        if isinstance(x, tuple):
            return self.repr_tuple(x, level)
        return super().repr1(x, level)


_REPR = _Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlevel = 2
_REPR.maxlong = 40


def cap(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text` if short enough, else its first `limit - 1` characters and "…"."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def show(value: Any) -> str:
    """A bounded repr for messages: never proportional to the size of `value`."""
    return _REPR.repr(value)


def size(value: Any, limit: int = MAX_SIZE) -> int:
    """About how many characters `value` prints as (strings, items of containers, digits),
    counted deep; stops once past `limit` (shared items count each time they appear)."""
    total, todo = 0, [value]
    while todo and total <= limit:
        item = todo.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, list | tuple | set | frozenset):
            total += 1
            todo.extend(item)
        elif isinstance(item, dict):
            total += 1
            todo.extend(item)
            todo.extend(item.values())
        elif isinstance(item, range):
            total += len(item)
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 1
        else:
            total += 1
    return total

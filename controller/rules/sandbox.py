"""The jinja2 sandbox rule parameters evaluate in: bounded in time and size, before the fact.

jinja2's ImmutableSandboxedEnvironment stops attribute tricks, not arithmetic: `10 ** 10 ** 9`
never ends (and jinja2 folds it at compile time: `check` itself hung), `'x' * 10 ** 11` asks for
100 GB, `lipsum(10 ** 6)` takes a minute. Here every operation that can grow its result is
checked against the sizes of its operands *before* it runs (limits in `controller.rules.limits`):

- `**`, `*`, `+` and `%` are intercepted, and so never folded at compile time: an integer
  exponent over MAX_EXPONENT, an integer over MAX_INT_BITS, a string or list over MAX_SIZE, a
  `%` format whose widths add up over MAX_SIZE are refused;
- globals: only `range` (at most MAX_RANGE items) and `dict`; lipsum, cycler, joiner and
  namespace are gone;
- filters that take a width, a count or a precision (center, indent, batch, slice, tojson,
  round) or that multiply their input (format, join, replace) are bounded; sum adds numbers
  only; wordwrap, urlize, pprint, xmlattr and random (no rule needs them; random is not even
  deterministic) are gone;
- calls: only the methods in `_METHODS` (of strings, dicts, lists, numbers); `str.format` is
  not one of them.

A refusal raises `LimitError` (a jinja2 `SecurityError`); `controller.rules.expr.static_problem`
applies the same checks to the constant parts of an expression at load time.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.filters import make_attrgetter
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import pass_environment, pass_eval_context

from controller.rules.limits import (
    MAX_EXPONENT,
    MAX_INT_BITS,
    MAX_RANGE,
    MAX_ROUND,
    MAX_SIZE,
    show,
    size,
)


class LimitError(SecurityError):
    """An expression would go over one of the bounds in `controller.rules.limits`."""


def _over(what: str, value: Any, limit: int = MAX_SIZE) -> None:
    if size(value, limit) > limit:
        raise LimitError(f"{what} would be over {limit} characters or items")


# -- operators --------------------------------------------------------------------------------


def check_pow(base: Any, exp: Any) -> None:
    """`base` may be None: not known yet (checking at load time)."""
    if isinstance(exp, int) and abs(exp) > MAX_EXPONENT:
        raise LimitError(f"** with an exponent over {MAX_EXPONENT} ({show(exp)})")
    bits = abs(base).bit_length() * exp if isinstance(base, int) and isinstance(exp, int) else 0
    if bits > MAX_INT_BITS:
        raise LimitError(f"{show(base)} ** {exp} would be over {MAX_INT_BITS} bits")


def _check_mul(left: Any, right: Any) -> None:
    if isinstance(left, int) and not isinstance(right, int):
        left, right = right, left
    if not isinstance(right, int):
        return
    if isinstance(left, str | list | tuple) and size(left) * max(right, 0) > MAX_SIZE:
        raise LimitError(f"repeating a {type(left).__name__} {right} times would be over "
                         f"{MAX_SIZE} characters or items")  # fmt: skip
    if isinstance(left, int) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
        raise LimitError(f"a product of integers over {MAX_INT_BITS} bits")


def _check_add(left: Any, right: Any) -> None:
    if isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple):
        _over("the sum", [left, right])


_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d*))?")


def check_format(fmt: str, args: Any = ()) -> None:
    """A `%` format: its widths and precisions plus its arguments stay under MAX_SIZE."""
    total = len(fmt) + size(args)
    for spec in _SPEC.finditer(fmt):
        for number in spec.groups():
            if number == "*":
                raise LimitError("a '*' width or precision in a % format")
            total += int(number) if number and len(number) < 7 else MAX_SIZE + 1 if number else 0
    if total > MAX_SIZE:
        raise LimitError(f"a % format whose widths and values add up to over {MAX_SIZE}")


def check_binop(op: str, left: Any, right: Any) -> None:
    if op == "**":
        check_pow(left, right)
    elif op == "*":
        _check_mul(left, right)
    elif op == "+":
        _check_add(left, right)
    elif op == "%" and isinstance(left, str):
        check_format(left, right)


# -- globals, methods -------------------------------------------------------------------------


def bounded_range(*args: int) -> range:
    items = range(*args)
    try:
        if len(items) <= MAX_RANGE:
            return items
    except OverflowError:
        pass
    raise LimitError(f"range() of over {MAX_RANGE} items")


def _width(args: tuple[Any, ...], kwargs: dict[str, Any], name: str = "width") -> None:
    width = args[0] if args else kwargs.get(name, 0)
    if isinstance(width, int) and width > MAX_SIZE:
        raise LimitError(f"a {name} over {MAX_SIZE} ({show(width)})")


def _joined(sep: str, items: list[Any]) -> None:
    if len(sep) * max(len(items) - 1, 0) + size(items) > MAX_SIZE:
        raise LimitError(f"the joined text would be over {MAX_SIZE} characters")


def _replaced(text: str, old: Any, new: Any, count: Any) -> None:
    if isinstance(old, str) and isinstance(new, str):
        hits = text.count(old) if old else len(text) + 1
        if isinstance(count, int) and count >= 0:
            hits = min(hits, count)
        if len(text) + hits * len(new) > MAX_SIZE:
            raise LimitError(f"the replaced text would be over {MAX_SIZE} characters")


_STR = frozenset({
    "capitalize", "casefold", "count", "endswith", "find", "index", "isalnum", "isalpha",
    "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric", "isspace",
    "istitle", "isupper", "lower", "lstrip", "partition", "removeprefix", "removesuffix", "rfind",
    "rindex", "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip",
    "swapcase", "title", "upper", "center", "ljust", "rjust", "zfill", "join", "replace",
})  # fmt: skip
_METHODS: tuple[tuple[type | tuple[type, ...], frozenset[str]], ...] = (
    (str, _STR),
    (dict, frozenset({"get", "keys", "values", "items"})),
    ((list, tuple, range), frozenset({"count", "index"})),
    ((int, float), frozenset({"bit_length", "is_integer"})),
)
METHOD_NAMES = frozenset().union(*(names for _, names in _METHODS))


def check_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Refuse a call that is not allowed or would go over a bound; the arguments to call with
    (an iterable to join is read once, here)."""
    if func is bounded_range or func is dict:
        return args
    owner = getattr(func, "__self__", None)
    name = str(getattr(func, "__name__", type(func).__name__))
    bound = isinstance(func, types.BuiltinMethodType | types.MethodType)
    allowed = next((names for kind, names in _METHODS if isinstance(owner, kind)), frozenset())
    if not bound or name not in allowed:
        raise SecurityError(f"calling {name}() is not allowed in rule expressions")
    if name in ("center", "ljust", "rjust", "zfill"):
        _width(args, kwargs)
    elif name == "join" and args:
        args = (list(args[0]), *args[1:])
        _joined(str(owner), args[0])
    elif name == "replace" and len(args) >= 2:
        _replaced(str(owner), args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count"))
    return args


# -- filters ----------------------------------------------------------------------------------

_DROPPED = frozenset({"wordwrap", "urlize", "pprint", "xmlattr", "random"})


def _count(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    _width(args, kwargs, "count")


def _json_indent(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    indent = args[0] if args else kwargs.get("indent")
    if indent is not None and not (isinstance(indent, int) and 0 <= indent <= 8):
        raise LimitError(f"a tojson indent other than 0 to 8 ({show(indent)})")


def _precision(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    precision = args[0] if args else kwargs.get("precision", 0)
    if isinstance(precision, int) and abs(precision) > MAX_ROUND:
        raise LimitError(f"a round precision beyond +-{MAX_ROUND} ({show(precision)})")


# filter -> check of its arguments alone (the value may not be known at load time)
FILTER_ARGS: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], None]] = {
    "center": _width, "indent": _width, "batch": _count, "slice": _count, "tojson": _json_indent,
    "round": _precision,
}  # fmt: skip


def _center(value: Any, width: int = 80) -> str:
    _width((width,), {})
    return jinja2.filters.do_center(value, width)


def _indent(s: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    _width((width,), {})
    text, pad = str(s), width if isinstance(width, int) else len(str(width))
    if len(text) + (text.count("\n") + 1) * max(pad, 0) > MAX_SIZE:
        raise LimitError(f"the indented text would be over {MAX_SIZE} characters")
    return jinja2.filters.do_indent(text, width, first, blank)


def _format(value: Any, *args: Any, **kwargs: Any) -> str:
    check_format(str(value), kwargs or args)
    return jinja2.filters.do_format(value, *args, **kwargs)


@pass_eval_context
def _join(ctx: nodes.EvalContext, value: Any, d: str = "", attribute: Any = None) -> str:
    items = list(value)
    if attribute is not None:
        items = list(map(make_attrgetter(ctx.environment, attribute), items))
    _joined(str(d), items)
    return jinja2.filters.sync_do_join(ctx, items, d)


@pass_eval_context
def _replace(ctx: nodes.EvalContext, s: Any, old: str, new: str, count: int | None = None) -> str:
    _replaced(str(s), old, new, count)
    return jinja2.filters.do_replace(ctx, s, old, new, count)


def _batch(value: Any, linecount: int, fill_with: Any = None) -> Any:
    _count((linecount,), {})
    return jinja2.filters.do_batch(value, linecount, fill_with)


def _slice(value: Any, slices: int, fill_with: Any = None) -> Any:
    _count((slices,), {})
    return jinja2.filters.sync_do_slice(value, slices, fill_with)


@pass_eval_context
def _tojson(ctx: nodes.EvalContext, value: Any, indent: int | None = None) -> Any:
    _json_indent((indent,), {})
    return jinja2.filters.do_tojson(ctx, value, indent)


@pass_environment
def _sum(env: jinja2.Environment, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    items = list(iterable)
    if attribute is not None:
        items = list(map(make_attrgetter(env, attribute), items))
    if not all(isinstance(x, int | float) for x in [start, *items]):
        raise LimitError("sum of something other than numbers")
    return sum(items, start)


def _round(value: float, precision: int = 0, method: str = "common") -> float:
    _precision((precision,), {})
    return jinja2.filters.do_round(value, precision, method)  # type: ignore[arg-type]


_BOUNDED: dict[str, Callable[..., Any]] = {
    "center": _center, "indent": _indent, "format": _format, "join": _join, "replace": _replace,
    "batch": _batch, "slice": _slice, "tojson": _tojson, "sum": _sum, "round": _round,
}  # fmt: skip


# -- the environment --------------------------------------------------------------------------


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """Strict about undefined names, no autoescaping, and bounded as the module says."""

    intercepted_binops = frozenset({"**", "*", "+", "%"})  # also: never folded at compile time

    def __init__(self) -> None:
        super().__init__(undefined=jinja2.StrictUndefined, autoescape=False, optimized=False)
        self.globals.clear()
        self.globals.update(range=bounded_range, dict=dict)
        kept = {name: f for name, f in self.filters.items() if name not in _DROPPED}
        self.filters = {**kept, **_BOUNDED}

    def call_binop(self, context: Context | None, op: str, left: Any, right: Any) -> Any:
        check_binop(op, left, right)
        return self.binop_table[op](left, right)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        return context.call(obj, *check_call(obj, args, kwargs), **kwargs)

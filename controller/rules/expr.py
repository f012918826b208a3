"""Parameter expressions of rules: jinja2, sandboxed, strict about undefined names, bounded.

A value that is exactly one `{{ ... }}` evaluates to a native value (an int stays an int);
a string with `{{` elsewhere renders to a string; anything else is a literal. Pure: no I/O.

Evaluation is bounded in time and size by `controller.rules.sandbox` (refused before it would run
over a limit); `{% ... %}` statements (loops) are not allowed; a result over MAX_SIZE is an
error; any failure, MemoryError and RecursionError included, is an `ExprError`. At load time
the constant parts of an expression are evaluated with the same checks, so an expression every
evaluation would refuse is refused by `fleetgate check`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.exceptions import SecurityError

from controller.rules.limits import MAX_SIZE, MAX_SOURCE, cap, size
from controller.rules.sandbox import (
    FILTER_ARGS,
    METHOD_NAMES,
    BoundedSandbox,
    check_call,
    check_format,
    check_pow,
)

_WHOLE = re.compile(r"^\s*\{\{(.*)\}\}\s*$", re.DOTALL)
_ENV = BoundedSandbox()
_UNKNOWN: Any = object()  # a value only known at evaluation time


class ExprError(ValueError):
    """An expression does not parse or does not evaluate (the message is capped)."""

    def __init__(self, message: str) -> None:
        super().__init__(cap(message))


@dataclass(frozen=True)
class Expr:
    source: Any
    names: frozenset[str]  # top-level variables it reads
    settings: frozenset[str] = frozenset()  # `settings.NAME` it reads with no fallback

    def evaluate(self, context: dict[str, Any]) -> Any:
        if not isinstance(self.source, str) or "{{" not in self.source:
            return self.source
        try:
            whole = _WHOLE.match(self.source)
            if whole and "}}" not in whole.group(1):
                return _result(_expression(whole.group(1))(context))
            return _result(_template(self.source).render(context))
        except jinja2.TemplateError as exc:
            raise ExprError(f"{self.source!r}: {exc}") from exc
        except Exception as exc:  # an operator's expression: a rule error, never a crashed tick
            raise ExprError(f"{self.source!r}: {type(exc).__name__}: {exc}") from exc


def _result(value: Any) -> Any:
    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined: raises UndefinedError naming what is missing
    if size(value) > MAX_SIZE:
        raise SecurityError(f"the result is over {MAX_SIZE} characters or items")
    return value


@functools.lru_cache(maxsize=2048)
def _expression(source: str) -> Any:
    """Compiled once per distinct expression (a rule's parameters evaluate every tick)."""
    return _ENV.compile_expression(source, undefined_to_none=False)


@functools.lru_cache(maxsize=2048)
def _template(source: str) -> jinja2.Template:
    return _ENV.from_string(source)


def compile_expr(value: Any) -> Expr:
    """Parse `value` once; raise ExprError for bad syntax or an expression over a bound."""
    if not isinstance(value, str) or "{{" not in value:
        return Expr(value, frozenset())
    if len(value) > MAX_SOURCE:
        raise ExprError(f"expression {value[:40]!r}... is {len(value)} characters long "
                        f"(at most {MAX_SOURCE})")  # fmt: skip
    try:
        whole = _WHOLE.match(value)
        source = "{{" + whole.group(1) + "}}" if whole and "}}" not in whole.group(1) else value
        ast = _ENV.parse(source)
        problem = static_problem(ast) or field_problem(ast)
        if problem:
            raise ExprError(f"expression {value!r}: {problem}")
        if source is value:
            _ENV.from_string(value)  # compiling checks filters and tests too
        else:
            _ENV.compile_expression(source[2:-2])
        names = frozenset(meta.find_undeclared_variables(ast))
        read = frozenset(settings_read(ast))
    except jinja2.TemplateError as exc:
        raise ExprError(f"bad expression {value!r}: {exc.message or exc}") from exc
    except (RecursionError, MemoryError) as exc:
        raise ExprError(f"bad expression {value[:60]!r}: nested too deeply") from exc
    return Expr(value, names, read)


# -- load-time checks: evaluate what is constant ----------------------------------------------


def field_problem(ast: nodes.Template) -> str | None:
    """A field a fact of that kind never has (`instance.idd`): it would fail every tick."""
    from controller.core.facts import FIELDS

    for node in ast.find_all(nodes.Getattr):
        if isinstance(node.node, nodes.Name) and node.node.name in FIELDS:
            kind = node.node.name
            if node.attr not in FIELDS[kind]:
                known = ", ".join(sorted(FIELDS[kind]))
                return (
                    f"unknown field {node.attr[:40]!r} for {kind} facts (expected one of {known})"
                )
    return None


_FALLBACK_FILTERS = ("default", "d")
_PRESENCE_TESTS = ("defined", "undefined", "none")


def settings_read(ast: nodes.Node) -> set[str]:
    """The names of `settings.NAME` (or `settings['NAME']`) read where a missing one is an error:
    not under `| default(...)`, not `settings.get('NAME')`, and not tested anywhere in the
    expression with `is defined` (`settings.x if settings.x is defined else 1`). Which names
    the rules define is known only once every file is read (`controller.rules.settings`)."""
    read: set[str] = set()
    guarded: set[str] = set()
    for name, safe in _setting_uses(ast):
        (guarded if safe else read).add(name)
    return read - guarded


def _setting_uses(node: nodes.Node, guarded: bool = False) -> Iterator[tuple[str, bool]]:
    if isinstance(node, nodes.Filter) and node.name in _FALLBACK_FILTERS:
        guarded_child: nodes.Node | None = node.node
    elif isinstance(node, nodes.Test) and node.name in _PRESENCE_TESTS:
        guarded_child = node.node
    else:
        guarded_child = None
    name = _setting_name(node)
    if name is not None:
        yield name, guarded
        return
    callee = node.node if isinstance(node, nodes.Call) else None
    if (
        isinstance(node, nodes.Call)
        and isinstance(callee, nodes.Getattr)
        and _is_settings(callee.node)
    ):
        # `settings.get(...)`: a method of the mapping, not a setting
        for child in [*node.args, *node.kwargs]:
            yield from _setting_uses(child)
        return
    for child in node.iter_child_nodes():
        yield from _setting_uses(child, child is guarded_child)


def _is_settings(node: nodes.Node) -> bool:
    return isinstance(node, nodes.Name) and node.name == "settings"


def _setting_name(node: nodes.Node) -> str | None:
    if isinstance(node, nodes.Getattr) and _is_settings(node.node):
        return str(node.attr)
    if (
        isinstance(node, nodes.Getitem)
        and _is_settings(node.node)
        and isinstance(node.arg, nodes.Const)
        and isinstance(node.arg.value, str)
    ):
        return node.arg.value
    return None


def static_problem(ast: nodes.Template) -> str | None:
    """Why every evaluation of `ast` would be refused, if its constant parts show it."""
    outputs = [node for node in ast.body if isinstance(node, nodes.Output)]
    if len(outputs) < len(ast.body):
        return "only {{ ... }} expressions are allowed, not {% ... %} statements"
    try:
        for output in outputs:
            parts = [_fold(child) for child in output.nodes]
            if _UNKNOWN not in parts and sum(size(p) for p in parts) > MAX_SIZE:
                return f"the result is over {MAX_SIZE} characters or items"
    except SecurityError as exc:
        return str(exc)
    return None


def _apply(func: Callable[..., Any], *values: Any) -> Any:
    """`func(*values)` when all are known; unknown when it fails (only at evaluation time will
    that failure be reported), except for a refusal, which is final."""
    if any(v is _UNKNOWN for v in values):
        return _UNKNOWN
    try:
        return func(*values)
    except SecurityError:
        raise
    except Exception:
        return _UNKNOWN


def _fold(node: nodes.Node) -> Any:
    """The value of `node` if constant, else _UNKNOWN; raises SecurityError for a refusal."""
    if isinstance(node, nodes.Const):
        return node.value
    if isinstance(node, nodes.TemplateData):
        return node.data
    if isinstance(node, nodes.List | nodes.Tuple):
        items = [_fold(n) for n in node.items]
        return _apply(lambda *i: list(i) if isinstance(node, nodes.List) else i, *items)
    if isinstance(node, nodes.BinExpr):
        return _binop(node.operator, _fold(node.left), _fold(node.right))
    if isinstance(node, nodes.Neg | nodes.Pos):
        return _apply(_ENV.unop_table[node.operator], _fold(node.node))
    if isinstance(node, nodes.Filter):
        return _filter(node)
    if isinstance(node, nodes.Call):
        return _call(node)
    if isinstance(node, nodes.Name) and node.name in _ENV.globals:
        return _ENV.globals[node.name]
    if isinstance(node, nodes.Getattr):
        return _apply(lambda obj: _ENV.getattr(obj, node.attr), _fold(node.node))
    for child in node.iter_child_nodes():  # not evaluated here: check the constants inside
        _fold(child)
    return _UNKNOWN


def _binop(op: str, left: Any, right: Any) -> Any:
    if left is _UNKNOWN and op == "**":
        check_pow(None, right)  # the exponent alone may be over the bound
    if right is _UNKNOWN and op == "%" and isinstance(left, str):
        check_format(left)  # so may the widths of a format
    return _apply(lambda a, b: _ENV.call_binop(None, op, a, b), left, right)


def _arguments(node: nodes.Filter | nodes.Call) -> tuple[list[Any], dict[str, Any]] | None:
    args = [_fold(a) for a in node.args]
    kwargs = {str(kw.key): _fold(kw.value) for kw in node.kwargs}
    dynamic = [_fold(n) for n in (node.dyn_args, node.dyn_kwargs) if n is not None]
    if dynamic or _UNKNOWN in args or _UNKNOWN in kwargs.values():
        return None
    return args, kwargs


def _filter(node: nodes.Filter) -> Any:
    value = _fold(node.node) if node.node is not None else _UNKNOWN
    known = _arguments(node)
    if known is None:
        return _UNKNOWN
    args, kwargs = known
    if node.name in FILTER_ARGS:
        FILTER_ARGS[node.name](tuple(args), kwargs)
    return _apply(lambda v: _ENV.call_filter(node.name, v, args, kwargs), value)


def _call(node: nodes.Call) -> Any:
    callee = node.node
    if isinstance(callee, nodes.Name) and callee.name not in _ENV.globals:
        raise SecurityError(f"unknown function {callee.name}() (expressions may call range() "
                            "and dict(), and methods of strings, lists and dicts)")  # fmt: skip
    if isinstance(callee, nodes.Getattr) and callee.attr not in METHOD_NAMES:
        raise SecurityError(f"calling {callee.attr}() is not allowed in rule expressions")
    func, known = _fold(callee), _arguments(node)
    if func is _UNKNOWN or known is None:
        return _UNKNOWN
    args, kwargs = known
    checked = check_call(func, tuple(args), kwargs)
    return _apply(lambda: func(*checked, **kwargs))

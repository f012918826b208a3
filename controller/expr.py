"""Parameter expressions of rules: jinja2, sandboxed, strict about undefined names.

A value that is exactly one `{{ ... }}` evaluates to a native value (an int stays an int);
a string with `{{` elsewhere renders to a string; anything else is a literal. Pure: no I/O.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

_WHOLE = re.compile(r"^\s*\{\{(.*)\}\}\s*$", re.DOTALL)
_ENV = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False)


class ExprError(ValueError):
    """An expression does not parse or does not evaluate."""


@dataclass(frozen=True)
class Expr:
    source: Any
    names: frozenset[str]  # top-level variables it reads

    def evaluate(self, context: dict[str, Any]) -> Any:
        if not isinstance(self.source, str) or "{{" not in self.source:
            return self.source
        try:
            whole = _WHOLE.match(self.source)
            if whole and "}}" not in whole.group(1):
                return _expression(whole.group(1))(context)
            return _template(self.source).render(context)
        except jinja2.TemplateError as exc:
            raise ExprError(f"{self.source!r}: {exc}") from exc
        except (TypeError, ValueError, ZeroDivisionError, ArithmeticError) as exc:
            raise ExprError(f"{self.source!r}: {type(exc).__name__}: {exc}") from exc


@functools.lru_cache(maxsize=2048)
def _expression(source: str) -> Any:
    """Compiled once per distinct expression (a rule's parameters evaluate every tick)."""
    return _ENV.compile_expression(source, undefined_to_none=False)


@functools.lru_cache(maxsize=2048)
def _template(source: str) -> jinja2.Template:
    return _ENV.from_string(source)


def compile_expr(value: Any) -> Expr:
    """Parse `value` once; raise ExprError for bad syntax."""
    if not isinstance(value, str) or "{{" not in value:
        return Expr(value, frozenset())
    try:
        whole = _WHOLE.match(value)
        if whole and "}}" not in whole.group(1):
            ast = _ENV.parse("{{" + whole.group(1) + "}}")
            _ENV.compile_expression(whole.group(1))
        else:
            ast = _ENV.parse(value)
            _ENV.from_string(value)  # compiling checks filters and tests too
        names = frozenset(meta.find_undeclared_variables(ast))
    except jinja2.TemplateError as exc:
        raise ExprError(f"bad expression {value!r}: {exc.message or exc}") from exc
    return Expr(value, names)

"""Render escalation templates: one sandboxed jinja2 environment, operator overrides first.

Every human message and (later) the LLM prompt is rendered here, from a template in the
operator's override folder if it has one of that name, else from `escalation/templates/`.
Rendering is deterministic: the same template and context give byte-identical text.

This module must NOT read the clock, send anything, or decide anything; it reads template files
and nothing else. A missing variable, a missing template or a template error is a RenderError
naming the template.

Filters available to templates, besides jinja2's own:
    tojson   JSON with sorted keys (`indent=` optional); not HTML-escaped
    kv       a mapping as `key=value key=value` (logfmt-like, insertion order)
    value    one value as kv writes it: bare word, or JSON-quoted string, or compact JSON
    iso      epoch seconds as "2024-05-01T12:00:00Z" (strings pass through)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import (
    BaseLoader,
    ChoiceLoader,
    FileSystemLoader,
    PackageLoader,
    StrictUndefined,
    TemplateError,
    TemplateNotFound,
    TemplateSyntaxError,
)
from jinja2.sandbox import SandboxedEnvironment

# Strings made only of these characters are written bare by `kv`; others are JSON-quoted.
_BARE = re.compile(r"[A-Za-z0-9_.:/@+\-]+\Z")


class RenderError(Exception):
    """A template could not be rendered (missing variable, missing template, syntax error)."""


def iso8601(ts: float | str) -> str:
    """Epoch seconds as an ISO 8601 UTC timestamp to the second; a string is returned as is."""
    if isinstance(ts, str):
        return ts
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise TypeError(f"iso: expected epoch seconds or a string, got {ts!r}")
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def to_json(value: Any, indent: int | None = None) -> str:
    """Deterministic JSON: sorted keys, sets sorted, unknown objects as their str()."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, indent=indent, default=_default)


def format_value(value: Any) -> str:
    """One value for a `key=value` line: a bare word, a JSON-quoted string, or compact JSON."""
    if isinstance(value, str):
        return value if _BARE.match(value) else json.dumps(value, ensure_ascii=False)
    return json.dumps(
        value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=_default
    )


LEADING = ("kind", "id", "label")  # what a fact is, first, however it was stored


def format_kv(mapping: Mapping[str, Any]) -> str:
    """A mapping as `key=value key=value` in its own order; a fact's `LEADING` keys first (one
    read back from the journal has its keys sorted: `id` fell mid-line)."""
    if not isinstance(mapping, Mapping):
        raise TypeError(f"kv: expected a mapping, got {mapping!r}")
    if "kind" not in mapping:  # not a fact: its own order
        return " ".join(f"{key}={format_value(value)}" for key, value in mapping.items())
    keys = [k for k in LEADING if k in mapping] + [k for k in mapping if k not in LEADING]
    return " ".join(f"{key}={format_value(mapping[key])}" for key in keys)


def _default(value: Any) -> Any:
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    return str(value)


class Renderer:
    """Templates by name, the operator's override folder winning over the packaged ones."""

    def __init__(self, override_dir: str | Path | None = None) -> None:
        loaders: list[BaseLoader] = []
        self._override_dir = None if override_dir is None else Path(override_dir)
        if self._override_dir is not None:
            if not self._override_dir.is_dir():
                raise RenderError(
                    f"template override folder {str(self._override_dir)!r} is not a directory"
                )
            loaders.append(FileSystemLoader(self._override_dir))
        loaders.append(PackageLoader("escalation", "templates"))
        self._env = SandboxedEnvironment(
            loader=ChoiceLoader(loaders),
            undefined=StrictUndefined,
            autoescape=False,
            keep_trailing_newline=True,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self._env.filters["tojson"] = to_json
        self._env.filters["kv"] = format_kv
        self._env.filters["value"] = format_value
        self._env.filters["iso"] = iso8601

    def render(self, name: str, /, **context: Any) -> str:
        """Render template `name` with `context`; any failure is a RenderError naming it."""
        try:
            return self._env.get_template(name).render(**context)
        except TemplateNotFound as exc:
            raise RenderError(f"template {name!r} not found in {self._where()}") from exc
        except TemplateSyntaxError as exc:
            where = exc.filename or exc.name or name
            raise RenderError(f"template {name!r}: {where}:{exc.lineno}: {exc.message}") from exc
        except (TemplateError, TypeError, ValueError, ArithmeticError) as exc:
            raise RenderError(f"template {name!r}: {exc}") from exc

    def origin(self, name: str) -> str:
        """The file template `name` would be loaded from (to explain which one wins)."""
        try:
            template = self._env.get_template(name)
        except TemplateNotFound as exc:
            raise RenderError(f"template {name!r} not found in {self._where()}") from exc
        except TemplateError as exc:
            raise RenderError(f"template {name!r}: {exc}") from exc
        return template.filename or name

    def _where(self) -> str:
        if self._override_dir is None:
            return "the packaged templates"
        return f"{str(self._override_dir)!r} or the packaged templates"

"""pydantic's validation errors of a config file, as lines an operator reads.

Each error becomes `file:line: key: problem`, the line found in the YAML document (which
remembers where each key and list item came from). Unknown keys list the keys expected there,
an unknown channel lists the channel types there are, and a check across sections is reported
at the choice it is about (`provider` or `demand`).
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr, ValidationError
from pydantic_core import ErrorDetails

from controller.rules.yamlsrc import Located, LocatedList

_UNION_STEP = re.compile(r"^(literal|tagged-union|function-\w+|union)\[")
_CHANNELS = ("escalation", "channels")
_SECRET_KEYS = ("env", "file")


class ConfigError(ValueError):
    """The config is invalid; the message lists `file:line: key: problem` lines (`file: key:
    problem` for what only building its parts shows)."""


@contextmanager
def building(path: str | None, key: str, *kinds: type[Exception]) -> Iterator[None]:
    """A ValueError (or one of `kinds`) raised while building what config key `key` describes,
    as a one-line ConfigError naming the config file and the key."""
    caught: tuple[type[Exception], ...] = (ValueError, *kinds)
    try:
        yield
    except ConfigError:
        raise
    except caught as exc:
        raise ConfigError(f"{path or '(the defaults)'}: {key}: {_one_line(exc)}") from exc


def _one_line(exc: Exception) -> str:
    if isinstance(exc, ValidationError):  # its text shows the input, which may be a secret
        return "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
    return " ".join(str(exc).split()) or type(exc).__name__


def describe(
    path: str, doc: Any, exc: ValidationError, root: type[BaseModel],
    channels: Mapping[str, type[BaseModel]], names: tuple[str, ...],
) -> str:  # fmt: skip
    """The errors of validating `doc` (read from `path`) as `root`, one line each.

    `channels` maps each channel type to its settings model and `names` are the channels
    written as a plain name (console, file).
    """
    found: dict[tuple[int, str], list[str]] = {}
    for err in exc.errors():
        raw = tuple(err["loc"])
        if _redundant(err, raw):
            continue
        loc = _location(raw, channels)
        msg = _message(err, raw, loc, root, channels, names)
        choice = next((k for k in ("provider", "demand") if k in doc), None)
        if not loc and isinstance(doc, Located) and choice:
            loc = (choice,)  # the cross-section checks are about the choice made there
        key = ".".join(str(p) for p in loc) or "config"
        found.setdefault((line_for(doc, loc), key), []).append(msg)
    return "\n".join(
        f"{path}:{line}: {key}: {'; or '.join(dict.fromkeys(msgs))}"
        for (line, key), msgs in found.items()
    )


def _is_channel(raw: tuple[Any, ...]) -> bool:
    return raw[:2] == _CHANNELS and len(raw) > 2 and isinstance(raw[2], int)


def _redundant(err: ErrorDetails, raw: tuple[Any, ...]) -> bool:
    """An error of the union branch the input was not meant for (a channel entry is a name or
    a mapping: the other branch's complaint says nothing)."""
    if not _is_channel(raw) or len(raw) != 4:
        return False
    if err["type"] == "literal_error":
        return isinstance(err.get("input"), dict)
    return err["type"] == "model_attributes_type" and isinstance(err.get("input"), str)


def _location(raw: tuple[Any, ...], channels: Mapping[str, type[BaseModel]]) -> tuple[Any, ...]:
    """`raw` without union steps and without the channel type pydantic puts after an index."""
    steps = [p for p in raw if not _UNION_STEP.match(str(p))]
    return tuple(
        p
        for i, p in enumerate(steps)
        if not (p in channels and i and isinstance(steps[i - 1], int))
    )


def _message(
    err: ErrorDetails, raw: tuple[Any, ...], loc: tuple[Any, ...], root: type[BaseModel],
    channels: Mapping[str, type[BaseModel]], names: tuple[str, ...],
) -> str:  # fmt: skip
    kinds = ", ".join(sorted(channels))
    if _is_channel(raw) and err["type"] == "literal_error" and len(raw) == 4:
        return (f"unknown channel {err.get('input')!r} (expected {' or '.join(names)}, or a "
                f"mapping with type: one of {kinds})")  # fmt: skip
    if err["type"] == "union_tag_invalid":
        tag = (err.get("ctx") or {}).get("tag")
        return f"unknown channel type {tag!r} (expected one of {kinds})"
    if err["type"] == "extra_forbidden":
        tag = next((p for p in raw if p in channels), None) if _is_channel(raw) else None
        if tag is not None and len(loc) == 4:
            keys = sorted(channels[tag].model_fields)
        else:
            keys = keys_at(root, loc[:-1])
        return f"unknown key (expected one of {', '.join(keys)})" if keys else "unknown key"
    msg = err["msg"].removeprefix("Value error, ")
    if loc and loc[-1] == "[key]":
        return f"unknown name: {msg}"
    given = err.get("input")
    seconds = any(str(p).endswith("_s") for p in loc[-2:])  # cooldowns_s.reboot too
    if seconds and err["type"] in ("float_type", "int_type") and isinstance(given, str):
        how = "write it without quotes" if _numeric(given) else "10 minutes is 600"
        return f"{msg} of seconds, got the text {given!r} ({how})"  # `10m`, `10 minutes`
    return msg


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def line_for(doc: Any, loc: tuple[Any, ...]) -> int:
    """The line of the value at `loc` in the YAML document (the nearest known one)."""
    line = getattr(doc, "line", 1)
    node = doc
    for part in loc:
        if isinstance(node, Located) and isinstance(part, str) and part in node:
            line = node.line_of(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            if isinstance(node, LocatedList):
                line = node.item_lines[part]
            node = node[part]
            line = getattr(node, "line", line)
        else:
            break
    return int(line)


def keys_at(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys the model accepts at `loc` (for 'unknown key' messages); [] when unknown."""
    kind: Any = root
    for part in loc:
        fields = getattr(kind, "model_fields", None)
        if not isinstance(part, str) or fields is None or part not in fields:
            return []
        kind = _plain(fields[part].annotation)
    if kind is SecretStr:
        return list(_SECRET_KEYS)
    return sorted(getattr(kind, "model_fields", {}))


def _plain(annotation: Any) -> Any:
    """`X` for `X`, `X | None` and `Annotated[X, ...]`; None for anything else."""
    if get_origin(annotation) is Annotated:
        return _plain(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        kinds = [a for a in get_args(annotation) if a is not type(None)]
        return _plain(kinds[0]) if len(kinds) == 1 else None
    return annotation if isinstance(annotation, type) else None

"""YAML that remembers where each value came from, for `file:line` errors.

Mappings load as `Located` dicts that know their own line and each key's line.
"""

from __future__ import annotations

from typing import Any

import yaml


class Located(dict[str, Any]):
    """A mapping from a YAML file with `line` (1-based) and `key_lines`."""

    line: int = 0
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)


class LocatedList(list[Any]):
    line: int = 0
    item_lines: list[int]


class _Loader(yaml.SafeLoader):
    pass


def _mapping(loader: _Loader, node: yaml.MappingNode) -> Located:
    loader.flatten_mapping(node)
    out = Located()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            key = str(key)
        if key in out:
            raise yaml.MarkedYAMLError(
                "while loading a mapping", node.start_mark, f"duplicate key {key!r}",
                key_node.start_mark,
            )  # fmt: skip
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


def _sequence(loader: _Loader, node: yaml.SequenceNode) -> LocatedList:
    out = LocatedList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence)


class YamlError(ValueError):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


def load(text: str) -> Any:
    """Parse YAML text; a syntax error becomes YamlError with its line."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise YamlError(line, f"invalid YAML: {exc.problem or exc.context}") from exc
    except yaml.YAMLError as exc:
        raise YamlError(1, f"invalid YAML: {exc}") from exc

"""YAML that remembers where each value came from, for `file:line` errors.

Mappings load as `Located` dicts that know their own line and each key's line. Aliases
(`*name`) may add at most `MAX_ALIAS_NODES` values to a document by expansion: a few hundred
bytes of nested aliases ("billion laughs") would otherwise expand to gigabytes wherever the
loaded value is walked or printed. A number is written in at most `MAX_NUMBER_CHARS`
characters: Python refuses to read an integer of over 4,300 digits, and one of over 308 is
beyond every float it is compared with.
"""

from __future__ import annotations

from typing import Any

import yaml

from controller.rules.limits import MAX_ALIAS_NODES, MAX_NUMBER_CHARS, cap


class Located(dict[str, Any]):
    """A mapping from a YAML file with `line` (1-based) and `key_lines`."""

    line: int = 0
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)


class LocatedList(list[Any]):
    line: int = 0
    item_lines: list[int]


def _expanded(node: yaml.Node, limit: int) -> int:
    """How many values `node` stands for once its aliases are expanded; stops past `limit`
    (so a cycle, or a huge expansion, costs at most `limit` steps)."""
    count, todo = 0, [node]
    while todo and count <= limit:
        item = todo.pop()
        count += 1
        if isinstance(item, yaml.SequenceNode):
            todo.extend(item.value)
        elif isinstance(item, yaml.MappingNode):
            todo.extend(n for pair in item.value for n in pair)
    return count


class _Loader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.alias_values = 0  # values aliases added so far

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) and event.anchor in self.anchors:
            left = MAX_ALIAS_NODES - self.alias_values
            self.alias_values += _expanded(self.anchors[event.anchor], left)
            if self.alias_values > MAX_ALIAS_NODES:
                raise yaml.composer.ComposerError(
                    None, None, f"aliases (*name) expand to more than {MAX_ALIAS_NODES} values "
                    "(write the values out)", event.start_mark,  # type: ignore[arg-type]
                )  # fmt: skip
        return super().compose_node(parent, index)


def _number(kind: str) -> Any:
    """The SafeLoader's constructor for `kind` (int or float), for numbers of a bounded size."""
    base = yaml.SafeLoader.yaml_constructors[f"tag:yaml.org,2002:{kind}"]

    def construct(loader: _Loader, node: yaml.ScalarNode) -> Any:
        if len(str(node.value)) > MAX_NUMBER_CHARS:
            raise yaml.constructor.ConstructorError(
                None, None, f"a number of {len(str(node.value))} characters (at most "
                f"{MAX_NUMBER_CHARS})", node.start_mark,
            )  # fmt: skip
        return base(loader, node)

    return construct


def _mapping(loader: _Loader, node: yaml.MappingNode) -> Located:
    own = [k for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"]
    loader.flatten_mapping(node)  # merged (`<<: *base`) pairs first, then the node's own
    out = Located()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    seen_own: set[str] = set()
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            key = str(key)
        if key_node in own:
            if key in seen_own:
                raise yaml.MarkedYAMLError(
                    "while loading a mapping", node.start_mark, f"duplicate key {key!r}",
                    key_node.start_mark,
                )  # fmt: skip
            seen_own.add(key)
        out[key] = loader.construct_object(value_node, deep=True)  # own keys override merged
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


def _sequence(loader: _Loader, node: yaml.SequenceNode) -> LocatedList:
    out = LocatedList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence)
for _kind in ("int", "float"):
    _Loader.add_constructor(f"tag:yaml.org,2002:{_kind}", _number(_kind))


class YamlError(ValueError):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


def load(text: str) -> Any:
    """Parse YAML text; any problem becomes a one-line YamlError with its line."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        problem = " ".join(str(exc.problem or exc.context or "").split())
        if problem.startswith("but ") and exc.context:  # the half that says what was expected
            problem = " ".join(f"{exc.context} {problem}".split())
        unclosed = str(exc.context or "").startswith("while parsing a flow")
        if unclosed and exc.context_mark and exc.problem_mark and \
                exc.context_mark.line != exc.problem_mark.line:  # fmt: skip
            line = exc.context_mark.line + 1
            problem += f" ({exc.context} that starts here; the problem shows on line "
            problem += f"{exc.problem_mark.line + 1})"
        return _raise(line, f"invalid YAML: {problem}", exc)
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        what = f"character {chr(exc.character)!r}" if isinstance(exc.character, int) else "byte"
        return _raise(line, f"invalid YAML: special {what} is not allowed", exc)
    except RecursionError as exc:
        return _raise(1, "invalid YAML: nested too deeply", exc)
    except yaml.YAMLError as exc:
        return _raise(1, "invalid YAML: " + " ".join(str(exc).split()), exc)


def _raise(line: int, message: str, exc: BaseException) -> Any:
    raise YamlError(line, cap(message)) from exc

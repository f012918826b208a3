"""docs/config.md, the config reference: every key of the config file with its type, default and
meaning, generated from the pydantic models that load it (controller/service/config.py and the
section models it names). `tests/test_config_reference.py` fails when the file is stale.

    python -m controller.tools.config_reference            # rewrite docs/config.md
    python -m controller.tools.config_reference --check    # exit 1 if it is stale
    python -m controller.tools.config_reference --stdout   # print it

An installed copy has no docs/ to rewrite: outside a source tree (no pyproject.toml beside
docs/) it prints the reference unless --output names a file.

A key's meaning is its field's `description`, else the comment on the field's own lines in its
model's source, else `MEANINGS` below (for models whose fields carry neither); a key with none
of them is an error, so a new setting cannot go undocumented.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import json
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from controller.service.config import Config, SimSection
from controller.sim.agents import AgentSettings
from controller.sim.config import SimConfig

TREE = Path(__file__).resolve().parents[2]
DOC = TREE / "docs" / "config.md"

# Mappings validated against a model of their own (their validators in config.py).
VALIDATED_AS: dict[tuple[type[BaseModel], str], type[BaseModel]] = {
    (SimSection, "world"): SimConfig,
    (SimSection, "agents"): AgentSettings,
}

# Meanings of fields that have no description and no comment in their model's source.
MEANINGS: dict[str, str] = {
    "Config.provider": "where the fleet is: `sim` the built-in simulator, `vast` vast.ai",
    "Config.escalation": "what rules cannot decide: deduplication, deadlines, the LLM and the "
    "channels people hear on",
    "Config.demand": "where the proving queue is read: `sim` the simulator's, `curio` Curio's "
    "database (needs provider `vast`)",
    "VastSettings.base_url": "vast.ai's API, without a path",
    "VastSettings.api_key": "vast.ai API key",
    "VastSettings.image": "the container image every instance runs (cuzk and the Curio sidecar)",
    "VastSettings.onstart": "shell run when an instance starts (e.g. the fleetgate agent)",
    "VastSettings.disk_gb": "disk rented with each instance, GB",
    "VastSettings.offer_type": "`on-demand`, or `bid` for interruptible instances at `bid_price`",
    "VastSettings.min_cpu_ram_gb": "least host RAM an offer may have, GB",
    "VastSettings.min_disk_gb": "least free disk an offer may have, GB",
    "VastSettings.min_gpu_ram_gb": "least GPU memory an offer may have, GB",
    "VastSettings.min_cpu_cores": "least CPU cores an offer may have",
    "VastSettings.min_inet_down_mbps": "least download bandwidth an offer may have, Mbit/s",
    "VastSettings.min_cuda": "least CUDA version the host's driver supports",
    "VastSettings.min_reliability": "least reliability score (vast's, 0 to 1) an offer may have",
    "VastSettings.verified": "only offers from hosts vast has verified",
    "Gate.mode": "`act`: carry out what the rules decide; `propose`: every action waits for an "
    "approval; `observe`: decide and record only",
    "Gate.confidence_threshold": "a rule's proposal below this confidence is escalated instead",
    "Gate.large_change_factor": "confidence multiplier on a plan removing more than "
    "`large_change_share` of the fleet",
    "Guards.max_launches_per_hour": "most launches in any hour",
    "Guards.max_launches_per_tick": "most launches in one tick",
    "EscalationSection.channels": "where people hear of escalations: `console`, `file`, or a "
    "channel's settings (its `type` below)",
    "LLMSettings.mode": "how the answer is asked for: `tools` (tool calls) or `json_schema` "
    "(structured output)",
    "LLMSettings.max_calls_per_hour": "most LLM calls in any hour; past it, people are asked",
    "LLMSettings.max_tokens_per_day": "most tokens a day; past it, people are asked",
    "LLMSettings.temperature": "sampling temperature",
    "EmailSettings.security": "`starttls`, `tls` (SMTPS) or `none` (loopback relays only)",
    "EmailSettings.username": "SMTP login, when the server wants one",
    "EmailSettings.password": "SMTP password",
    "EmailSettings.sender": "the From address",
    "EmailSettings.recipients": "who gets the messages",
    "PagerDutySettings.url": "PagerDuty's Events API v2 endpoint",
    "PagerDutySettings.severity": "the severity of the alerts it raises",
}


@dataclass(frozen=True)
class Key:
    path: str
    type: str
    default: str
    meaning: str


@dataclass(frozen=True)
class Section:
    path: str  # "" for the top level
    model: type[BaseModel]
    keys: list[Key]


def sections() -> list[Section]:
    """Every section of the config, top level first, each nested one after its parent."""
    out: list[Section] = []
    seen: set[str] = set()

    def visit(path: str, model: type[BaseModel]) -> None:
        if path in seen:
            return
        seen.add(path)
        keys: list[Key] = []
        nested: list[tuple[str, type[BaseModel]]] = []
        for name, field in model.model_fields.items():
            key = f"{path}.{name}" if path else name
            subs = list(_models(field.annotation))
            validated = VALIDATED_AS.get((model, name))
            if validated is not None:
                subs.append(validated)
            for sub in subs:
                if len(subs) > 1 and "type" in sub.model_fields:  # one of several channel kinds
                    nested.append((f"{key}[] (type: {_literal(sub, 'type')})", sub))
                else:
                    nested.append((key, sub))
            keys.append(Key(key, render_type(field.annotation, field), _default(field),
                            meaning(model, name, field)))  # fmt: skip
        out.append(Section(path, model, keys))
        for sub_path, sub in nested:
            visit(sub_path, sub)

    visit("", Config)
    return out


def meaning(model: type[BaseModel], name: str, field: FieldInfo) -> str:
    """What a key means (see the module docstring); ValueError when nothing says."""
    text = field.description or _comment(model, name) or MEANINGS.get(f"{model.__name__}.{name}")
    if not text and isinstance(_first_model(field.annotation), type):
        text = _summary(_first_model(field.annotation))
    if not text and name == "type" and get_origin(field.annotation) is Literal:
        text = "the channel's kind"
    if not text:
        raise ValueError(f"{model.__name__}.{name} has no description, no comment in "
                         f"{inspect.getsourcefile(model)} and no entry in MEANINGS")  # fmt: skip
    return " ".join(text.split())


def render() -> str:
    """docs/config.md."""
    lines = [
        "# Config reference",
        "",
        "Every key of the config file (`fleetgate --config FILE`), its type, its default and "
        "what it means.",
        "Generated from the pydantic models that load it (`controller/service/config.py` and "
        "the section models it names) by `python -m controller.tools.config_reference`; do not "
        "edit by hand.",
        "Unknown keys and bad values are errors at their line (`fleetgate --config FILE check`); "
        "a secret is written `{env: NAME}` or `{file: PATH}`, never inline.",
        "",
    ]
    for section in sections():
        title = f"`{section.path}`" if section.path else "Top level"
        lines += [f"## {title}", ""]
        doc = _summary(section.model, full=True)
        if doc:
            lines += [doc, ""]
        lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for k in section.keys:
            cells = [f"`{k.path}`", k.type, k.default, k.meaning]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def render_type(annotation: Any, field: FieldInfo | None = None) -> str:
    base = _type(annotation)
    limits = _limits(field.metadata) if field is not None else ""
    return f"{base} {limits}".strip()


def _type(t: Any) -> str:
    origin, args = get_origin(t), get_args(t)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin in (Union, types.UnionType):
        parts = [a for a in args if a is not type(None)]
        shown = " or ".join(dict.fromkeys(_type(a) for a in parts))
        return f"{shown} or null" if len(parts) < len(args) else shown
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of ({_type(args[0])})" if args else "list"
    if origin is dict:
        return f"map of {_type(args[0])} to {_type(args[1])}" if args else "map"
    if t is typing.Any:
        return "any"
    if isinstance(t, type) and issubclass(t, SecretStr):
        return "secret"
    if isinstance(t, type) and issubclass(t, BaseModel):
        return "section"
    names = {bool: "boolean", int: "integer", float: "number", str: "text"}
    return names.get(t, getattr(t, "__name__", str(t)))


def _limits(metadata: list[Any]) -> str:
    shown = []
    for m in metadata:
        for kind, attr, sign in ((Gt, "gt", ">"), (Ge, "ge", ">="), (Lt, "lt", "<"),
                                 (Le, "le", "<=")):  # fmt: skip
            if isinstance(m, kind):
                shown.append(f"{sign} {getattr(m, attr)}")
        if isinstance(m, MinLen):
            shown.append(f"at least {m.min_length} long")
        if isinstance(m, MaxLen):
            shown.append(f"at most {m.max_length} long")
        pattern = getattr(m, "pattern", None)
        if isinstance(pattern, str):
            shown.append(f"matching `{pattern}`")
    return f"({', '.join(shown)})" if shown else ""


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "none"
    if isinstance(value, BaseModel):
        return "its defaults"
    return f"`{json.dumps(value, default=str)}`"


def _models(t: Any) -> Iterator[type[BaseModel]]:
    """The section models an annotation holds (directly, optional, or in a list's union)."""
    if isinstance(t, type) and issubclass(t, BaseModel):
        yield t
        return
    for a in get_args(t):
        if get_origin(t) is dict:
            continue
        yield from _models(a)


def _first_model(t: Any) -> type[BaseModel] | None:
    return next(_models(t), None)


def _literal(model: type[BaseModel], name: str) -> str:
    return str(get_args(model.model_fields[name].annotation)[0])


def _summary(model: type[BaseModel] | None, full: bool = False) -> str:
    doc = inspect.getdoc(model) if model is not None else None
    if not doc or doc == inspect.getdoc(BaseModel):
        return ""
    text = textwrap.dedent(doc).strip()
    return " ".join(text.split()) if full else " ".join(text.split("\n\n")[0].split())


def _comment(model: type[BaseModel], name: str) -> str | None:
    """The comment on the field's own lines in its class body, or on the lines just above it
    (not a `# --` group heading)."""
    return _field_comments(model).get(name)


_PRAGMAS = ("fmt:", "type:", "noqa", "pragma")


@cache
def _field_comments(model: type[BaseModel]) -> dict[str, str]:
    try:
        source = inspect.getsource(model)
    except (OSError, TypeError):
        return {}
    source = textwrap.dedent(source)
    by_line: dict[int, str] = {}  # comments, pragmas left out
    alone: set[int] = set()  # lines holding a comment only
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        text = tok.string.lstrip("#").strip()
        if tok.type == tokenize.COMMENT and not text.startswith(_PRAGMAS):
            by_line[tok.start[0]] = text
            if tok.line.strip().startswith("#"):
                alone.add(tok.start[0])
    cls = ast.parse(source).body[0]
    assert isinstance(cls, ast.ClassDef)
    out: dict[str, str] = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        end = node.end_lineno or node.lineno
        own = [by_line[n] for n in range(node.lineno, end + 1) if n in by_line]
        above: list[str] = []
        n = node.lineno - 1
        while n in alone and not by_line[n].startswith("--"):
            above.insert(0, by_line[n])
            n -= 1
        text = " ".join(above + own).strip()
        if text:
            out[node.target.id] = text
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m controller.tools.config_reference",
        description="write docs/config.md from the config models",
    )
    p.add_argument("--check", action="store_true", help="exit 1 if docs/config.md is stale")
    p.add_argument("--stdout", action="store_true", help="print it instead of writing it")
    p.add_argument("--output", type=Path,
                   help=f"default: {DOC} in a source tree (installed: printed)")  # fmt: skip
    args = p.parse_args(argv)
    text = render()
    if args.output is None:
        if not (TREE / "pyproject.toml").is_file():  # installed: site-packages is no place
            args.stdout = not args.check
        args.output = DOC
    if args.stdout:
        sys.stdout.write(text)
        return 0
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.is_file() else None
        if current != text:
            print(f"{args.output} is stale: run python -m controller.tools.config_reference",
                  file=sys.stderr)  # fmt: skip
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

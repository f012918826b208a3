"""The operator's config file (YAML), loaded strictly: unknown keys and bad values are errors
that name `file:line`, the key and what was expected.

With no config file, every default applies: the built-in simulator, SQLite in the state
directory, the rules shipped in `rules/`, fast simulated time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controller.settings import Gate, Guards
from controller.yamlsrc import Located, LocatedList, YamlError, load


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SimSection(_Strict):
    """The built-in simulator (provider: sim, demand: sim)."""

    seed: int = Field(7, description="random seed; the same seed replays the same world")
    seconds_per_tick: float = Field(60.0, gt=0, description="virtual seconds each tick advances")
    world: dict[str, Any] = Field(
        default_factory=dict, description="simulator parameters (controller.sim.SimConfig fields)"
    )


class EscalationSection(_Strict):
    dedup_window_s: float = Field(3600, gt=0, description="the same situation once per window")
    deadline_s: float = Field(1800, gt=0, description="time a human has to answer")
    channels: list[Literal["console", "file"]] = Field(
        default_factory=lambda: ["console", "file"]  # type: ignore[arg-type]
    )
    file: str = Field("escalations.jsonl", description="JSONL channel path (relative: state dir)")
    templates_dir: str | None = Field(None, description="folder of templates overriding ours")


class Config(_Strict):
    interval_s: float = Field(
        0.1, gt=0, description="real seconds between ticks (the default suits the simulator)"
    )
    state_dir: str | None = Field(None, description="journal and state; --state overrides")
    rules: list[str] = Field(default_factory=list, description="rules files or folders")
    provider: Literal["sim"] = "sim"
    demand: Literal["sim"] = "sim"
    sim: SimSection = SimSection()
    gate: Gate = Gate()
    guards: Guards = Guards()
    settings: dict[str, Any] = Field(
        default_factory=dict, description="values rules read as settings.NAME (merged over ours)"
    )
    escalation: EscalationSection = EscalationSection()


class ConfigError(ValueError):
    """The config file is invalid; the message lists `file:line: key: problem` lines."""


def _line_for(doc: Any, loc: tuple[Any, ...]) -> int:
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


def _keys_at(loc: tuple[Any, ...]) -> list[str]:
    """The keys the model accepts at `loc` (for 'unknown key' messages)."""
    model: Any = Config
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None or not isinstance(field.annotation, type):
            return []
        model = field.annotation
    return sorted(getattr(model, "model_fields", {}))


def parse_config(path: str, text: str) -> Config:
    try:
        doc = load(text)
    except YamlError as exc:
        raise ConfigError(f"{path}:{exc.line}: {exc.message}") from exc
    if doc is None:
        doc = Located()
    if not isinstance(doc, dict):
        raise ConfigError(
            f"{path}:{getattr(doc, 'line', 1)}: the config must be a mapping of settings"
        )
    try:
        return Config.model_validate(doc)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            if loc and loc[-1] == "[key]":
                loc = loc[:-1]
                err["msg"] = f"unknown name: {err['msg']}"
            key = ".".join(str(p) for p in loc) or "config"
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = f"unknown key (expected one of {', '.join(_keys_at(loc[:-1]))})"
            lines.append(f"{path}:{_line_for(doc, loc)}: {key}: {msg}")
        raise ConfigError("\n".join(lines)) from exc


def load_config(path: str | None) -> Config:
    """Read the config file, or the defaults when `path` is None."""
    if path is None:
        return Config()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: cannot read: not UTF-8 text ({exc.reason})") from exc
    return parse_config(path, text)


def state_dir(config: Config, override: str | None) -> Path:
    """--state, then the config, then $FLEETGATE_STATE, then ./.fleetgate."""
    chosen = override or config.state_dir or os.environ.get("FLEETGATE_STATE") or ".fleetgate"
    return Path(chosen)


def rules_paths(config: Config, cli_paths: list[str] | None = None) -> list[Path]:
    """Rules to load: given paths, else the config's, else ./rules, else the shipped ones."""
    if cli_paths:
        return [Path(p) for p in cli_paths]
    if config.rules:
        return [Path(p) for p in config.rules]
    here = Path("rules")
    if here.is_dir():
        return [here]
    return [Path(__file__).resolve().parent.parent / "rules"]

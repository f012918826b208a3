"""The operator's config file (YAML), loaded strictly: unknown keys and bad values are errors
that name `file:line`, the key and what was expected.

With no config file, every default applies: the built-in simulator, SQLite in the state
directory, the rules shipped in `rules/`, fast simulated time.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from controller.core.policy import Gate, Guards
from controller.rules.yamlsrc import Located, LocatedList, YamlError, load
from controller.service.secrets import SecretRef


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SimSection(_Strict):
    """The built-in simulator (provider: sim, demand: sim)."""

    seed: int = Field(7, description="random seed; the same seed replays the same world")
    seconds_per_tick: float = Field(60.0, gt=0, description="virtual seconds each tick advances")
    world: dict[str, Any] = Field(
        default_factory=dict, description="simulator parameters (controller.sim.SimConfig fields)"
    )
    agents: dict[str, Any] = Field(
        default_factory=dict,
        description="how the simulated instances' agents behave "
        "(controller.sim.agents.AgentSettings fields)",
    )


class LLMSection(_Strict):
    """The LLM that reads escalated situations first (any OpenAI-compatible endpoint)."""

    base_url: str = Field(description="e.g. http://127.0.0.1:8000/v1")
    model: str
    api_key: SecretRef | None = Field(None, description="{env: NAME} or {file: PATH}")
    mode: Literal["tools", "json_schema"] = "tools"
    timeout_s: float = Field(30, gt=0)
    retries: int = Field(3, ge=0, le=10)
    max_calls_per_hour: int = Field(20, ge=0)
    max_tokens_per_day: int = Field(200_000, ge=0)
    temperature: float = Field(0.0, ge=0, le=2)
    require_check: bool = Field(
        False, description="use the LLM only after `fleetgate llm-check` passed for this model"
    )
    check_threshold: float = Field(0.8, ge=0, le=1, description="share of probes to pass")


class WebhookChannelConfig(_Strict):
    type: Literal["webhook"]
    url: SecretRef


class SlackChannelConfig(_Strict):
    type: Literal["slack"]
    webhook_url: SecretRef


class EmailChannelConfig(_Strict):
    type: Literal["email"]
    host: str
    port: int = Field(587, gt=0, lt=65536)
    security: Literal["starttls", "tls", "none"] = "starttls"
    username: str | None = None
    password: SecretRef | None = None
    sender: str
    recipients: list[str] = Field(min_length=1)


class NtfyChannelConfig(_Strict):
    type: Literal["ntfy"]
    url: str = Field(description="the ntfy server, e.g. https://ntfy.example.org")
    topic: str
    token: SecretRef | None = None
    priority: int = Field(4, ge=1, le=5)


class PagerDutyChannelConfig(_Strict):
    type: Literal["pagerduty"]
    routing_key: SecretRef
    url: str = "https://events.pagerduty.com/v2/enqueue"
    severity: Literal["critical", "error", "warning", "info"] = "warning"


class AlertmanagerChannelConfig(_Strict):
    type: Literal["alertmanager"]
    url: str = Field(description="e.g. http://alertmanager:9093")


ChannelConfig = Annotated[
    WebhookChannelConfig | SlackChannelConfig | EmailChannelConfig | NtfyChannelConfig
    | PagerDutyChannelConfig | AlertmanagerChannelConfig,
    Field(discriminator="type"),
]  # fmt: skip


_CHANNELS: dict[str, type[BaseModel]] = {
    "webhook": WebhookChannelConfig, "slack": SlackChannelConfig, "email": EmailChannelConfig,
    "ntfy": NtfyChannelConfig, "pagerduty": PagerDutyChannelConfig,
    "alertmanager": AlertmanagerChannelConfig,
}  # fmt: skip


class ApiSection(_Strict):
    """The HTTP API (escalation answers over HTTP, ntfy buttons, status)."""

    listen: str = Field("127.0.0.1:8765", pattern=r"^[^:\s]+:\d{1,5}$", description="host:port")
    token: SecretRef = Field(description="the bearer token answers must carry")
    public_url: str | None = Field(
        None, description="how people reach the API (links in messages); default http://listen"
    )


class EscalationSection(_Strict):
    dedup_window_s: float = Field(3600, gt=0, description="the same situation once per window")
    deadline_s: float = Field(1800, gt=0, description="time a human has to answer")
    channels: list[Literal["console", "file"] | ChannelConfig] = Field(
        default_factory=lambda: ["console", "file"]  # type: ignore[arg-type]
    )
    llm: LLMSection | None = Field(None, description="the LLM reader; none: people only")
    file: str = Field("escalations.jsonl", description="JSONL channel path (relative: state dir)")
    templates_dir: str | None = Field(None, description="folder of templates overriding ours")


class VastSection(_Strict):
    """The vast.ai fleet (provider: vast)."""

    api_key: SecretRef
    base_url: str = "https://console.vast.ai"
    image: str = Field(description="the container image every instance runs")
    env: dict[str, str] = Field(default_factory=dict, description="container environment")
    onstart: str = Field("", description="script run when the container starts")
    disk_gb: float = Field(250, gt=0)
    offer_type: Literal["on-demand", "bid"] = "on-demand"
    bid_price: float | None = Field(None, gt=0, description="$/hour for bid (interruptible)")
    timeout_s: float = Field(20, gt=0)
    retries: int = Field(3, ge=0, le=10)
    backoff_s: float = Field(1.0, ge=0, description="wait before the first retry, doubling")
    min_interval_s: dict[Literal["list", "create", "destroy", "search", "other"], float] = Field(
        default_factory=dict,
        description="seconds between calls per endpoint (vast's limits); "
        "defaults: list 1, create 4.5, destroy 3, search 6, other 1",
    )
    # the offer filter (the replaced manager's defaults)
    min_cpu_ram_gb: float = 240
    min_disk_gb: float = 250
    max_dph: float = 0.90
    min_gpu_ram_gb: float = 12.5
    min_cpu_cores: int = 25
    min_inet_down_mbps: float = 100
    min_cuda: float = 13.0
    min_reliability: float = 0.95
    verified: bool = True
    gpu_names: list[str] = Field(default_factory=list, description="empty: any GPU")
    extra_filter: dict[str, Any] = Field(default_factory=dict, description="raw vast query terms")


class CurioSection(_Strict):
    """Curio's task queue (demand: curio)."""

    dsn: SecretRef = Field(description="PostgreSQL/YugabyteDB connection string, from env or file")
    schema_name: str = "curio"
    tasks: dict[str, float] = Field(
        default_factory=lambda: {
            n: 1.0 for n in ("PoRep", "UpdateProve", "PSProve", "WdPost", "WinPost")
        },  # fmt: skip
        description="GPU task names and the capacity each needs",
    )
    statement_timeout_ms: int = Field(5000, ge=1)
    connect_timeout_s: int = Field(5, ge=2, description="libpq rounds lower values up to 2")
    heartbeat_stale_s: float = Field(
        600, gt=0, description="a Curio node silent this long is stale"
    )
    allow_drain: bool = Field(False, description="may fleetgate mark Curio nodes unschedulable")


class InstancesSection(_Strict):
    """The instances' agents and health checks (provider: vast)."""

    fleet_token: SecretRef = Field(description="the token instance agents present")
    health_port: int = Field(
        9821, gt=0, lt=65536, description="cuzk's status port in the container"
    )
    health_timeout_s: float = Field(3, gt=0)
    health_failures_to_down: int = Field(
        2, ge=1, description="failed status probes in a row before the daemon counts as down"
    )
    health_down_after_s: float = Field(
        60, ge=0, description="...and spanning at least this long (a blip is not a death)"
    )
    sidecar_stale_s: float = Field(180, gt=0, description="Curio node silent this long: down")
    command_deadline_s: float = Field(
        300, gt=0, description="an agent command not picked up by then becomes a vast reboot"
    )


class JournalSection(_Strict):
    """The journal on PostgreSQL (or YugabyteDB) instead of SQLite in the state directory."""

    dsn: SecretRef = Field(description="libpq connection string or URI, from env or file")
    schema_name: str = Field("fleetgate", min_length=1, max_length=63,
                             description="the schema fleetgate's tables live in")  # fmt: skip
    connect_timeout_s: int = Field(5, ge=2, description="libpq rounds lower values up to 2")


class LeaseSection(_Strict):
    """The leader lease: of the controllers sharing one journal, one acts."""

    ttl_s: float = Field(15, gt=0, description="a dead leader is replaced within this")
    renew_s: float = Field(5, gt=0, description="how often the leader renews (standbys poll)")
    margin_s: float = Field(2, ge=0, description="the leader stops acting with this little left")
    holder: str | None = Field(None, description="this controller's name (default host:pid)")

    @model_validator(mode="after")
    def _timing(self) -> LeaseSection:
        if not self.margin_s + self.renew_s < self.ttl_s:
            raise ValueError(f"lease: renew_s + margin_s ({self.renew_s} + {self.margin_s}) "
                             f"must be below ttl_s ({self.ttl_s}), or the leader lapses "
                             "between renewals")  # fmt: skip
        return self


class Config(_Strict):
    interval_s: float = Field(
        0.1, gt=0, description="real seconds between ticks (the default suits the simulator)"
    )
    state_dir: str | None = Field(None, description="journal and state; --state overrides")
    rules: list[str] = Field(default_factory=list, description="rules files or folders")
    provider: Literal["sim", "vast"] = "sim"
    demand: Literal["sim", "curio"] = "sim"
    vast: VastSection | None = None
    curio: CurioSection | None = None
    instances: InstancesSection | None = None
    sim: SimSection = SimSection()
    gate: Gate = Gate()
    guards: Guards = Guards()
    settings: dict[str, Any] = Field(
        default_factory=dict, description="values rules read as settings.NAME (merged over ours)"
    )
    escalation: EscalationSection = EscalationSection()
    api: ApiSection | None = None
    journal: JournalSection | None = Field(None, description="absent: SQLite in the state dir")
    lease: LeaseSection = LeaseSection()

    @model_validator(mode="after")
    def _sections_for_choices(self) -> Config:
        if self.provider == "sim" and self.demand == "curio":
            raise ValueError("demand 'curio' needs provider 'vast' (the simulator answers its own "
                             "queue: use demand 'sim')")  # fmt: skip
        needs = {"vast": self.provider == "vast", "instances": self.provider == "vast",
                 "api": self.provider == "vast", "curio": self.demand == "curio"}  # fmt: skip
        missing = [k for k, needed in needs.items() if needed and getattr(self, k) is None]
        if missing:
            raise ValueError(f"provider {self.provider!r} and demand {self.demand!r} need the "
                             f"section(s) {', '.join(missing)}")  # fmt: skip
        if self.provider == "vast" and self.demand == "sim":
            raise ValueError("provider vast needs demand curio (a simulated queue cannot drive "
                             "a real fleet)")  # fmt: skip
        return self


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


_UNION_STEP = re.compile(r"^(literal|tagged-union|function-\w+|union)\[")


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
        found: dict[tuple[int, str], list[str]] = {}
        for err in exc.errors():
            if err["type"] == "literal_error" and isinstance(err.get("input"), dict):
                continue  # a mapping was meant as a channel, not as "console"/"file"
            raw = [p for p in err["loc"] if not _UNION_STEP.match(str(p))]
            loc = tuple(
                p
                for i, p in enumerate(raw)
                if not (p in _CHANNELS and i and isinstance(raw[i - 1], int))
            )
            msg = err["msg"]
            if loc and loc[-1] == "[key]":
                loc, msg = loc[:-1], f"unknown name: {msg}"
            if err["type"] == "extra_forbidden":
                tag = next((p for p in raw if p in _CHANNELS), None)
                keys = _CHANNELS[tag].model_fields if tag else _keys_at(loc[:-1])
                msg = f"unknown key (expected one of {', '.join(sorted(keys))})"
            choice = next((k for k in ("provider", "demand") if k in doc), None)
            if not loc and isinstance(doc, Located) and choice:
                loc = (choice,)  # the cross-section checks are about the choice made there
                msg = msg.removeprefix("Value error, ")
            key = ".".join(str(p) for p in loc) or "config"
            found.setdefault((_line_for(doc, loc), key), []).append(msg)
        lines = [
            f"{path}:{line}: {key}: {'; or '.join(dict.fromkeys(msgs))}"
            for (line, key), msgs in found.items()
        ]
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
    return [Path(__file__).resolve().parents[2] / "rules"]

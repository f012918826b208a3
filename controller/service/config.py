"""The operator's config file (YAML), loaded strictly: unknown keys and bad values are errors
that name `file:line`, the key and what was expected.

Each adapter's own settings model is its section, so one set of validators decides what a
config may say: `vast` is `VastSettings`, `curio` is `CurioSettings`, `instances` is
`InstancesSettings`, `escalation.llm` is `LLMSettings` and each channel entry is its channel's
settings model. Secrets are written `{env: NAME}` or `{file: PATH}` and resolved while the file
is loaded, so a missing one is an error at its line like any other.

With no config file, every default applies: the built-in simulator, SQLite in the state
directory, the rules shipped in `rules/`, fast simulated time.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from controller import textfile
from controller.core.fields import RESOLVER, Secret
from controller.core.policy import Autonomy, Gate, Guards
from controller.fleet.curio import CurioSettings
from controller.fleet.health import InstancesSettings
from controller.fleet.vast import VastSettings
from controller.rules.yamlsrc import Located, YamlError, load
from controller.service.config_errors import ConfigError, describe
from controller.service.secrets import SecretRef
from controller.sim.agents import AgentSettings
from controller.sim.config import SimConfig
from controller.store.retention import RetentionSettings
from escalation.channels.alertmanager import AlertmanagerSettings
from escalation.channels.email import EmailSettings
from escalation.channels.ntfy import NtfySettings
from escalation.channels.pagerduty import PagerDutySettings
from escalation.channels.slack import SlackSettings
from escalation.channels.webhook import WebhookSettings
from escalation.llm import LLMSettings

__all__ = ["Config", "ConfigError", "load_config", "parse_config", "rules_paths", "state_dir"]


class _Strict(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True, strict=True)


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

    @field_validator("world")
    @classmethod
    def _world(cls, value: dict[str, Any]) -> dict[str, Any]:
        SimConfig.model_validate(value)  # its errors are this field's
        return value

    @field_validator("agents")
    @classmethod
    def _agents(cls, value: dict[str, Any]) -> dict[str, Any]:
        AgentSettings.model_validate(value)
        return value


ChannelSettings = Annotated[
    WebhookSettings | SlackSettings | EmailSettings | NtfySettings | PagerDutySettings
    | AlertmanagerSettings,
    Field(discriminator="type"),
]  # fmt: skip
ChannelName = Literal["console", "file"]  # the channels that need no settings

CHANNEL_SETTINGS: dict[str, type[BaseModel]] = {
    str(get_args(m.model_fields["type"].annotation)[0]): m
    for m in get_args(get_args(ChannelSettings)[0])
}  # type -> settings model, for messages and the assembly's registry check


_LISTEN = r"^[^:\s]+:\d{1,5}$"


class ApiSection(_Strict):
    """The HTTP API (escalation answers over HTTP, ntfy buttons, status). `listen` serves the
    operator's routes; `instance_listen`, when given, serves the instance API on an address of
    its own (and `listen` then serves no instance route); without it, both are on `listen`."""

    listen: str = Field("127.0.0.1:8765", pattern=_LISTEN,
                        description="host:port of the operator's API")  # fmt: skip
    instance_listen: str | None = Field(None, pattern=_LISTEN, description="host:port of the "
                                        "instance API; none: on `listen`")  # fmt: skip
    token: Secret = Field(description="the bearer token answers must carry")
    public_url: str | None = Field(
        None, description="how people reach the API (links in messages); default http://listen"
    )

    @model_validator(mode="after")
    def _apart(self) -> ApiSection:
        if self.instance_listen == self.listen and not self.listen.endswith(":0"):
            raise ValueError(f"instance_listen {self.instance_listen!r} is listen itself: leave "
                             "it out to serve both APIs there")  # fmt: skip
        return self


def unreachable_links(config: Config) -> str | None:
    """Why the links and buttons in messages would reach nobody, else None: without
    `api.public_url` they are `http://<api.listen>`, and a loopback or unspecified address
    (127.0.0.1, localhost, 0.0.0.0) is this machine's own, never a phone's or another
    desktop's way here. Only channels that leave the machine carry them."""
    api = config.api
    if api is None or api.public_url is not None:
        return None
    host = api.listen.rsplit(":", 1)[0].lower()
    if not (host.startswith("127.") or host in ("localhost", "0.0.0.0")):
        return None
    remote = sorted({str(c.type) for c in config.escalation.channels if not isinstance(c, str)})
    if not remote:
        return None
    return (f"api.public_url is not set and api.listen is {api.listen}: the answer links and "
            f"buttons in messages sent by {', '.join(remote)} point at http://{api.listen}, "
            "which no other device reaches; set api.public_url to the address people reach "
            "the API at")  # fmt: skip


class EscalationSection(_Strict):
    dedup_window_s: float = Field(3600, gt=0, description="the same situation once per window")
    deadline_s: float = Field(1800, gt=0, description="time a human has to answer")
    channels: list[ChannelName | ChannelSettings] = Field(
        default_factory=lambda: ["console", "file"]  # type: ignore[arg-type]
    )
    llm: LLMSettings | None = Field(None, description="the LLM reader; none: people only")
    file: str = Field("escalations.jsonl", description="JSONL channel path (relative: state dir)")
    templates_dir: str | None = Field(None, description="folder of templates overriding ours")
    outbox_step_s: float = Field(10, gt=0, description="`fleetgate tick`: real seconds the "
                                 "outbox gets after the tick; the rest waits")  # fmt: skip
    outbox_attempts: int = Field(6, ge=1, le=100, description="tries per delivery (LLM, "
                                 "channels) before it is recorded as failed")  # fmt: skip
    outbox_backoff_s: float = Field(30, ge=0, description="wait before a failed delivery is "
                                    "tried again; doubled each try, at most 1 h")  # fmt: skip


class JournalSection(_Strict):
    """The journal on PostgreSQL (or YugabyteDB) instead of SQLite in the state directory."""

    dsn: Secret = Field(description="libpq connection string or URI, from env or file")
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
            raise ValueError(f"renew_s + margin_s ({self.renew_s} + {self.margin_s}) must be "
                             f"below ttl_s ({self.ttl_s}), or the leader lapses between "
                             "renewals")  # fmt: skip
        return self


def _plain(value: Any) -> Any:
    """A setting is a finite number, a text or a boolean, as in a rules file."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"a setting must be a finite number, got {value!r}")
    if not isinstance(value, bool | int | float | str):
        got = "a list" if isinstance(value, list) else "a mapping" if isinstance(value, dict) \
            else type(value).__name__  # fmt: skip
        raise ValueError(f"a setting must be a number, text or a boolean, got {got}")
    return value


SettingValue = Annotated[Any, AfterValidator(_plain)]


class Config(_Strict):
    interval_s: float = Field(
        0.1, gt=0, description="real seconds between ticks (the default suits the simulator)"
    )
    state_dir: str | None = Field(None, description="journal and state; --state overrides")
    rules: list[str] = Field(default_factory=list, description="rules files or folders")
    provider: Literal["sim", "vast"] = "sim"
    demand: Literal["sim", "curio"] = "sim"
    vast: VastSettings | None = None
    curio: CurioSettings | None = None
    instances: InstancesSettings | None = None
    sim: SimSection = SimSection()
    gate: Gate = Gate()
    autonomy: Autonomy = Field(Autonomy(), description="the track record's thresholds: "
                               "when to suggest promoting an action to act")  # fmt: skip
    guards: Guards = Guards()
    settings: dict[str, SettingValue] = Field(
        default_factory=dict,
        description="values rules read as settings.NAME, in conditions ({setting: NAME}) and "
        "parameters; over the rules files' own `settings` and ours",
    )
    escalation: EscalationSection = EscalationSection()
    api: ApiSection | None = None
    journal: JournalSection | None = Field(None, description="absent: SQLite in the state dir")
    lease: LeaseSection = LeaseSection()
    retention: RetentionSettings = RetentionSettings()

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


def secret_resolver(environ: Mapping[str, str] | None = None) -> Callable[[object], SecretStr]:
    """What turns a config file's `{env: NAME}` or `{file: PATH}` into the secret's value
    (`environ` defaults to the process environment)."""
    env = None if environ is None else dict(environ)

    def resolve(value: object) -> SecretStr:
        if isinstance(value, str):
            raise ValueError("a secret is written as {env: NAME} or {file: PATH}, never inline")
        return SecretRef.model_validate(value).resolve(env)

    return resolve


def parse_config(path: str, text: str, environ: Mapping[str, str] | None = None) -> Config:
    """The config in `text` (read from `path`, named in errors); secrets from `environ`."""
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
        return Config.model_validate(doc, context={RESOLVER: secret_resolver(environ)})
    except ValidationError as exc:
        names = get_args(ChannelName)
        raise ConfigError(describe(path, doc, exc, Config, CHANNEL_SETTINGS, names)) from exc


def load_config(path: str | None, environ: Mapping[str, str] | None = None) -> Config:
    """Read the config file, or the defaults when `path` is None."""
    if path is None:
        return Config()
    try:
        text = textfile.read_text(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {textfile.unreadable(exc)}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: cannot read: not UTF-8 text ({exc.reason})") from exc
    return parse_config(path, text, environ)


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
    from controller.rules.source import shipped_rules

    here = Path("rules")
    if here.is_dir():
        return [here]
    return [shipped_rules()]

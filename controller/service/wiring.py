"""Build the escalation side from the config: secrets, channels, the LLM reader, the API.

Every secret is resolved here, once; a missing one is a ConfigError that names the config key
and where it looked (never a value).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from controller.service.config import Config, ConfigError
from controller.service.secrets import SecretError, SecretRef
from controller.store.journal import Journal
from escalation.channels.base import Channel
from escalation.channels.console import ConsoleChannel
from escalation.channels.file import FileChannel
from escalation.render import Renderer

if TYPE_CHECKING:
    from controller.store.lease import Lease

log = logging.getLogger(__name__)

CHECK_KEY = "llm.check"
HEALTH_KEY = "health.failures"  # failed probes in a row, kept across `tick` runs


def secret(ref: SecretRef | None, key: str) -> SecretStr | None:
    if ref is None:
        return None
    try:
        return ref.resolve()
    except SecretError as exc:
        raise ConfigError(f"{key}: {exc}") from exc


def api_token(config: Config) -> SecretStr | None:
    return secret(config.api.token, "api.token") if config.api else None


def answer_url(config: Config) -> str | None:
    if config.api is None:
        return None
    return config.api.public_url or f"http://{config.api.listen}"


def channels(config: Config, state: Path) -> list[Channel]:
    out: list[Channel] = []
    for n, spec in enumerate(config.escalation.channels):
        key = f"escalation.channels.{n}"
        if spec == "console":
            out.append(ConsoleChannel(sys.stdout))
        elif spec == "file":
            path = Path(config.escalation.file)
            out.append(FileChannel(path if path.is_absolute() else state / path))
        else:
            out.append(_channel(spec, key, config))
    return out


def _channel(spec: Any, key: str, config: Config) -> Channel:
    """One of the HTTP/SMTP channels (imported only when configured)."""
    kind = spec.type
    if kind == "webhook":
        from escalation.channels.webhook import WebhookChannel

        return WebhookChannel(url=_need(spec.url, f"{key}.url"))
    if kind == "slack":
        from escalation.channels.slack import SlackChannel

        return SlackChannel(webhook_url=_need(spec.webhook_url, f"{key}.webhook_url"))
    if kind == "email":
        from escalation.channels.email import EmailChannel

        password = secret(spec.password, f"{key}.password")
        return EmailChannel(host=spec.host, port=spec.port, security=spec.security,
                            username=spec.username, password=password, sender=spec.sender,
                            recipients=list(spec.recipients))  # fmt: skip
    if kind == "ntfy":
        from escalation.channels.ntfy import NtfyChannel

        return NtfyChannel(url=spec.url, topic=spec.topic, token=secret(spec.token, f"{key}.token"),
                           priority=spec.priority, answer_token=api_token(config))  # fmt: skip
    if kind == "pagerduty":
        from escalation.channels.pagerduty import PagerDutyChannel

        return PagerDutyChannel(routing_key=_need(spec.routing_key, f"{key}.routing_key"),
                                url=spec.url, severity=spec.severity)  # fmt: skip
    from escalation.channels.alertmanager import AlertmanagerChannel

    return AlertmanagerChannel(url=spec.url)


def _need(ref: SecretRef, key: str) -> SecretStr:
    value = secret(ref, key)
    assert value is not None
    return value


def llm_client(
    config: Config,
    journal: Journal,
    renderer: Renderer,
    *,
    enforce_check: bool = True,
    usage: Any | None = None,
) -> Any | None:
    """The LLM reader, or None (people only) when none is configured or its check is due.

    `usage` defaults to the journal's (the service's budget); `llm-check` passes its own.
    """
    section = config.escalation.llm
    if section is None:
        return None
    from escalation.llm import LLMClient, LLMSettings
    from escalation.usage import JournalUsage

    settings = LLMSettings(
        base_url=section.base_url, model=section.model,
        api_key=secret(section.api_key, "escalation.llm.api_key"), mode=section.mode,
        timeout_s=section.timeout_s, retries=section.retries,
        max_calls_per_hour=section.max_calls_per_hour,
        max_tokens_per_day=section.max_tokens_per_day, temperature=section.temperature,
    )  # fmt: skip
    client = LLMClient(settings, renderer, usage if usage is not None else JournalUsage(journal))
    checked = check_passed(journal, section.base_url, section.model, section.check_threshold)
    if enforce_check and section.require_check and not checked:
        log.warning("LLM escalation is off until `fleetgate llm-check` passes for model %r at %s",
                    section.model, section.base_url)  # fmt: skip
        return None
    return client


def check_passed(journal: Journal, base_url: str, model: str, threshold: float) -> bool:
    last = journal.get(CHECK_KEY) or {}
    return bool(last.get("base_url") == base_url and last.get("model") == model
                and float(last.get("ratio", 0)) >= threshold)  # fmt: skip


class Launched:
    """Instance id -> launch label of every launch that rented, read from the journal once and
    then only what is new (the instances fleetgate owns, whatever label vast shows)."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._after = 0
        self._ids: dict[str, str] = {}

    def __call__(self) -> dict[str, str]:
        for action_id, instance_id, label in self._journal.launched_after(self._after):
            self._ids[instance_id] = label
            self._after = action_id
        return self._ids


def fleet_settings(config: Config) -> tuple[Any, Any, Any]:
    """(VastSettings, CurioSettings, InstancesSection) for the fleet path: the config's for
    provider vast; for the simulator, what its simulated vast and Curio answer to."""
    from controller.fleet.curio import CurioSettings
    from controller.fleet.vast import DEFAULT_MIN_INTERVAL_S, VastSettings
    from controller.service.config import InstancesSection

    if config.provider == "sim":
        from controller.sim import wire

        names = config.sim.world.get("task_weights") or {}
        tasks: dict[str, Any] = {"tasks": dict.fromkeys(names, 1.0)} if names else {}
        vast = VastSettings(base_url=wire.VAST_URL, api_key=SecretStr(wire.API_KEY),
                            image=wire.IMAGE, backoff_s=0.0,
                            min_interval_s=dict.fromkeys(DEFAULT_MIN_INTERVAL_S, 0.0))  # fmt: skip
        curio = CurioSettings.model_validate(
            {"dsn": SecretStr(wire.CURIO_DSN), "allow_drain": True, **tasks}
        )
        return vast, curio, InstancesSection.model_validate({"fleet_token": {"env": "UNUSED"}})
    vast_cfg, curio_cfg, inst = config.vast, config.curio, config.instances
    assert vast_cfg is not None and curio_cfg is not None and inst is not None
    key = _need(vast_cfg.api_key, "vast.api_key")
    fields = vast_cfg.model_dump(exclude={"api_key"})
    fields["min_interval_s"] = {**DEFAULT_MIN_INTERVAL_S, **vast_cfg.min_interval_s}
    dsn = _need(curio_cfg.dsn, "curio.dsn")
    # every instance gets the token its agent presents, as FLEETGATE_FLEET_TOKEN
    fields["secret_env"] = {"FLEETGATE_FLEET_TOKEN": _need(inst.fleet_token,
                                                           "instances.fleet_token")}  # fmt: skip
    return (VastSettings(**fields, api_key=key),
            CurioSettings(**curio_cfg.model_dump(exclude={"dsn"}), dsn=dsn), inst)  # fmt: skip


def real_fleet(
    config: Config, journal: Journal, clock: Callable[[], float], seams: Any = None
) -> tuple[Any, Any, Any]:
    """(fleet provider, demand sensor, lifecycle store): the vast client, the Curio sensor, the
    health probes and the agent records, on `seams` (the wire: production's by default, the
    simulator's for provider sim)."""
    from controller.fleet.curio import CurioDemand
    from controller.fleet.health import status_target
    from controller.fleet.observe import RealFleet
    from controller.fleet.vast import VastClient, VastProvider
    from controller.sim.wire import Seams
    from controller.store.records import LifecycleStore

    wire = seams if seams is not None else Seams.real()
    settings, curio_settings, inst = fleet_settings(config)
    client = VastClient(settings, wire.session, clock=wire.clock, sleep=wire.sleep)
    vast = VastProvider(client, settings)  # missing instances are confirmed one by one
    curio = CurioDemand(curio_settings, connect=wire.curio_connect)
    store = LifecycleStore(journal)

    def check_health(instances: Any) -> Any:
        targets = {}
        for i in instances:
            target = status_target(vast.last_raw.get(i.id, {}), inst.health_port)
            if target is not None:
                targets[i.id] = target
        return wire.check_many(targets, inst.health_timeout_s)

    fleet = RealFleet(vast=vast, lifecycle=store, curio=curio, check_health=check_health,
                      clock=clock, sidecar_stale_s=inst.sidecar_stale_s,
                      command_deadline_s=inst.command_deadline_s,
                      failures_to_down=inst.health_failures_to_down,
                      down_after_s=inst.health_down_after_s,
                      failures=journal.get(HEALTH_KEY) or {},
                      launched=Launched(journal))  # fmt: skip
    return fleet, curio, store


def open_journal(config: Config, state: Path) -> Journal:
    """SQLite in the state directory, or the configured PostgreSQL schema."""
    if config.journal is None:
        return Journal(state / "journal.db")
    from controller.store.backend import PostgresStore

    section = config.journal
    dsn = _need(section.dsn, "journal.dsn")
    return Journal(PostgresStore(dsn.get_secret_value(), section.schema_name,
                                 section.connect_timeout_s))  # fmt: skip


def lease(config: Config, journal: Journal) -> Lease:
    from controller.store.lease import Lease

    return Lease(journal, config.lease.holder, ttl_s=config.lease.ttl_s,
                 margin_s=config.lease.margin_s)  # fmt: skip

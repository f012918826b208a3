"""The escalation channels the config names, built from a registry: channel type -> builder.

`console` and `file` are plain names (they need no settings). Every other channel is a mapping
whose `type` picks its settings model (`config.ChannelSettings`) and its builder in CHANNELS.
A builder gets the validated settings and the `ChannelSeams` (the state directory, the API
token for answer buttons, the clock and the sleep) and constructs the channel: it opens
nothing, so `fleetgate check` builds every channel too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from pydantic import BaseModel, SecretStr

from controller.service.config import ChannelName, ChannelSettings
from controller.service.config_errors import building
from escalation.channels.alertmanager import AlertmanagerChannel, AlertmanagerSettings
from escalation.channels.base import Channel
from escalation.channels.console import ConsoleChannel
from escalation.channels.email import EmailChannel, EmailSettings
from escalation.channels.file import FileChannel
from escalation.channels.http import HttpClient
from escalation.channels.ntfy import NtfyChannel, NtfySettings
from escalation.channels.pagerduty import PagerDutyChannel, PagerDutySettings
from escalation.channels.slack import SlackChannel, SlackSettings
from escalation.channels.webhook import WebhookChannel, WebhookSettings

S = TypeVar("S", bound=BaseModel)


@dataclass(frozen=True)
class ChannelSeams:
    """What channels are built with besides their settings."""

    state: Path  # the state directory: where a relative `escalation.file` lives
    file: str  # `escalation.file`
    answer_token: SecretStr | None  # the API's token, for ntfy's answer buttons
    clock: Callable[[], float]  # real time (Alertmanager compares with its own clock)
    sleep: Callable[[float], None]  # between retries

    def http(self) -> HttpClient:
        return HttpClient(sleep=self.sleep)


class ChannelBuilder(Protocol):
    def __call__(self, spec: BaseModel, seams: ChannelSeams, /) -> Channel: ...


@dataclass(frozen=True)
class Kind(Generic[S]):
    """One channel type: its settings model and the function that builds it from them."""

    settings: type[S]
    build: Callable[[S, ChannelSeams], Channel]

    def __call__(self, spec: BaseModel, seams: ChannelSeams, /) -> Channel:
        if not isinstance(spec, self.settings):
            raise TypeError(f"{type(spec).__name__} given where {self.settings.__name__} belongs")
        return self.build(spec, seams)


def _webhook(s: WebhookSettings, seams: ChannelSeams) -> Channel:
    return WebhookChannel(url=s.url, headers=s.headers, http=seams.http())


def _slack(s: SlackSettings, seams: ChannelSeams) -> Channel:
    return SlackChannel(webhook_url=s.webhook_url, http=seams.http())


def _email(s: EmailSettings, seams: ChannelSeams) -> Channel:
    return EmailChannel(host=s.host, port=s.smtp_port(), security=s.security, username=s.username,
                        password=s.password, sender=s.sender, recipients=list(s.recipients),
                        timeout_s=s.timeout_s, retries=s.retries, backoff_s=s.backoff_s,
                        sleep=seams.sleep)  # fmt: skip


def _ntfy(s: NtfySettings, seams: ChannelSeams) -> Channel:
    return NtfyChannel(url=s.url, topic=s.topic, token=s.token, priority=s.priority,
                       answer_token=seams.answer_token, http=seams.http())  # fmt: skip


def _pagerduty(s: PagerDutySettings, seams: ChannelSeams) -> Channel:
    return PagerDutyChannel(routing_key=s.routing_key, url=s.url, severity=s.severity,
                            http=seams.http())  # fmt: skip


def _alertmanager(s: AlertmanagerSettings, seams: ChannelSeams) -> Channel:
    return AlertmanagerChannel(url=s.url, severity=s.severity, fleet=s.fleet, labels=s.labels,
                               headers=s.headers, http=seams.http(),
                               clock=seams.clock)  # fmt: skip


def _console(seams: ChannelSeams) -> Channel:
    return ConsoleChannel(sys.stdout)


def _file(seams: ChannelSeams) -> Channel:
    path = Path(seams.file)
    return FileChannel(path if path.is_absolute() else seams.state / path)


NAMED: Mapping[str, Callable[[ChannelSeams], Channel]] = {"console": _console, "file": _file}
CHANNELS: Mapping[str, ChannelBuilder] = {
    "webhook": Kind(WebhookSettings, _webhook),
    "slack": Kind(SlackSettings, _slack),
    "email": Kind(EmailSettings, _email),
    "ntfy": Kind(NtfySettings, _ntfy),
    "pagerduty": Kind(PagerDutySettings, _pagerduty),
    "alertmanager": Kind(AlertmanagerSettings, _alertmanager),
}


def build_channels(
    specs: Sequence[ChannelName | ChannelSettings], seams: ChannelSeams, config_path: str | None
) -> list[Channel]:
    """Every configured channel, in order; what fails to build is a ConfigError naming it."""
    out: list[Channel] = []
    for n, spec in enumerate(specs):
        with building(config_path, f"escalation.channels.{n}"):
            out.append(
                NAMED[spec](seams) if isinstance(spec, str) else CHANNELS[spec.type](spec, seams)
            )
    return out

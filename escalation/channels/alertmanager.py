"""The Alertmanager channel: each escalation is one alert, active until its deadline.

send() posts one alert to `{url}/api/v2/alerts`: labels {alertname="FleetgateEscalation",
escalation_id, kind, subject, severity, plus the operator's static labels} (Alertmanager routes
and groups on these), the annotations and generatorURL that alertmanager.json.j2 renders
(summary, description = the message, approve, deny, deadline), startsAt = raised, endsAt = the
deadline. resolve() posts the same labels with endsAt = now, so Alertmanager ends the alert as
soon as the escalation is answered or expires, and sends its receivers the "resolved" notice.

Labels are built from the escalation alone (never from a template), so resolve() rebuilds the
exact label set, which is the alert's identity. Label values are sanitized (no control
characters, whitespace collapsed, at most MAX_LABEL characters).

Must NOT retry beyond escalation.channels.http. The clock is read only for resolve's endsAt;
it is real time, since Alertmanager compares with its own clock.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from controller.core.fields import HttpUrl, Secret
from escalation.channels.base import ChannelError
from escalation.channels.http import HttpClient, rendered_object, require
from escalation.render import iso8601

ALERTNAME = "FleetgateEscalation"
MAX_LABEL = 128
MAX_DESCRIPTION = 4000
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_OURS = ("alertname", "escalation_id", "kind", "subject", "severity")


def label_value(value: Any) -> str:
    """A value fit for a label: printable, one line, whitespace collapsed, at most MAX_LABEL."""
    text = " ".join(_CONTROL.sub(" ", str(value)).split())
    return text[:MAX_LABEL] or "-"


def check_labels(labels: Mapping[str, str]) -> None:
    """ValueError unless `labels` may be added to ours (the settings' and the class's check)."""
    bad = [key for key in labels if not _LABEL_NAME.match(key) or key in _OURS]
    if bad:
        raise ValueError(
            f"Alertmanager labels {bad!r}: a label name is letters, digits and _, not"
            f" starting with a digit, and not one of {_OURS}"
        )


class AlertmanagerSettings(BaseModel):
    """A `{type: alertmanager}` entry of `escalation.channels`."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    type: Literal["alertmanager"] = "alertmanager"
    url: HttpUrl = Field(description="Alertmanager's base URL, e.g. http://alertmanager:9093")
    severity: str = Field("warning", description="the alerts' severity label")
    labels: dict[str, str] = Field(default_factory=dict, description="static labels to add")
    headers: dict[str, Secret] = Field(default_factory=dict, description="e.g. Authorization")

    @model_validator(mode="after")
    def _usable(self) -> AlertmanagerSettings:
        check_labels(self.labels)
        return self


class AlertmanagerChannel:
    """One Alertmanager alert per escalation: posted by send(), ended by resolve()."""

    template = "alertmanager.json.j2"

    def __init__(
        self,
        url: str,
        *,
        severity: str = "warning",
        labels: Mapping[str, str] | None = None,
        headers: Mapping[str, SecretStr] | None = None,
        name: str = "alertmanager",
        http: HttpClient | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        extra = dict(labels or {})
        check_labels(extra)
        self.name = name
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.severity = label_value(severity)
        self._extra = {key: label_value(value) for key, value in extra.items()}
        self._headers = dict(headers or {})
        self._http = http or HttpClient()
        self._clock = clock

    def __repr__(self) -> str:
        return f"AlertmanagerChannel(name={self.name!r}, url={self.url!r})"

    def labels(self, esc: dict[str, Any]) -> dict[str, str]:
        """The alert's identity: the same for send() and resolve() of one escalation."""
        missing = [key for key in ("id", "kind", "subject") if esc.get(key) in (None, "")]
        if missing:
            raise ChannelError(
                f"channel {self.name!r}: escalation {esc.get('id')!r} lacks {missing!r}"
            )
        ours = {
            "alertname": ALERTNAME,
            "escalation_id": label_value(esc["id"]),
            "kind": label_value(esc["kind"]),
            "subject": label_value(esc["subject"]),
            "severity": self.severity,
        }
        return {**self._extra, **ours}

    def send(self, esc: dict[str, Any], text: str) -> None:
        what = f"channel {self.name!r}: escalation {esc.get('id')!r}"
        parts = rendered_object(text, what=what, template=self.template)
        require(parts, {"annotations": dict, "generatorURL": (str, type(None))}, what)
        annotations = {key: str(value) for key, value in parts["annotations"].items()}
        if "description" in annotations:
            annotations["description"] = annotations["description"][:MAX_DESCRIPTION]
        alert: dict[str, Any] = {
            "labels": self.labels(esc),
            "annotations": annotations,
            "startsAt": esc.get("created_at_iso"),
            "endsAt": esc.get("deadline_iso"),
        }
        if parts["generatorURL"]:
            alert["generatorURL"] = parts["generatorURL"]
        self._post([{k: v for k, v in alert.items() if v is not None}], what)

    def resolve(self, esc: dict[str, Any]) -> None:
        """End the escalation's alert now (answered or expired)."""
        what = f"channel {self.name!r}: escalation {esc.get('id')!r}: resolve"
        status = esc.get("status") or "answered"
        summary = f"#{esc.get('id')} {esc.get('kind')} {esc.get('subject')}: {esc.get('summary')}"
        alert = {
            "labels": self.labels(esc),
            "annotations": {"summary": summary, "description": f"escalation ended: {status}"},
            "endsAt": iso8601(self._clock()),
        }
        self._post([alert], what)

    def _post(self, alerts: list[dict[str, Any]], what: str) -> None:
        headers = {key: value.get_secret_value() for key, value in self._headers.items()}
        self._http.post_json(self.url, alerts, headers=headers, what=what)

"""The PagerDuty channel: an Events API v2 `trigger` per escalation, a `resolve` when it ends.

The trigger's summary, source, custom_details (approve/deny commands, deadline, proposals, the
full message) and links come from pagerduty.json.j2; the channel adds the routing key, the
severity, the timestamp and the dedup_key, and caps the summary at PagerDuty's 1024 characters.

dedup_key is `fleetgate-<escalation id>-<fingerprint>`. The id, because a PagerDuty incident
must live exactly as long as the escalation it pages for: resolve() is called when *that*
escalation is answered or expires, and a later escalation of the same situation (same
fingerprint, new id, new approve command) must page again rather than fold into an old
incident whose commands name an expired id. The fingerprint, because ids restart in every
journal: two fleets sharing one routing key must not resolve each other's incidents.

The routing key is a secret: never in a log line or an error. Must NOT retry beyond
escalation.channels.http.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from controller.core.fields import HttpUrl, Secret
from escalation.channels.base import ChannelError
from escalation.channels.http import HttpClient, rendered_object, require

EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
MAX_SUMMARY = 1024
Severity = Literal["critical", "error", "warning", "info"]
_SEVERITIES = ("critical", "error", "warning", "info")


def dedup_key(esc: dict[str, Any]) -> str:
    """`fleetgate-<id>-<fingerprint>`: one PagerDuty incident per escalation (module docstring)."""
    if esc.get("id") is None or not esc.get("fingerprint"):
        raise ChannelError(f"escalation {esc.get('id')!r} lacks an id or a fingerprint")
    return f"fleetgate-{esc['id']}-{esc['fingerprint']}"


class PagerDutySettings(BaseModel):
    """A `{type: pagerduty}` entry of `escalation.channels`."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True, strict=True)

    type: Literal["pagerduty"] = "pagerduty"
    routing_key: Secret = Field(description="the Events API v2 integration key")
    url: HttpUrl = EVENTS_URL
    severity: Severity = "warning"


class PagerDutyChannel:
    """Triggers (send) and resolves (resolve) one PagerDuty alert per escalation."""

    template = "pagerduty.json.j2"

    def __init__(
        self,
        routing_key: SecretStr,
        url: str = EVENTS_URL,
        severity: Severity = "warning",
        *,
        name: str = "pagerduty",
        http: HttpClient | None = None,
    ) -> None:
        if severity not in _SEVERITIES:
            raise ValueError(f"PagerDuty severity must be one of {_SEVERITIES}, got {severity!r}")
        self.name = name
        self.url = url
        self.severity = severity
        self._key = routing_key
        self._http = http or HttpClient()

    def __repr__(self) -> str:
        return f"PagerDutyChannel(name={self.name!r}, url={self.url!r}, severity={self.severity!r})"

    def send(self, esc: dict[str, Any], text: str) -> None:
        what = f"channel {self.name!r}: escalation {esc.get('id')!r}"
        parts = rendered_object(text, what=what, template=self.template)
        require(parts, {"summary": str, "source": str, "custom_details": dict, "links": list}, what)
        payload = {
            "summary": parts["summary"][:MAX_SUMMARY],
            "source": parts["source"] or "fleetgate",
            "severity": self.severity,
            "class": str(esc.get("kind", "")),
            "custom_details": parts["custom_details"],
        }
        if esc.get("created_at_iso"):
            payload["timestamp"] = esc["created_at_iso"]
        self._post(esc, "trigger", payload=payload, links=parts["links"])

    def resolve(self, esc: dict[str, Any]) -> None:
        """Resolve the escalation's alert (same dedup_key as its trigger)."""
        self._post(esc, "resolve")

    def _post(self, esc: dict[str, Any], action: str, **fields: Any) -> None:
        what = f"channel {self.name!r}: escalation {esc.get('id')!r}: {action}"
        try:
            key = dedup_key(esc)
        except ChannelError as exc:
            raise ChannelError(f"{what}: {exc}") from exc
        event = {
            "routing_key": self._key.get_secret_value(),
            "event_action": action,
            "dedup_key": key,
            "client": "fleetgate",
            **fields,
        }
        self._http.post_json(self.url, event, what=what, secrets=[self._key.get_secret_value()])

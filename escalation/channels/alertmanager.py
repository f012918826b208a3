"""The Alertmanager channel: each escalation is one alert, active until its deadline.

send() posts one alert to `{url}/api/v2/alerts`: labels {alertname="FleetgateEscalation",
escalation_id, kind, subject, fingerprint (the situation's), fleet (the `fleet` setting, else
a static `fleet` label, else "fleetgate"), journal (the journal's identity), severity, plus the
operator's static labels} (Alertmanager routes and groups on these), the annotations and
generatorURL that alertmanager.json.j2 renders (summary, description = the message, approve,
deny, deadline), startsAt = raised, endsAt = the deadline. resolve() posts the same labels with
endsAt = now, so Alertmanager ends the alert as soon as the escalation is answered or expires,
and sends its receivers the "resolved" notice.

Labels are built from the escalation alone (never from a template), so resolve() rebuilds the
exact label set, which is the alert's identity: with the fleet and the journal in it, two
controllers (two state directories, two fleets) sharing one Alertmanager never overwrite or end
each other's alerts, though their escalation ids restart at 1 alike. Label values are sanitized
(no control characters, whitespace collapsed, at most MAX_LABEL characters).

Times are Alertmanager's clock (real time, read here): an escalation whose times are not (the
simulator's virtual clock) is shown from when it is sent, for as long as people have to answer
(`alert_window`), so it arrives active rather than already ended.

Must NOT retry beyond escalation.channels.http.
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
_OURS = ("alertname", "escalation_id", "kind", "subject", "severity", "fingerprint", "journal")
DEFAULT_FLEET = "fleetgate"
SKEW_S = 300.0  # an escalation raised this far in the future is still on the wall clock


def label_value(value: Any) -> str:
    """A value fit for a label: printable, one line, whitespace collapsed, at most MAX_LABEL."""
    text = " ".join(_CONTROL.sub(" ", str(value)).split())
    return text[:MAX_LABEL] or "-"


def alert_window(esc: dict[str, Any], now: float) -> tuple[Any, Any]:
    """(startsAt, endsAt) on Alertmanager's clock (`now`, real time): the escalation's own times
    when they are on it; else (another clock: the simulator's) from `now`, for as long as
    people have to answer."""
    created, deadline = esc.get("created_at"), esc.get("deadline")
    if not all(isinstance(t, int | float) and not isinstance(t, bool) for t in (created, deadline)):
        return esc.get("created_at_iso"), esc.get("deadline_iso")
    raised, due = float(created), float(deadline)  # type: ignore[arg-type]
    if raised <= now + SKEW_S and due > now:
        return esc.get("created_at_iso"), esc.get("deadline_iso")
    return iso8601(now), iso8601(now + max(60.0, due - raised))


def fleet_name(fleet: str | None, labels: Mapping[str, str]) -> str:
    """The fleet label: the `fleet` setting, else a static `fleet` label, else DEFAULT_FLEET."""
    if fleet is not None and "fleet" in labels and labels["fleet"] != fleet:
        raise ValueError(f"Alertmanager fleet {fleet!r} and the static label fleet="
                         f"{labels['fleet']!r} disagree: give the fleet's name once")  # fmt: skip
    name = fleet if fleet is not None else labels.get("fleet", DEFAULT_FLEET)
    if not label_value(name).strip("-"):
        raise ValueError(f"Alertmanager fleet must name the fleet, got {fleet!r}")
    return name


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

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True, strict=True)

    type: Literal["alertmanager"] = "alertmanager"
    url: HttpUrl = Field(description="Alertmanager's base URL, e.g. http://alertmanager:9093")
    severity: str = Field("warning", min_length=1, description="the alerts' severity label")
    fleet: str | None = Field(
        None, min_length=1, max_length=MAX_LABEL, description="the fleet's name, label `fleet` "
        f"of every alert (default: a static `fleet` label, else {DEFAULT_FLEET})"
    )  # fmt: skip
    labels: dict[str, str] = Field(default_factory=dict, description="static labels to add")
    headers: dict[str, Secret] = Field(default_factory=dict, description="e.g. Authorization")

    @model_validator(mode="after")
    def _usable(self) -> AlertmanagerSettings:
        check_labels(self.labels)
        fleet_name(self.fleet, self.labels)
        return self


class AlertmanagerChannel:
    """One Alertmanager alert per escalation: posted by send(), ended by resolve()."""

    template = "alertmanager.json.j2"

    def __init__(
        self,
        url: str,
        *,
        severity: str = "warning",
        fleet: str | None = None,
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
        self.fleet = label_value(fleet_name(fleet, extra))
        self._extra = {key: label_value(value) for key, value in extra.items()}
        self._headers = dict(headers or {})
        self._http = http or HttpClient()
        self._clock = clock

    def __repr__(self) -> str:
        return f"AlertmanagerChannel(name={self.name!r}, url={self.url!r})"

    def labels(self, esc: dict[str, Any]) -> dict[str, str]:
        """The alert's identity: the same for send() and resolve() of one escalation."""
        missing = [key for key in ("id", "kind", "subject", "fingerprint", "journal_id")
                   if esc.get(key) in (None, "")]  # fmt: skip
        if missing:
            raise ChannelError(
                f"channel {self.name!r}: escalation {esc.get('id')!r} lacks {missing!r}"
            )
        ours = {
            "alertname": ALERTNAME,
            "escalation_id": label_value(esc["id"]),
            "kind": label_value(esc["kind"]),
            "subject": label_value(esc["subject"]),
            "fingerprint": label_value(esc["fingerprint"]),
            "journal": label_value(esc["journal_id"]),
            "severity": self.severity,
        }
        return {**self._extra, "fleet": self.fleet, **ours}

    def send(self, esc: dict[str, Any], text: str) -> None:
        what = f"channel {self.name!r}: escalation {esc.get('id')!r}"
        parts = rendered_object(text, what=what, template=self.template)
        require(parts, {"annotations": dict, "generatorURL": (str, type(None))}, what)
        annotations = {key: str(value) for key, value in parts["annotations"].items()}
        if "description" in annotations:
            annotations["description"] = annotations["description"][:MAX_DESCRIPTION]
        starts, ends = alert_window(esc, self._clock())
        alert: dict[str, Any] = {
            "labels": self.labels(esc),
            "annotations": annotations,
            "startsAt": starts,
            "endsAt": ends,
        }
        if parts["generatorURL"]:
            alert["generatorURL"] = parts["generatorURL"]
        self._post([{k: v for k, v in alert.items() if v is not None}], what)

    def resolve(self, esc: dict[str, Any]) -> None:
        """End the escalation's alert now (answered or expired)."""
        what = f"channel {self.name!r}: escalation {esc.get('id')!r}: resolve"
        status = esc.get("ended") or esc.get("status") or "answered"
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

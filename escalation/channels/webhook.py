"""The generic webhook channel: one JSON POST per escalation to a URL of the operator's.

The body is what webhook.json.j2 renders: by default {"id", "kind", "subject", "summary",
"fingerprint", "created_at", "deadline", "proposals", "default_action", "how", "message"},
where `how` holds the approve/deny commands (and HTTP calls) and `message` is the text of
message.txt.j2. The body comes from a template because a channel gets `how` only through its
rendering, and so that operators can fit another receiver without code.

The URL and the header values are secrets (a webhook URL is often its own credential): they
never appear in a repr, a log line or an error. Must NOT retry beyond escalation.channels.http.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from controller.core.fields import Secret, SecretHttpUrl
from escalation.channels.http import HttpClient, rendered_object


class WebhookSettings(BaseModel):
    """A `{type: webhook}` entry of `escalation.channels`."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True, strict=True)

    type: Literal["webhook"] = "webhook"
    url: SecretHttpUrl = Field(description="where to POST (a secret: often its own credential)")
    headers: dict[str, Secret] = Field(
        default_factory=dict, description="extra request headers, e.g. Authorization (secrets)"
    )


class WebhookChannel:
    """POSTs the rendered webhook.json.j2 object to `url` with `headers`."""

    template = "webhook.json.j2"
    notice_template = "notice_webhook.json.j2"

    def __init__(
        self,
        url: SecretStr,
        headers: Mapping[str, SecretStr] | None = None,
        *,
        name: str = "webhook",
        http: HttpClient | None = None,
    ) -> None:
        self.name = name
        self._url = url
        self._headers = dict(headers or {})
        self._http = http or HttpClient()

    def __repr__(self) -> str:
        return f"WebhookChannel(name={self.name!r}, url=SecretStr('**********'))"

    def send(self, esc: dict[str, Any], text: str) -> None:
        what = f"channel {self.name!r}: escalation {esc.get('id')!r}"
        payload = rendered_object(text, what=what, template=self.template)
        headers = {key: value.get_secret_value() for key, value in self._headers.items()}
        self._http.post_json(self._url.get_secret_value(), payload, headers=headers, what=what)

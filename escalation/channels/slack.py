"""The Slack channel: an incoming-webhook message with Block Kit blocks.

The payload is what slack.json.j2 renders (a jinja2 template producing JSON): `text` (the
notification line and the fallback where blocks are not shown) and `blocks` (header, summary,
evidence, proposal, and a context block with the approve/deny commands and the deadline). The
channel checks the render is a JSON object with those two keys before it posts: an operator's
template that produced broken JSON is a ChannelError naming the template, not a 400 from Slack.

The webhook URL is a secret (whoever has it can post to the channel): never shown beyond
https://hooks.slack.com/…. Must NOT build blocks in code; layout belongs to the template.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from controller.core.fields import SecretHttpUrl
from escalation.channels.http import HttpClient, rendered_object, require


class SlackSettings(BaseModel):
    """A `{type: slack}` entry of `escalation.channels`."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True, strict=True)

    type: Literal["slack"] = "slack"
    webhook_url: SecretHttpUrl = Field(description="the incoming webhook's URL (a secret)")


class SlackChannel:
    """POSTs the rendered slack.json.j2 payload to a Slack incoming webhook."""

    template = "slack.json.j2"
    notice_template = "notice_slack.json.j2"

    def __init__(
        self, webhook_url: SecretStr, *, name: str = "slack", http: HttpClient | None = None
    ) -> None:
        self.name = name
        self._url = webhook_url
        self._http = http or HttpClient()

    def __repr__(self) -> str:
        return f"SlackChannel(name={self.name!r}, webhook_url=SecretStr('**********'))"

    def send(self, esc: dict[str, Any], text: str) -> None:
        what = f"channel {self.name!r}: escalation {esc.get('id')!r}"
        payload = rendered_object(text, what=what, template=self.template)
        require(payload, {"text": str, "blocks": list}, what)
        self._http.post_json(self._url.get_secret_value(), payload, what=what)

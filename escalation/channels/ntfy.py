"""The ntfy channel: a push notification to phones, with Approve and Deny buttons.

One JSON publish to the server's root URL with the topic, the title, the short message, the tags
and the click link (the escalation's page) that ntfy.json.j2 renders, the priority, and, when
the controller's HTTP API is configured (how.answer_url) and its token was given as
`answer_token`, two `http` action buttons that POST {"decision": "approve"} or
{"decision": "deny"} to the answer URL with
`Authorization: Bearer <that escalation's answer capability>`. Without both there are no
buttons; the message still carries the CLI commands.

The buttons never hold the API token itself: each holds `escalation.capabilities.answer_capability`,
an HMAC that can give that one answer (Approve: the proposal the message shows; Deny) to that one
escalation of that journal until its deadline, and nothing else. It still
travels inside the notification (ntfy keeps it in its cache, and every subscriber of the topic
can read it and so answer that escalation): give ntfy a topic with access control. The access
token, the answer token and capability, and the topic never appear in a log line or an error.
Must NOT retry beyond escalation.channels.http.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from controller.core.fields import HttpUrl, Secret
from escalation.capabilities import answer_capability
from escalation.channels.http import HttpClient, rendered_object, require

MAX_MESSAGE_BYTES = 4000  # ntfy turns a message over 4096 bytes into an attachment, or refuses it
_CUT = "\n… (cut; the full message is in the other channels)"
TOPIC = re.compile(r"[-_A-Za-z0-9]{1,64}\Z")  # what an ntfy server takes as a topic
RESERVED = ("docs", "static", "file", "app", "metrics", "account", "settings", "signup",
            "login", "v1")  # fmt: skip


def cap_bytes(text: str, limit: int) -> str:
    """`text` cut to at most `limit` UTF-8 bytes (never inside a character), marked if cut."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    room = limit - len(_CUT.encode("utf-8"))
    return data[:room].decode("utf-8", errors="ignore") + _CUT


def check_ntfy(url: str, topic: str, priority: int) -> None:
    """ValueError unless `url`, `topic` and `priority` are usable (the settings' and the class's
    check). ntfy takes a JSON publish only at its root: posted to /<topic>, the JSON is itself
    the message, sent as text without title, priority or buttons. The errors never quote the
    topic (a secret) nor the URL's path (which may be one)."""
    if not 1 <= priority <= 5:
        raise ValueError(f"ntfy priority must be 1 (min) to 5 (max), got {priority!r}")
    if not topic:
        raise ValueError("ntfy topic must not be empty")
    if not TOPIC.match(topic):
        odd = sorted({c for c in topic if not TOPIC.match(c)})
        raise ValueError(f"ntfy topic must be 1 to 64 letters, digits, - and _ (ntfy refuses"
                         f" others), got {len(topic)} characters"
                         f"{', with ' + repr(''.join(odd)) if odd else ''}")  # fmt: skip
    if topic in RESERVED:  # ntfy's own paths: every ntfy server refuses them as topics
        raise ValueError(f"ntfy topic {topic!r} is one of ntfy's own paths, which it refuses as"
                         f" a topic: {', '.join(RESERVED)}")  # fmt: skip
    try:
        path = urlsplit(url).path
    except ValueError:
        path = ""
    if path.strip("/"):
        raise ValueError("ntfy url must be the server alone (e.g. https://ntfy.example.org),"
                         " without a path: the topic goes in `topic`")  # fmt: skip


class NtfySettings(BaseModel):
    """A `{type: ntfy}` entry of `escalation.channels`."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True, strict=True)

    type: Literal["ntfy"] = "ntfy"
    url: HttpUrl = Field(description="the ntfy server, e.g. https://ntfy.example.org (no path)")
    topic: str = Field(description="letters, digits, - and _ (at most 64); give it access "
                       "control: its subscribers can answer")  # fmt: skip
    token: Secret | None = Field(None, description="ntfy access token")
    priority: int = Field(4, description="1 (min) to 5 (max)")

    @model_validator(mode="after")
    def _usable(self) -> NtfySettings:
        check_ntfy(self.url, self.topic, self.priority)
        return self


class NtfyChannel:
    """Publishes each escalation to `topic` on the ntfy server at `url`."""

    template = "ntfy.json.j2"
    notice_template = "notice_ntfy.json.j2"

    def __init__(
        self,
        url: str,
        topic: str,
        token: SecretStr | None = None,
        priority: int = 4,
        *,
        answer_token: SecretStr | None = None,
        name: str = "ntfy",
        http: HttpClient | None = None,
    ) -> None:
        check_ntfy(url, topic, priority)
        self.name = name
        self.url = url
        self._topic = topic
        self._token = token
        self.priority = priority
        self._answer_token = answer_token
        self._http = http or HttpClient()

    def __repr__(self) -> str:
        return f"NtfyChannel(name={self.name!r}, priority={self.priority!r})"

    def send(self, esc: dict[str, Any], text: str) -> None:
        what = f"channel {self.name!r}: escalation {esc.get('id')!r}"
        parts = rendered_object(text, what=what, template=self.template)
        require(
            parts,
            {"title": str, "message": str, "tags": list, "answer_url": (str, type(None))},
            what,
        )
        click = parts.get("click")
        payload: dict[str, Any] = {
            "topic": self._topic,
            "title": parts["title"],
            "message": cap_bytes(parts["message"], MAX_MESSAGE_BYTES),
            "priority": self.priority,
            "tags": [str(tag) for tag in parts["tags"]],
        }
        if isinstance(click, str) and click:
            payload["click"] = click
        actions = self._buttons(parts["answer_url"], esc)
        if actions:
            payload["actions"] = actions
        headers = (
            {"Authorization": f"Bearer {self._token.get_secret_value()}"} if self._token else {}
        )
        secrets = [self._topic, *self._secret_values(), *_bearers(actions)]
        self._http.post_json(self.url, payload, headers=headers, what=what, secrets=secrets)

    def _buttons(self, answer_url: str | None, esc: dict[str, Any]) -> list[dict[str, Any]]:
        esc_id, journal_id, deadline = esc.get("id"), esc.get("journal_id"), esc.get("deadline")
        if (
            not answer_url
            or self._answer_token is None
            or not isinstance(esc_id, int)
            or not isinstance(journal_id, str)
            or not isinstance(deadline, int | float)
        ):
            return []
        return [
            {
                "action": "http",
                "label": label,
                "url": answer_url,
                "method": "POST",
                "headers": {
                    "Authorization": "Bearer "
                    + answer_capability(
                        self._answer_token,
                        esc_id,
                        journal_id=journal_id,
                        choice=decision,
                        expires=deadline,
                    ),
                    "Content-Type": "application/json",
                },
                "body": json.dumps({"decision": decision}),
                "clear": True,
            }
            for label, decision in (("Approve", "approve"), ("Deny", "deny"))
            if decision == "deny" or esc.get("proposals")  # no proposal: nothing to approve
        ]

    def _secret_values(self) -> list[str]:
        return [s.get_secret_value() for s in (self._token, self._answer_token) if s is not None]


def _bearers(actions: list[dict[str, Any]]) -> list[str]:
    return [a["headers"]["Authorization"].removeprefix("Bearer ") for a in actions]

"""The one HTTP seam of the channels: POST JSON with timeouts, bounded retries and no leaks.

Every HTTP channel (webhook, Slack, ntfy, PagerDuty, Alertmanager) sends through `post_json`
over a `requests.Session` that is passed in, so tests and callers choose the session, and
through `rendered_object` reads the JSON its template produced.

A 2xx is a delivery, also when the body after it is cut off, trickles or floods (nothing
reads it; sending again would deliver twice).

Retried, with exponential backoff (backoff_s, 2*backoff_s, ...; a Retry-After header of up to
MAX_RETRY_AFTER_S is honoured): connection errors, timeouts, 429 and 5xx. Not retried: any
other 4xx and redirects (the far end refused this request; sending it again will not help),
and a malformed URL or header. After the retries, or at once for those, a ChannelError.

Error messages and log lines NEVER contain the URL beyond scheme://host:port (webhook URLs
and ntfy topics are secrets), header values (tokens), or any string the caller names in
`secrets`; the requests exception, whose text holds the full URL, is not chained.

A response's body is read within twice the timeout and up to MAX_BODY bytes (`read_body`): an
endpoint that trickles a byte at a time, or answers with gigabytes, is a failed attempt
(unless its status was a 2xx, above).

This module must NOT know any channel's payload, read settings, or retry for long: a channel
is called inside a tick, and the defaults keep a dead endpoint to about 16 seconds (about 36
for one that trickles).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import requests

from controller.fleet.retry import BodyError, read_body, reason, retry_delay
from escalation.channels.base import ChannelError

log = logging.getLogger(__name__)

_SNIPPET = 200  # characters of a refusing response body quoted in the error
MAX_BODY = 64 * 1024  # bytes of a response read (a channel needs a status, a short reply)

Sleep = Callable[[float], None]
_BAD_REQUEST = (
    requests.exceptions.InvalidURL,
    requests.exceptions.MissingSchema,
    requests.exceptions.InvalidSchema,
    requests.exceptions.InvalidHeader,
)


def redact_url(url: str) -> str:
    """`scheme://host:port/…`: where a request went, without the secret path, query or user."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(unparseable URL)"
    host = f"[{host}]" if ":" in host else host
    rest = "/…" if parts.path.strip("/") or parts.query or parts.fragment else "/"
    return f"{parts.scheme or '?'}://{host}{port}{rest}"


def scrub(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret (of 4 characters or more) replaced by `***`, as written and as
    a far end may echo it: JSON-escaped (`\\/` for `/`, as PHP writes it) or percent-encoded."""
    forms: set[str] = set()
    for secret in (s for s in secrets if len(s) >= 4):
        escaped = json.dumps(secret)[1:-1]
        forms |= {secret, escaped, escaped.replace("/", "\\/"), quote(secret, safe=""),
                  quote(secret)}  # fmt: skip
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, "***")
    return text


def _url_secrets(url: str) -> list[str]:
    """The parts of a URL that must not be shown: the URL itself, its path, query, user info."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    userinfo = parts.netloc.rpartition("@")[0]
    return [url, parts.path, parts.query, parts.fragment, userinfo]


def _snippet(response: requests.Response, hidden: Iterable[str]) -> str:
    """The start of a refusal's body, the secrets taken out of all of it before it is cut (a
    secret cut in half is no longer found)."""
    text = " ".join(scrub(response.text, hidden).split())
    return f": {text[:_SNIPPET]}" if text else ""


def post_json(
    session: requests.Session,
    url: str,
    payload: Any,
    *,
    timeout_s: float,
    retries: int,
    backoff_s: float,
    headers: Mapping[str, str] | None = None,
    sleep: Sleep = time.sleep,
    what: str = "",
    secrets: Iterable[str] = (),
) -> requests.Response:
    """POST `payload` as JSON; the 2xx response, or ChannelError (see the module docstring).

    `what` prefixes every message (e.g. "channel 'slack': escalation 12"); `secrets` are
    extra strings (routing keys, tokens in the payload) scrubbed from messages.
    """
    hidden = [*_url_secrets(url), *(headers or {}).values(), *secrets]
    where = f"{what + ': ' if what else ''}POST {redact_url(url)}"
    body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    for attempt in range(retries + 1):
        response: requests.Response | None = None
        try:
            response = session.post(url, data=body, headers=all_headers, timeout=timeout_s,
                                    allow_redirects=False, stream=True)  # fmt: skip
            read_body(response, limit=MAX_BODY, within_s=2 * timeout_s)
        except _BAD_REQUEST as exc:  # a malformed URL or header: no retry will mend it
            raise ChannelError(scrub(f"{where}: {type(exc).__name__}", hidden)) from None
        except requests.RequestException as exc:
            problem = reason(exc)
        except BodyError as exc:  # a trickle, or a flood: as a timeout, tried again
            if response is not None and response.status_code < 300:
                # the far end said it took the message; nothing here reads what follows, and
                # sending it again would deliver it twice
                log.warning("%s", scrub(f"{where}: HTTP {response.status_code}, then {exc}; "
                                        "taken as delivered, not sent again", hidden))  # fmt: skip
                return response
            problem, response = str(exc), None
        else:
            if response.status_code < 300:
                return response
            problem = f"HTTP {response.status_code} {response.reason or ''}".rstrip()
            if response.status_code != 429 and response.status_code < 500:
                raise ChannelError(scrub(f"{where}: {problem}{_snippet(response, hidden)}", hidden))
        if attempt == retries:
            break
        delay = retry_delay(response, attempt, backoff_s)
        log.warning(
            "%s",
            scrub(f"{where}: {problem}; retry {attempt + 1} of {retries} in {delay:g}s", hidden),
        )
        sleep(delay)
    raise ChannelError(scrub(f"{where}: {problem} (gave up after {retries + 1} attempts)", hidden))


@dataclass(frozen=True)
class HttpClient:
    """A session and its limits, passed to every HTTP channel (tests pass their own).

    timeout_s: connect and read timeout of each attempt.
    retries:   attempts after the first, for connection errors, timeouts, 429 and 5xx.
    backoff_s: the wait before the first retry; it doubles for each further one.
    sleep:     how to wait (tests pass a recorder; nothing here sleeps otherwise).
    """

    session: requests.Session = field(default_factory=requests.Session)
    timeout_s: float = 5.0
    retries: int = 2
    backoff_s: float = 0.5
    sleep: Sleep = time.sleep

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0:
            raise ValueError(
                f"HttpClient: timeout_s must be > 0, retries and backoff_s >= 0 (got"
                f" timeout_s={self.timeout_s!r}, retries={self.retries!r},"
                f" backoff_s={self.backoff_s!r})"
            )

    def post_json(
        self,
        url: str,
        payload: Any,
        *,
        headers: Mapping[str, str] | None = None,
        what: str = "",
        secrets: Iterable[str] = (),
    ) -> requests.Response:
        return post_json(
            self.session, url, payload, timeout_s=self.timeout_s, retries=self.retries,
            backoff_s=self.backoff_s, headers=headers, sleep=self.sleep, what=what,
            secrets=secrets,
        )  # fmt: skip


def rendered_object(text: str, *, what: str, template: str) -> dict[str, Any]:
    """The JSON object a channel's template rendered; ChannelError if it is not one."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ChannelError(
            f"{what}: template {template!r} did not produce JSON: {exc} (starts with {text[:60]!r})"
        ) from exc
    if not isinstance(value, dict):
        raise ChannelError(
            f"{what}: template {template!r} produced {type(value).__name__}, not a JSON object"
        )
    return value


def require(
    obj: Mapping[str, Any], types: Mapping[str, type | tuple[type, ...]], what: str
) -> None:
    """ChannelError unless each key of `types` is in `obj` with a value of that type."""
    bad = [
        f"{key!r} ({'missing' if key not in obj else type(obj[key]).__name__})"
        for key, expected in types.items()
        if not isinstance(obj.get(key), expected)
    ]
    if bad:
        raise ChannelError(f"{what}: the rendered payload has a wrong or missing {', '.join(bad)}")

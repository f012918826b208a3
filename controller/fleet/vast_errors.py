"""The vast.ai client's errors, and how an HTTP answer from vast becomes one.

Messages are built from ids with !r and never hold the API key (`error_fields` scrubs it from
what vast said):

    ProviderError
     ├── TemporaryProviderError
     │    ├── NotDone                refused before acting (429) or never sent
     │    └── CreateOutcomeUnknown   the create may have happened: look for its label
     └── PermanentProviderError
          └── OfferGone              the offer was taken; nothing was created
    SensorError                      list_instances: the listing is unknown, never "empty"

Pure: reads the responses it is given and sends nothing.
"""

from __future__ import annotations

import requests

from controller.fleet import base
from controller.fleet.base import (
    NotDone,
    PermanentProviderError,
    ProviderError,
    TemporaryProviderError,
)

_SNIPPET = 160


class OfferGone(PermanentProviderError):
    """vast answered `no_such_ask`: somebody else rented the offer. Nothing was created."""

    def __init__(self, offer_id: int, label: str) -> None:
        super().__init__(f"offer {offer_id!r} is gone (no_such_ask); label {label!r} not created")
        self.offer_id = offer_id
        self.label = label


class CreateOutcomeUnknown(base.CreateOutcomeUnknown):
    """The create may have reached vast: an instance labelled `label` may exist (and bill)."""

    def __init__(self, offer_id: int, label: str, reason: str) -> None:
        super().__init__(label, f"create on offer {offer_id!r}: {reason}")
        self.offer_id = offer_id


def key_refused(what: str, code: int) -> PermanentProviderError:
    """vast refused the key: wrong or revoked (401), or without the permission (403). It does
    not mend itself, so the message says where the key comes from."""
    why = "a key without the permission for this call" if code == 403 else "a wrong or revoked key"
    return PermanentProviderError(
        f"{what}: vast refused the API key (HTTP {code}: {why}); check vast.api_key in the "
        "config and the key in vast's console; nothing changes until it is fixed"
    )


def http_error(response: requests.Response, what: str, key: str) -> ProviderError:
    """The error for a non-2xx answer to `what`: temporary for 429 and 5xx, else permanent."""
    code = response.status_code
    says = fields_text(error_fields(response, key))
    if code in (401, 403):
        return key_refused(what, code)
    if code == 410:
        return PermanentProviderError(f"{what}: HTTP 410 Gone (the endpoint is retired){says}")
    if code == 429:
        return NotDone(f"{what}: HTTP {code}{says}")
    if code >= 500:
        return TemporaryProviderError(f"{what}: HTTP {code}{says}")
    if code == 404:
        return PermanentProviderError(f"{what}: HTTP 404 not found{says}")
    return PermanentProviderError(f"{what}: vast refused (HTTP {code}){says}")


def error_fields(response: requests.Response, key: str) -> str:
    """vast's `error` and `msg`/`message` (or the start of a plain-text body), one line.

    Scrubbed of the API key: this text goes into exception messages."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict):
        parts = [str(data[k]) for k in ("error", "msg", "message") if data.get(k)]
        text = ": ".join(parts)
    else:
        text = response.text[: _SNIPPET * 2]
    if len(key) >= 4:
        text = text.replace(key, "***")
    return " ".join(text.split())[:_SNIPPET]


def fields_text(fields: str) -> str:
    """`fields` as the tail of a message: ": <fields>", or nothing when vast said nothing."""
    return f": {fields}" if fields else ""

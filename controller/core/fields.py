"""Field types the settings models share: secrets and http(s) URLs.

A secret field holds a `pydantic.SecretStr` (never shown in a repr, a log line or an error).
Code hands one in as a value; a config file names where it lives (`{env: NAME}` or
`{file: PATH}`), and the config loader, which validates with a resolver under `RESOLVER` in
the validation context, turns that reference into the value. This module reads neither the
environment nor a file: resolving is the resolver's.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, SecretStr, ValidationInfo

RESOLVER = "secret_resolver"  # the validation context's key for the secret resolver
_HTTP = re.compile(r"^https?://[^/?#\s]+")


def _resolve(value: object, info: ValidationInfo) -> object:
    """A reference resolved by the context's resolver; a value as it is."""
    resolver = (info.context or {}).get(RESOLVER)
    if resolver is None or isinstance(value, SecretStr):
        return value
    return resolver(value)


def _http_url(value: str) -> str:
    if not _HTTP.match(value):
        raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
    return value.rstrip("/")


def _secret_http_url(value: SecretStr) -> SecretStr:
    if not _HTTP.match(value.get_secret_value()):
        raise ValueError("expected an http:// or https:// URL (a secret: its value is not shown)")
    return value


Secret = Annotated[SecretStr, BeforeValidator(_resolve)]
"""A secret: a SecretStr in code, `{env: NAME}` or `{file: PATH}` in a config file."""

HttpUrl = Annotated[str, AfterValidator(_http_url)]
"""An http:// or https:// URL with a host, without a trailing slash."""

SecretHttpUrl = Annotated[SecretStr, BeforeValidator(_resolve), AfterValidator(_secret_http_url)]
"""A URL that is itself a credential (a webhook's): a Secret that must be http(s)."""


def is_digits(text: str) -> bool:
    """Whether `text` is ASCII digits only: `str.isdigit` also takes "²" (which `int` refuses)
    and "٥٠٠١" (which `int` reads as 5001)."""
    return text.isascii() and text.isdigit()

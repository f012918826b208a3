"""What every HTTP client here shares: how long to wait before a retry, and how to say why a
request failed without quoting its URL (which may hold a secret: a webhook path, a token)."""

from __future__ import annotations

import re

import requests

MAX_RETRY_AFTER_S = 30.0  # the longest Retry-After honoured
_ERRNO = re.compile(r"\[Errno -?\d+\][^'\")]*")


def reason(exc: requests.RequestException) -> str:
    """Why a request failed, short and without the URL (requests puts the URL in its text)."""
    if isinstance(exc, requests.Timeout):
        return "timed out"
    found = _ERRNO.search(str(exc))
    if found:
        return f"{type(exc).__name__}: {found.group(0).strip()}"
    return type(exc).__name__


def retry_delay(response: requests.Response | None, attempt: int, backoff_s: float) -> float:
    """Exponential backoff, or the server's Retry-After (capped) when it asks for longer."""
    delay = backoff_s * 2.0**attempt
    header = response.headers.get("Retry-After", "") if response is not None else ""
    try:
        return max(delay, min(float(header), MAX_RETRY_AFTER_S))
    except ValueError:
        return delay

"""What every HTTP client here shares: how long to wait before a retry, how to say why a
request failed without quoting its URL (which may hold a secret: a webhook path, a token), and
how to read a response's body within a size and a time."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from datetime import UTC
from email.utils import parsedate_to_datetime

import requests
import urllib3.exceptions

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


def retry_after(response: requests.Response | None,
                wall: Callable[[], float] = time.time) -> float | None:  # fmt: skip
    """The seconds a response's Retry-After asks for: a number of seconds or an HTTP date
    (RFC 9110 10.2.3; a date in the past asks for none), by `wall`, the host's clock, which
    the server's date is on. None without one, or one that is neither."""
    header = response.headers.get("Retry-After", "").strip() if response is not None else ""
    if not header:
        return None
    try:
        seconds = float(header)
    except ValueError:
        try:
            when = parsedate_to_datetime(header)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:  # asctime's form has no zone: an HTTP date is always GMT
            when = when.replace(tzinfo=UTC)
        return float(max(0, math.ceil(when.timestamp() - wall())))  # (the date is whole seconds)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def retry_delay(response: requests.Response | None, attempt: int, backoff_s: float) -> float:
    """Exponential backoff, or the server's Retry-After (capped) when it asks for longer."""
    delay = backoff_s * 2.0**attempt
    asked = retry_after(response)
    return delay if asked is None else max(delay, min(asked, MAX_RETRY_AFTER_S))


class BodyError(Exception):
    """A response body over its size or time bound (the connection is closed)."""


def read_body(response: requests.Response, *, limit: int, within_s: float,
              clock: Callable[[], float] = time.monotonic) -> bytes:  # fmt: skip
    """The body of a `stream=True` response: at most `limit` bytes, all of it within
    `within_s` seconds. A read timeout bounds each wait for a byte, not the whole body: a
    server that sends one byte a second would otherwise hold the reader for as long as it
    likes, and one that sends gigabytes would fill memory. The body becomes the response's
    content (`.text`, `.json()`); BodyError otherwise, also for a body that stops coming
    within the timeout or is cut off: urllib3 raises its own errors there, not requests'."""
    deadline = clock() + within_s
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            if clock() > deadline:
                raise BodyError(f"the response took over {within_s:g} s to arrive")
            try:
                chunk = response.raw.read1(65536, decode_content=True)  # one receive at most
            except urllib3.exceptions.TimeoutError as exc:
                raise BodyError("the response stopped arriving (timed out)") from exc
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise BodyError(f"the response broke off ({type(exc).__name__})") from exc
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise BodyError(f"the response is over {limit} bytes")
            chunks.append(chunk)
    except BodyError:
        response.close()
        raise
    data = b"".join(chunks)
    response._content = data  # noqa: SLF001 - what requests reads `.text` and `.json()` from
    return data

"""The HTTP API's front door: an ASGI middleware that runs before any route reads a byte of
the body.

1. the request's path and `Authorization` header go to a `Policy`, which answers a refusal
   (401, 404) or nothing: a caller without the token is refused before its body is read;
2. a declared `Content-Length` over the path's cap is refused with 413 at once;
3. the body is then counted as the route reads it; the chunk that crosses the cap ends the
   read and the answer is 413, so no route ever holds more than the cap.

Refusals carry `Connection: close`: the server stops reading the rest of an upload instead of
draining it. Their bodies name the problem, never the input.

A path `cross_origin` names may be called by a page of another origin (the ntfy web app's
buttons, a `fetch` with an `Authorization` header): its browser's preflight (OPTIONS, no
token) is answered here, allowing POST with those headers, and every answer to such a request
(refusals too) allows any origin to read it. Nothing is opened by it: the caller still needs
a bearer token or capability, which a browser never adds by itself.

This module decides nothing about the fleet and touches no store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controller.core.fields import is_digits

MAX_ID = 2**63 - 1  # the largest id a journal row can have (SQLite and PostgreSQL BIGINT)
_INT = re.compile(r"^-?[0-9]+$")


@dataclass(frozen=True)
class Refusal:
    status: int
    detail: str


# path, Authorization header -> a refusal, or None to let the request through
Policy = Callable[[str, str], Refusal | None]
# path -> the most body bytes a request to it may carry
Cap = Callable[[str], int]
_PREFLIGHT = [(b"access-control-allow-origin", b"*"), (b"access-control-allow-methods", b"POST"),
              (b"access-control-allow-headers", b"authorization, content-type"),
              (b"access-control-max-age", b"600")]  # fmt: skip


def bad_id(segment: str) -> bool:
    """Whether a path segment that should be a row id is one no row can have (a number
    below 1 or beyond 2**63-1): such an id names nothing."""
    if not _INT.match(segment):
        return False
    digits = segment.lstrip("-").lstrip("0")
    return segment.startswith("-") or len(digits) > 19 or not 1 <= int(digits or "0") <= MAX_ID


def bearer(authorization: str) -> str:
    scheme, _, given = authorization.partition(" ")
    return given if scheme.lower() == "bearer" else ""


class TooLarge(Exception):
    """The body crossed its cap while a route was reading it."""


class Guard:
    """The middleware: `policy` before the body, `cap` on it."""

    def __init__(self, app: ASGIApp, policy: Policy, cap: Cap,
                 cross_origin: Callable[[str], bool] = lambda _path: False) -> None:  # fmt: skip
        self.app, self.policy, self.cap, self.cross_origin = app, policy, cap, cross_origin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}  # fmt: skip
        if "origin" in headers and self.cross_origin(path):
            if scope.get("method") == "OPTIONS" and "access-control-request-method" in headers:
                await send({"type": "http.response.start", "status": 204, "headers": _PREFLIGHT})
                await send({"type": "http.response.body", "body": b""})
                return
            send = _readable(send)
        refusal = self.policy(path, headers.get("authorization", ""))
        if refusal is not None:
            await _answer(send, refusal)
            return
        cap = self.cap(path)
        length = headers.get("content-length")
        if length is not None and (not is_digits(length) or int(length) > cap):
            await _answer(send, Refusal(413, f"body over {cap} bytes"))
            return
        await self._capped(scope, receive, send, cap)

    async def _capped(self, scope: Scope, receive: Receive, send: Send, cap: int) -> None:
        seen = 0
        over = False
        started = False

        async def counted() -> Message:
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > cap:
                    over = True
                    raise TooLarge
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            if over:  # whatever the route made of the cut body, the answer is 413
                return
            started = True
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except Exception:
            if not over:
                raise
        if over and not started:
            await _answer(send, Refusal(413, f"body over {cap} bytes"))


def _readable(send: Send) -> Send:
    """`send`, its answer readable by a page of any origin."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []),
                                              (b"access-control-allow-origin", b"*")]}  # fmt: skip
        await send(message)

    return sending


async def _answer(send: Callable[[Message], Awaitable[None]], refusal: Refusal) -> None:
    body = json.dumps({"detail": refusal.detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]  # fmt: skip
    if refusal.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

"""The agent's side of the instance API: its settings, its errors, and calls with retries.

`load_config` reads the environment: FLEETGATE_URL; the instance's own token,
FLEETGATE_INSTANCE_TOKEN (which its launch sets), or FLEETGATE_INSTANCE_TOKEN_FILE, else a fleet
shared token (FLEETGATE_FLEET_TOKEN or FLEETGATE_FLEET_TOKEN_FILE, accepted only by a
controller that opted in to one); FLEETGATE_LABEL; vast's VAST_CONTAINERLABEL. `Client.post`
sends one call with the token, refuses redirects (they would carry the token elsewhere), and
sorts what went wrong into `Unreachable` (retry later) and `Refused` (this call will not work);
`with_retries` and `loop` decide when to call again. Each error carries the agent's exit status.

Standard library only: this package is copied onto instance images.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import random
import shlex
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

VERSION = "0.1.0"
MAX_READ_BYTES = 1 << 20  # the most read at once: a reply, one pass over a log

log = logging.getLogger("fleetgate-agent")
T = TypeVar("T")


class AgentError(Exception):
    exit_code = 1


class ConfigError(AgentError):
    exit_code = 2


class Unreachable(AgentError):
    """Temporary: connection failed, timed out, or the controller answered 429 or 5xx."""

    exit_code = 3


class Refused(AgentError):
    """Permanent for this call: the controller answered another 4xx."""

    exit_code = 4

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Config:
    url: str
    token: str = field(repr=False)
    label: str
    supervisorctl: tuple[str, ...]
    program: str
    timeout_s: float
    container_label: str = ""  # vast's VAST_CONTAINERLABEL, `C.<instance id>`


def load_config(args: argparse.Namespace, environ: Mapping[str, str]) -> Config:
    url = (environ.get("FLEETGATE_URL") or "").rstrip("/")
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
        raise ConfigError("FLEETGATE_URL must be the controller's http(s)://host:port")
    token = _token(environ, "FLEETGATE_INSTANCE_TOKEN") or _token(environ, "FLEETGATE_FLEET_TOKEN")
    if not token:
        raise ConfigError(
            "set FLEETGATE_INSTANCE_TOKEN (every launch sets it; or "
            "FLEETGATE_INSTANCE_TOKEN_FILE, or a shared FLEETGATE_FLEET_TOKEN)"
        )
    label = environ.get("FLEETGATE_LABEL") or environ.get("VAST_CONTAINERLABEL") or ""
    if not label:
        raise ConfigError("set FLEETGATE_LABEL (or run where vast sets VAST_CONTAINERLABEL)")
    ctl = tuple(shlex.split(args.supervisorctl))
    if not ctl:
        raise ConfigError("--supervisorctl is empty")
    return Config(
        url, token, label, ctl, args.program, args.timeout, environ.get("VAST_CONTAINERLABEL", "")
    )


def _token(environ: Mapping[str, str], name: str) -> str:
    """$NAME, else the first line of the file $NAME_FILE names, else ""."""
    token = environ.get(name, "").strip()
    path = environ.get(name + "_FILE")
    if not token and path:
        try:
            with open(path, encoding="utf-8") as f:
                token = f.readline().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    return token


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is refused: following it would carry the fleet token to another place."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Client:
    def __init__(self, config: Config) -> None:
        self.config = config
        parts = urlsplit(config.url)
        self.where = f"{parts.scheme}://{parts.netloc}"
        self._opener = urllib.request.build_opener(_NoRedirect)

    def instance_path(self, suffix: str) -> str:
        return f"/v1/instances/{quote(self.config.label, safe='')}/{suffix}"

    def post(self, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            self.config.url + path,
            data=json.dumps(dict(body or {})).encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {self.config.token}",
                "User-Agent": f"fleetgate-agent/{VERSION}",
            },
        )
        try:
            with self._opener.open(request, timeout=self.config.timeout_s) as response:
                raw = response.read(MAX_READ_BYTES)
        except urllib.error.HTTPError as exc:
            detail = _detail(exc)
            if exc.code == 429 or exc.code >= 500:
                raise Unreachable(f"{self.where}{path}: HTTP {exc.code} {detail}") from None
            raise Refused(exc.code, f"{self.where}{path}: HTTP {exc.code} {detail}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise Unreachable(f"cannot reach the controller at {self.where}: {reason}") from None
        try:
            answer = json.loads(raw or b"{}")
        except ValueError:
            raise Unreachable(f"{self.where}{path}: the answer is not JSON") from None
        return answer if isinstance(answer, dict) else {}


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read(4096) or b"{}")
        text = body.get("detail", "") if isinstance(body, dict) else ""
    except (ValueError, OSError):
        text = ""
    return str(text)[:300] if text else str(exc.reason)


def with_retries(
    call: Callable[[], T], attempts: int, stop: threading.Event, cap_s: float = 60.0
) -> T:
    """`call()`, retried on Unreachable after 1, 2, 4, ... seconds (capped, jittered).

    Gives up with the last error after `attempts`, or at once when `stop` is set (SIGTERM).
    """
    for attempt in range(max(1, attempts)):
        try:
            return call()
        except Unreachable as exc:
            delay = min(cap_s, 2.0**attempt) * random.uniform(0.8, 1.2)
            if attempt >= attempts - 1 or stop.is_set():
                raise
            log.warning("%s; retrying in %.1fs", exc, delay)
            if stop.wait(delay):
                raise
    raise AssertionError("unreachable")


def loop(step: Callable[[], object], interval_s: float, once: bool, stop: threading.Event) -> int:
    """Run `step` every interval; after failures sooner (1, 2, 4 s, ...). Never raises."""
    failures = 0
    while True:
        try:
            step()
            failures = 0
        except AgentError as exc:
            failures += 1
            log.error("%s", exc)
            if once:
                return exc.exit_code
        except Exception as exc:  # a bug or a surprise must not end the loop
            failures += 1
            log.exception("unexpected %s", type(exc).__name__)
            if once:
                return 1
        if once:
            return 0
        delay = interval_s if not failures else min(interval_s, 2.0 ** (failures - 1))
        if stop.wait(delay * random.uniform(0.9, 1.1)):
            return 0

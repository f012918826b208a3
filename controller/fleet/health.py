"""Is the cuzk daemon on an instance alive? Ask its status server directly.

cuzk's optional HTTP status server (DOMAIN.md, "cuzk") answers `GET /status` with JSON holding
`uptime_secs`. A daemon that answers is up; its start is the probe's time (`at`, when the
request went out, on the wall clock: the uptime is the daemon's real seconds, whatever clock
paces the controller) less its uptime, and one whose start moved on restarted (the caller
compares starts across ticks: a restart between two probes, whose uptime had grown past the
last one's by the second, shows only so). The instance's public address is vast's
`public_ipaddr` and the public port is found in its `ports` mapping (`mapped_port`).

Any failure is "down" with the reason in words: refused, timed out, an HTTP error status, a body
that is not a JSON object. A short timeout keeps one dead host from holding up a tick, and
`check_many` checks a large fleet concurrently. The timeout bounds each wait for a byte, so a
host that sends its answer a byte at a time would hold a probe (and the tick) for as long as it
likes: a whole answer must come within `ANSWER_WITHIN` timeouts, or the probe is down and left
behind (its thread ends once that host stops sending).

This module must NOT decide what to do about a down daemon, nor retry: one check is one
observation, and the rules weigh observations over time.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import requests
import urllib3.exceptions
from pydantic import BaseModel, ConfigDict, Field, model_validator

from controller.core.fields import Secret, is_digits

STATUS_PORT = 9821  # the port cuzk's status server listens on inside the container
# an answer that took longer than this dates no start: its request may have waited that long
# to arrive, and the start it gives would be that much early
DATES_WITHIN_S = 2.0
MAX_STATUS_BYTES = 1 << 20
_LEFT_BEHIND: dict[str, threading.Thread] = {}  # probes given up on, by address
_LEFT_LOCK = threading.Lock()
ANSWER_WITHIN = 2.0  # timeouts a whole answer may take: one to connect, one for the rest

K = TypeVar("K")


class InstancesSettings(BaseModel):
    """How fleetgate watches its instances (the config's `instances`): the token their agents
    present, these status probes, and when a silent daemon, sidecar or agent counts as down."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True, strict=True)

    fleet_token: Secret | None = Field(
        None,
        description="a token shared by the fleet, accepted only with shared_token_opt_in "
        "(a secret; each instance has its own token without it)",
    )
    shared_token_opt_in: bool = Field(
        False,
        description="also accept fleet_token from any launched instance (weaker: any "
        "instance can then act as any other)",
    )
    health_port: int = Field(
        STATUS_PORT, gt=0, lt=65536, description="cuzk's status port in the container"
    )
    health_timeout_s: float = Field(3.0, gt=0, description="per status probe")
    health_failures_to_down: int = Field(
        2, ge=1, description="failed status probes in a row before the daemon counts as down"
    )
    health_down_after_s: float = Field(
        60.0, ge=0, description="...and spanning at least this long (a blip is not a death)"
    )
    sidecar_stale_s: float = Field(180.0, gt=0, description="Curio node silent this long: down")
    command_deadline_s: float = Field(
        300.0, gt=0, description="an agent command not picked up by then becomes a vast reboot"
    )

    @model_validator(mode="after")
    def _shared_needs_token(self) -> InstancesSettings:
        if self.shared_token_opt_in and self.fleet_token is None:
            raise ValueError("shared_token_opt_in: true needs fleet_token, the token to share")
        return self


@dataclass(frozen=True)
class DaemonHealth:
    up: bool
    uptime_s: float | None
    detail: str  # why it is down, or "" when up with an uptime
    # when the request went out, on the clock that probed (not compared: the same answer is
    # equal whenever it came)
    at: float | None = field(default=None, compare=False)

    @property
    def started_at(self) -> float | None:
        """When the daemon started, on the probing clock: the probe's time less its uptime.

        Never more than a second late (the uptime is whole seconds, counted after the request
        left), early by however long the request took to arrive (`check_daemon` times only an
        answer that came within `DATES_WITHIN_S`)."""
        if self.at is None or self.uptime_s is None:
            return None
        return self.at - self.uptime_s


def mapped_port(ports: Mapping[str, Any] | None, internal: int = STATUS_PORT) -> int | None:
    """The public port vast maps to TCP port `internal`, from an instance's `ports` field.

    `{"9821/tcp": [{"HostIp": "0.0.0.0", "HostPort": "40123"}]}` -> 40123. An IPv4 binding is
    preferred over an IPv6 one; a missing, empty or malformed entry is None.
    """
    if not isinstance(ports, Mapping):
        return None
    bindings = ports.get(f"{internal}/tcp", ports.get(str(internal)))
    if not isinstance(bindings, list):
        return None
    found: list[tuple[bool, int]] = []
    for b in bindings:
        port = str(b.get("HostPort", "")) if isinstance(b, Mapping) else ""
        if is_digits(port) and 0 < int(port) < 65536:
            found.append((":" in str(b.get("HostIp", "")), int(port)))
    return min(found)[1] if found else None


def status_target(
    instance: Mapping[str, Any], internal: int = STATUS_PORT
) -> tuple[str, int] | None:
    """(public address, public port) of a vast instance's status server, if it has both."""
    host, port = instance.get("public_ipaddr"), mapped_port(instance.get("ports"), internal)
    host = host.strip() if isinstance(host, str) else ""
    return (host, port) if host and port else None


def own_targets(targets: Mapping[K, tuple[str, int]]) -> tuple[dict[K, tuple[str, int]],
                                                              list[list[K]]]:  # fmt: skip
    """(the targets that are one instance's alone, the groups of keys that share one).

    cuzk's `/status` does not say whose daemon answers: where vast maps the status port of two
    instances to one public address and port, the answer is at most one's, and counting it
    for both would read a dead daemon as up. Those are not probed (their health is unknown)."""
    by_target: dict[tuple[str, int], list[K]] = {}
    for key, target in targets.items():
        by_target.setdefault(target, []).append(key)
    shared = [keys for keys in by_target.values() if len(keys) > 1]
    return {k: t for k, t in targets.items() if len(by_target[t]) == 1}, shared


def check_daemon(
    host: str,
    port: int,
    timeout_s: float,
    session: requests.Session,
    clock: Callable[[], float] = time.time,
) -> DaemonHealth:
    """One `GET /status`: up with cuzk's uptime and when it was asked (`clock`, read as the
    request goes out; none when the answer took over `DATES_WITHIN_S`), or down with the
    reason."""
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    with _LEFT_LOCK:
        left = _LEFT_BEHIND.get(netloc)
        if left is not None and left.is_alive():
            # a host still sending its last answer gets no second probe: one thread a host
            # at most, however long it keeps sending
            return DaemonHealth(False, None, f"{netloc} is still sending its answer to an "
                                             "earlier probe")  # fmt: skip
        _LEFT_BEHIND.pop(netloc, None)
    asked = clock()
    answers: list[DaemonHealth] = []

    def run() -> None:
        try:
            answers.append(_probe(netloc, timeout_s, session, clock, asked))
        except Exception as exc:  # an answer nothing above foresaw is no answer
            answers.append(DaemonHealth(False, None, f"{type(exc).__name__} from {netloc}"))

    probe = threading.Thread(target=run, name="fleetgate-probe", daemon=True)
    probe.start()
    probe.join(ANSWER_WITHIN * timeout_s)
    if not answers:
        with _LEFT_LOCK:
            _LEFT_BEHIND[netloc] = probe
        bound = ANSWER_WITHIN * timeout_s
        return DaemonHealth(False, None, f"timed out after {timeout_s:g}s at {netloc} (no whole "
                                         f"answer within {bound:g}s)")  # fmt: skip
    return answers[0]


def _probe(netloc: str, timeout_s: float, session: requests.Session,
           clock: Callable[[], float], asked: float) -> DaemonHealth:  # fmt: skip
    try:
        with session.get(
            f"http://{netloc}/status", timeout=timeout_s, stream=True, allow_redirects=False
        ) as r:
            if r.status_code != 200:
                return DaemonHealth(False, None, f"HTTP {r.status_code} from {netloc}/status")
            body = r.raw.read(MAX_STATUS_BYTES + 1, decode_content=True)
    except (requests.Timeout, urllib3.exceptions.TimeoutError):
        return DaemonHealth(False, None, f"timed out after {timeout_s:g}s at {netloc}")
    except requests.ConnectionError as exc:
        return DaemonHealth(False, None, f"cannot connect to {netloc}: {_reason(exc)}")
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        return DaemonHealth(False, None, f"{type(exc).__name__} from {netloc}: {_reason(exc)}")
    prompt = clock() - asked <= DATES_WITHIN_S
    return _parse(body, netloc, asked if prompt else None)


def _parse(body: bytes, netloc: str, at: float | None) -> DaemonHealth:
    if len(body) > MAX_STATUS_BYTES:
        return DaemonHealth(False, None, f"/status at {netloc} is over {MAX_STATUS_BYTES} bytes")
    try:
        status = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return DaemonHealth(False, None, f"/status at {netloc} is not JSON")
    if not isinstance(status, dict):
        return DaemonHealth(False, None, f"/status at {netloc} is not a JSON object")
    uptime = status.get("uptime_secs")
    if isinstance(uptime, bool) or not isinstance(uptime, int | float) or not math.isfinite(uptime):
        return DaemonHealth(True, None, f"/status at {netloc} has no numeric uptime_secs")
    if uptime < 0:  # a start in the future: no uptime, and it dates no start
        return DaemonHealth(True, None, f"/status at {netloc} has a negative uptime_secs")
    return DaemonHealth(True, float(uptime), "", at)


def _reason(exc: Exception) -> str:
    """The innermost cause in a few words (requests' text is long and repeats the URL)."""
    inner: BaseException = exc
    for _ in range(10):
        if inner.__context__ is None:
            break
        inner = inner.__context__
    text = str(inner).rsplit("] ", 1)[-1].strip() or type(inner).__name__
    return text[:200]


def check_many(
    targets: Mapping[K, tuple[str, int]],
    timeout_s: float,
    max_workers: int = 16,
    session: requests.Session | None = None,
    clock: Callable[[], float] = time.time,
) -> dict[K, DaemonHealth]:
    """`check_daemon` for every target at once (a thread pool): {key: health}, each answer
    timed by `clock` as it is asked (a large fleet's probes span seconds)."""
    if not targets:
        return {}
    own = session is None
    http = requests.Session() if session is None else session
    try:
        workers = max(1, min(max_workers, len(targets)))
        with ThreadPoolExecutor(workers, thread_name_prefix="fleetgate-health") as pool:
            futures = {
                key: pool.submit(check_daemon, host, port, timeout_s, http, clock)
                for key, (host, port) in targets.items()
            }
            return {key: f.result() for key, f in futures.items()}
    finally:
        if own:
            http.close()

"""The HTTP API instances call as they boot and run (the agent's side of
`controller.store.records`).

    POST /v1/instances/register                   {label, vast_id?, min_rate?, host_and_port?,
                                                   agent_version?}
    POST /v1/instances/{label}/params-done
    POST /v1/instances/{label}/bench-done         {rate}
    POST /v1/instances/{label}/running
    POST /v1/instances/{label}/heartbeat          {daemon_uptime_s?, daemon_state?}
                                                  -> {commands: [{id, command}]}
    POST /v1/instances/{label}/commands/{id}/done {ok, detail}
    POST /v1/instances/{label}/logs               {lines: [...]}  (at most MAX_PUSH_LINES)

Every call authenticates as exactly one instance: `Authorization: Bearer <instance token>`,
the secret its launch put in its environment (`FLEETGATE_INSTANCE_TOKEN`; the journal keeps
only its hash, `controller.store.instance_tokens`). The token names one launch label, and a
call reaches only that label's records and commands: another label in the path or the body is
403 and changes nothing. A label fleetgate did not launch has no token, so it can never
register; a forgotten instance's token stops working. The operator's API token is never an
instance token (an instance holds its own in its environment, so it must never answer
escalations).

With `instances.shared_token_opt_in: true` the configured `instances.fleet_token`, shared by
the fleet, is also accepted, for any launched label: the weaker set-up of earlier versions
(any instance can then act as any other), warned about at start.

Registrations, log pushes and the other calls are rate-limited per instance (token buckets,
`RateLimits`, refilled by the injected clock): over the limit is 429, which the agent retries
later. Unknown or missing token: 401; unknown command: 404; a stage earlier than the recorded
one, or a vast id another instance holds: 409; a body over MAX_BODY_BYTES: 413 before it is
parsed; an invalid body: 422 naming the fields, without echoing the input.

Bodies ignore unknown fields: an agent on an instance image may be newer than the controller,
and a refused registration would get a healthy instance destroyed.

`InstanceService` is what each call does once its body is parsed, given the caller's bearer
token; the routes are its HTTP side, and the simulator's agents call it directly with their
own instance's token (the simulator replaces only the HTTP hop).

This module must NOT decide anything about an instance: it authenticates, validates, stores,
and answers.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from starlette.types import Message

from controller.core.fields import is_digits
from controller.store.records import (
    LifecycleStore,
    StageOrderError,
    UnknownCommand,
    UnknownInstance,
    VastIdTaken,
)

log = logging.getLogger(__name__)

MAX_PUSH_LINES = 200
MAX_BODY_BYTES = 1 << 20
LABEL = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$"

Label = Annotated[str, Path(pattern=LABEL)]


# The highest proving rate (proofs an hour) an instance may report of itself: a PoRep SNARK
# takes minutes on the fastest GPUs, so tens an hour is real; a rate past this is a lie that
# would rank its host first for every later launch.
MAX_RATE = 1_000.0


class _Body(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="ignore")


class Registration(_Body):
    label: str = Field(pattern=LABEL)
    vast_id: str | None = Field(None, pattern=r"^[0-9]{1,20}$")
    min_rate: float | None = Field(None, ge=0, le=MAX_RATE, allow_inf_nan=False)
    host_and_port: str | None = Field(None, min_length=1, max_length=300)
    agent_version: str | None = Field(None, max_length=40)


class BenchDone(_Body):
    rate: float = Field(ge=0, le=MAX_RATE, allow_inf_nan=False)


class Heartbeat(_Body):
    daemon_uptime_s: float | None = Field(None, ge=0, allow_inf_nan=False)
    daemon_state: str | None = Field(None, max_length=20)


class CommandDone(_Body):
    ok: bool
    detail: str = Field("", max_length=2000)


class Logs(_Body):
    lines: list[str] = Field(max_length=MAX_PUSH_LINES)


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class _CappedRoute(APIRoute):
    """Refuses a caller `first` refuses (a token that is nobody's) before reading a byte of
    its body, and a body over MAX_BODY_BYTES before FastAPI reads it whole (uvicorn has no
    cap)."""

    first: Callable[[Request], Response | None] = staticmethod(lambda request: None)

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()
        first = type(self).first

        async def capped(request: Request) -> Response:
            refused = first(request)
            if refused is not None:
                return refused
            length = request.headers.get("content-length", "")
            if length and (not is_digits(length) or int(length) > MAX_BODY_BYTES):
                return _too_large()
            body = bytearray()
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    return _too_large()

            async def replay() -> Message:
                return {"type": "http.request", "body": bytes(body), "more_body": False}

            try:
                return await handler(Request(request.scope, replay))
            except RequestValidationError as exc:
                return _invalid(exc)

        return capped


def _invalid(exc: RequestValidationError) -> Response:
    """422 naming what was wrong, without echoing the input (it may be large, or not JSON-safe)."""
    errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))} for e in exc.errors()]
    return JSONResponse({"detail": errors[:20]}, status_code=422)


def _too_large() -> Response:
    return JSONResponse({"detail": f"body over {MAX_BODY_BYTES} bytes"}, status_code=413)


class InstanceAPIError(Exception):
    """An instance API call refused: `status` is the HTTP status it answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Bucket:
    """A token bucket: `burst` calls at once, then one every `every_s` seconds."""

    burst: float
    every_s: float


@dataclass(frozen=True)
class RateLimits:
    """Per instance. The agent registers once per boot (retrying on 429), pushes a batch of
    log lines every few seconds and heartbeats every 30 s."""

    register: Bucket = Bucket(5, 60.0)
    logs: Bucket = Bucket(30, 1.0)
    other: Bucket = Bucket(60, 0.5)  # stages, heartbeats, command results


class _Buckets:
    """The token buckets of every (instance, kind); `now` comes in. A bucket that has filled
    up again is the same as none: every `PRUNE_EVERY_S` those are dropped, so the instances
    that went (and the labels that only ever called once) leave nothing behind."""

    PRUNE_EVERY_S = 600.0

    def __init__(self, limits: RateLimits) -> None:
        self.limits = limits
        self._level: dict[tuple[str, str], tuple[float, float]] = {}  # -> (tokens, at)
        self._lock = threading.Lock()
        self._pruned_at: float | None = None

    def take(self, label: str, kind: str, now: float) -> bool:
        bucket: Bucket = getattr(self.limits, kind)
        with self._lock:
            self._prune(now)
            tokens, at = self._level.get((label, kind), (bucket.burst, now))
            tokens = min(bucket.burst, tokens + max(0.0, now - at) / bucket.every_s)
            if tokens < 1:
                self._level[(label, kind)] = (tokens, now)
                return False
            self._level[(label, kind)] = (tokens - 1, now)
            return True

    def _prune(self, now: float) -> None:
        if self._pruned_at is None or not 0 <= now - self._pruned_at < self.PRUNE_EVERY_S:
            self._pruned_at = now
            full = [key for key, (tokens, at) in self._level.items()
                    if tokens + max(0.0, now - at) / getattr(self.limits, key[1]).every_s
                    >= getattr(self.limits, key[1]).burst]  # fmt: skip
            for key in full:
                del self._level[key]

    def __len__(self) -> int:
        return len(self._level)


class InstanceService:
    """What each instance API call does, after its body is parsed, for the caller holding
    `token`: the routes below call it, and so do the simulator's agents (which replace only
    the HTTP hop). Errors are `InstanceAPIError` with the status the route answers; `calls`
    counts calls by name, `refused` refusals by status."""

    def __init__(
        self,
        store: LifecycleStore,
        clock: Callable[[], float],
        *,
        shared_token: SecretStr | None = None,
        limits: RateLimits | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self._shared = shared_token.get_secret_value().encode() if shared_token else None
        self._buckets = _Buckets(limits or RateLimits())
        self.calls: Counter[str] = Counter()
        self.refused: Counter[int] = Counter()

    # ---- who is calling ------------------------------------------------------------------
    def identify(self, token: str) -> str | None:
        """The launch label `token` belongs to; SHARED for the opted-in fleet token; else None."""
        if self._shared is not None and hmac.compare_digest(token.encode(), self._shared):
            return SHARED
        return self.store.tokens.label_for(token)

    def _caller(self, token: str, label: str, kind: str) -> str:
        """The label the call acts on, once `token` may act on it and its bucket allows."""
        who = self.identify(token)
        if who is None:
            raise self._refuse(401, "a valid instance bearer token is required")
        if who == SHARED:
            if not self.store.tokens.launched(label):
                raise self._refuse(403, f"label {label!r} was not launched by fleetgate")
        elif who != label:
            raise self._refuse(403, f"this token is not instance {label!r}'s")
        if not self._buckets.take(label, kind, self.clock()):
            raise self._refuse(429, f"instance {label!r}: too many {kind} calls; try later")
        return label

    def _refuse(self, status: int, message: str) -> InstanceAPIError:
        self.refused[status] += 1
        return InstanceAPIError(status, message)

    # ---- the calls -----------------------------------------------------------------------
    def register(self, token: str, body: Registration) -> dict[str, Any]:
        self.calls["register"] += 1
        label = self._caller(token, body.label, "register")
        bound = self.store.tokens.vast_id(label)
        if bound is not None and body.vast_id not in (None, bound):
            raise self._refuse(409, f"instance {label!r} is vast instance {bound}, not another")
        try:
            record = self.store.register(label, bound or body.vast_id, body.min_rate,
                                         body.host_and_port, self.clock(),
                                         agent_version=body.agent_version)  # fmt: skip
        except VastIdTaken as exc:
            raise self._refuse(409, str(exc)) from exc
        log.info("instance %s registered (vast id %s)", record.label, record.vast_id)
        return {"label": record.label, "stage": record.stage}

    def advance(self, token: str, label: str, stage: str,
                rate: float | None = None) -> dict[str, Any]:  # fmt: skip
        self.calls[stage] += 1
        self._caller(token, label, "other")
        try:
            record = self.store.advance(label, stage, self.clock(), bench_rate=rate)
        except UnknownInstance as exc:
            raise self._refuse(404, str(exc)) from exc
        except StageOrderError as exc:
            raise self._refuse(409, str(exc)) from exc
        log.debug("instance %s reported stage %s (rate %s)", label, stage, rate)
        return {"label": label, "stage": record.stage}

    def heartbeat(self, token: str, label: str, body: Heartbeat) -> dict[str, Any]:
        self.calls["heartbeat"] += 1
        self._caller(token, label, "other")
        try:
            picked = self.store.heartbeat(label, self.clock(), body.daemon_uptime_s,
                                          body.daemon_state)  # fmt: skip
        except UnknownInstance as exc:
            raise self._refuse(404, str(exc)) from exc
        for c in picked:
            log.info("instance %s picked command #%d %s", label, c.id, c.command)
        return {"commands": [{"id": c.id, "command": c.command} for c in picked]}

    def command_done(self, token: str, label: str, command_id: int,
                     body: CommandDone) -> dict[str, Any]:  # fmt: skip
        self.calls["command_done"] += 1
        self._caller(token, label, "other")
        result = {"ok": body.ok, "detail": body.detail}
        try:
            recorded = self.store.complete(command_id, result, self.clock(), label=label)
        except UnknownCommand as exc:
            raise self._refuse(404, str(exc)) from exc
        log.info("instance %s command #%d done: ok=%s", label, command_id, body.ok)
        return {"recorded": recorded}

    def logs(self, token: str, label: str, body: Logs) -> dict[str, Any]:
        self.calls["logs"] += 1
        self._caller(token, label, "logs")
        try:
            kept = self.store.push_logs(label, body.lines, self.clock())
        except UnknownInstance as exc:
            raise self._refuse(404, str(exc)) from exc
        return {"kept": kept}


SHARED = "\x00shared"  # identify()'s answer for the opted-in fleet token: never a label


def instance_router(
    store: LifecycleStore | InstanceService,
    shared_token: SecretStr | None = None,
    clock: Callable[[], float] | None = None,
) -> APIRouter:
    """The instance API over a service (or a store and clock), for `app.include_router(...)`.
    `shared_token` is accepted too only when the operator opted in to a shared fleet token."""
    if isinstance(store, InstanceService):
        service = store
    else:
        assert clock is not None, "a LifecycleStore needs the clock"
        service = InstanceService(store, clock, shared_token=shared_token)

    def known(authorization: str) -> str | None:
        """The bearer token of an `Authorization` header when it is somebody's."""
        scheme, _, given = authorization.partition(" ")
        token = given.strip() if scheme.lower() == "bearer" else ""
        return token if token and service.identify(token) is not None else None

    def nobody(request: Request) -> Response | None:
        """401 for a token that is nobody's, before a byte of the body is read (and the
        connection closed, not drained): an unauthenticated caller holds no buffer of up to
        MAX_BODY_BYTES open."""
        if known(request.headers.get("authorization", "")) is not None:
            return None
        service.refused[401] += 1
        return JSONResponse({"detail": "a valid instance bearer token is required"},
                            status_code=401, headers={"WWW-Authenticate": "Bearer",
                                                      "Connection": "close"})  # fmt: skip

    def bearer(authorization: str = Header(default="")) -> str:
        """The caller's token (`nobody` has refused one that is nobody's)."""
        token = known(authorization)
        if token is None:  # (its token was revoked between the two looks)
            service.refused[401] += 1
            raise HTTPException(401, "a valid instance bearer token is required",
                                headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
        return token

    authenticated = Depends(bearer)
    route = type("_InstanceRoute", (_CappedRoute,), {"first": staticmethod(nobody)})
    router = APIRouter(prefix="/v1/instances", route_class=route)

    def call(do: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            return do()
        except InstanceAPIError as exc:
            headers = {"Retry-After": "5"} if exc.status == 429 else None
            raise HTTPException(exc.status, str(exc), headers=headers) from exc

    @router.post("/register")
    def register(body: Registration, token: str = authenticated) -> dict[str, Any]:
        return call(lambda: service.register(token, body))

    @router.post("/{label}/params-done")
    def params_done(label: Label, token: str = authenticated) -> dict[str, Any]:
        return call(lambda: service.advance(token, label, "params"))

    @router.post("/{label}/bench-done")
    def bench_done(label: Label, body: BenchDone, token: str = authenticated) -> dict[str, Any]:
        return call(lambda: service.advance(token, label, "bench", body.rate))

    @router.post("/{label}/running")
    def running(label: Label, token: str = authenticated) -> dict[str, Any]:
        return call(lambda: service.advance(token, label, "running"))

    @router.post("/{label}/heartbeat")
    def heartbeat(label: Label, token: str = authenticated,
                  body: Heartbeat | None = None) -> dict[str, Any]:  # fmt: skip
        return call(lambda: service.heartbeat(token, label, body or Heartbeat()))

    @router.post("/{label}/commands/{command_id}/done")
    def command_done(label: Label, command_id: int, body: CommandDone,
                     token: str = authenticated) -> dict[str, Any]:  # fmt: skip
        return call(lambda: service.command_done(token, label, command_id, body))

    @router.post("/{label}/logs")
    def logs(label: Label, body: Logs, token: str = authenticated) -> dict[str, Any]:
        return call(lambda: service.logs(token, label, body))

    return router

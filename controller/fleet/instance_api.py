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

Every call needs `Authorization: Bearer <fleet token>`, compared in constant time: one token
shared by the fleet's instances, distinct from the operator's API token (an instance holds it
in its environment, so it must never answer escalations). Unknown label or command: 404; a stage
earlier than the recorded one: 409; a body over MAX_BODY_BYTES: 413 before it is parsed; an
invalid body: 422 naming the fields, without echoing the input.

Bodies ignore unknown fields: an agent on an instance image may be newer than the controller,
and a refused registration would get a healthy instance destroyed.

`InstanceService` is what each call does once its body is parsed; the routes are its HTTP
side, and the simulator's agents call it directly (the simulator replaces only the HTTP hop).

This module must NOT decide anything about an instance: it validates, stores, and answers.
"""

from __future__ import annotations

import hmac
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from starlette.types import Message

from controller.store.records import (
    LifecycleStore,
    StageOrderError,
    UnknownCommand,
    UnknownInstance,
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
    model_config = ConfigDict(extra="ignore")


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
    """Refuses a body over MAX_BODY_BYTES before FastAPI reads it whole (uvicorn has no cap)."""

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()

        async def capped(request: Request) -> Response:
            length = request.headers.get("content-length", "")
            if length and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
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


class InstanceService:
    """What each instance API call does, after its body is parsed: the routes below call it,
    and so do the simulator's agents (which replace only the HTTP hop). Errors are
    `InstanceAPIError` with the status the route answers; `calls` counts calls by name."""

    def __init__(self, store: LifecycleStore, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        self.calls: Counter[str] = Counter()

    def register(self, body: Registration) -> dict[str, Any]:
        self.calls["register"] += 1
        record = self.store.register(body.label, body.vast_id, body.min_rate, body.host_and_port,
                                     self.clock(), agent_version=body.agent_version)  # fmt: skip
        log.info("instance %s registered (vast id %s)", record.label, record.vast_id)
        return {"label": record.label, "stage": record.stage}

    def advance(self, label: str, stage: str, rate: float | None = None) -> dict[str, Any]:
        self.calls[stage] += 1
        try:
            record = self.store.advance(label, stage, self.clock(), bench_rate=rate)
        except UnknownInstance as exc:
            raise InstanceAPIError(404, str(exc)) from exc
        except StageOrderError as exc:
            raise InstanceAPIError(409, str(exc)) from exc
        log.debug("instance %s reported stage %s (rate %s)", label, stage, rate)
        return {"label": label, "stage": record.stage}

    def heartbeat(self, label: str, body: Heartbeat) -> dict[str, Any]:
        self.calls["heartbeat"] += 1
        try:
            picked = self.store.heartbeat(label, self.clock(), body.daemon_uptime_s,
                                          body.daemon_state)  # fmt: skip
        except UnknownInstance as exc:
            raise InstanceAPIError(404, str(exc)) from exc
        for c in picked:
            log.info("instance %s picked command #%d %s", label, c.id, c.command)
        return {"commands": [{"id": c.id, "command": c.command} for c in picked]}

    def command_done(self, label: str, command_id: int, body: CommandDone) -> dict[str, Any]:
        self.calls["command_done"] += 1
        result = {"ok": body.ok, "detail": body.detail}
        try:
            recorded = self.store.complete(command_id, result, self.clock(), label=label)
        except UnknownCommand as exc:
            raise InstanceAPIError(404, str(exc)) from exc
        log.info("instance %s command #%d done: ok=%s", label, command_id, body.ok)
        return {"recorded": recorded}

    def logs(self, label: str, body: Logs) -> dict[str, Any]:
        self.calls["logs"] += 1
        try:
            kept = self.store.push_logs(label, body.lines, self.clock())
        except UnknownInstance as exc:
            raise InstanceAPIError(404, str(exc)) from exc
        return {"kept": kept}


def instance_router(
    store: LifecycleStore | InstanceService,
    fleet_token: SecretStr,
    clock: Callable[[], float] | None = None,
) -> APIRouter:
    """The instance API over a service (or a store and clock), for `app.include_router(...)`."""
    if isinstance(store, InstanceService):
        service = store
    else:
        assert clock is not None, "a LifecycleStore needs the clock"
        service = InstanceService(store, clock)
    expected = fleet_token.get_secret_value().encode()

    def authorized(authorization: str = Header(default="")) -> None:
        scheme, _, given = authorization.partition(" ")
        given_b = given.encode() if scheme.lower() == "bearer" else b""
        if not hmac.compare_digest(given_b, expected):
            raise HTTPException(401, "a valid fleet bearer token is required",
                                headers={"WWW-Authenticate": "Bearer"})  # fmt: skip

    router = APIRouter(
        prefix="/v1/instances", dependencies=[Depends(authorized)], route_class=_CappedRoute
    )

    def call(do: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            return do()
        except InstanceAPIError as exc:
            raise HTTPException(exc.status, str(exc)) from exc

    @router.post("/register")
    def register(body: Registration) -> dict[str, Any]:
        return call(lambda: service.register(body))

    @router.post("/{label}/params-done")
    def params_done(label: Label) -> dict[str, Any]:
        return call(lambda: service.advance(label, "params"))

    @router.post("/{label}/bench-done")
    def bench_done(label: Label, body: BenchDone) -> dict[str, Any]:
        return call(lambda: service.advance(label, "bench", body.rate))

    @router.post("/{label}/running")
    def running(label: Label) -> dict[str, Any]:
        return call(lambda: service.advance(label, "running"))

    @router.post("/{label}/heartbeat")
    def heartbeat(label: Label, body: Heartbeat | None = None) -> dict[str, Any]:
        return call(lambda: service.heartbeat(label, body or Heartbeat()))

    @router.post("/{label}/commands/{command_id}/done")
    def command_done(label: Label, command_id: int, body: CommandDone) -> dict[str, Any]:
        return call(lambda: service.command_done(label, command_id, body))

    @router.post("/{label}/logs")
    def logs(label: Label, body: Logs) -> dict[str, Any]:
        return call(lambda: service.logs(label, body))

    return router

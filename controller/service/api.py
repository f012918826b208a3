"""The controller's HTTP API: answers to escalations, status, health.

    POST /v1/escalations/{id}/answer   {"decision": "approve"|"deny", "action"?, "params"?, "by"?}
    GET  /v1/escalations[?status=pending]
    GET  /v1/escalations/{id}
    GET  /v1/status
    GET  /healthz

Every /v1 call needs `Authorization: Bearer <token>` (compared in constant time). An answer may
instead carry that escalation's own capability (`answer_capability(token, id)`, an HMAC): what
message buttons (ntfy) hold, so the API token itself is never put in a message. An answer is
the same as `fleetgate escalations approve|deny`: it is validated, journaled, and the action
runs through the guards on the next tick. Served by uvicorn in a background thread.

`create_app` includes the routers it is given (the instance API), then `status_router`
(health, status) and `escalations_router`, both behind the checks of `Auth`.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from controller.store.journal import Journal
from escalation import approvals
from escalation.capabilities import answer_capability

log = logging.getLogger(__name__)


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "deny"]
    action: str | None = None
    params: dict[str, Any] | None = None
    by: str = Field("api", max_length=80, pattern=r"^[A-Za-z0-9_.@-]+$")
    override: list[str] = Field(default_factory=list, description="budget caps to exceed")


def create_app(
    journal: Journal,
    token: SecretStr,
    clock: Callable[[], float],
    on_answer: Callable[[int], None] = lambda _id: None,
    status: Callable[[], dict[str, Any]] | None = None,
    routers: Sequence[APIRouter] = (),
) -> FastAPI:
    """The API over `journal`; `on_answer` runs after an answer is stored (closes alerts);
    `routers` adds more (the instance lifecycle API)."""
    app = FastAPI(title="fleetgate", docs_url=None, redoc_url=None, openapi_url=None)
    for router in routers:
        app.include_router(router)
    auth = Auth(token)
    app.include_router(status_router(journal, auth, status))
    app.include_router(escalations_router(journal, auth, clock, on_answer))
    return app


class Auth:
    """The two bearer checks, as FastAPI dependencies (the token compared in constant time)."""

    def __init__(self, token: SecretStr) -> None:
        self._token = token
        self._expected = token.get_secret_value().encode()

    def authorized(self, authorization: str = Header(default="")) -> None:
        """The API token itself."""
        if not hmac.compare_digest(_bearer(authorization), self._expected):
            raise _deny()

    def may_answer(self, esc_id: int, authorization: str = Header(default="")) -> None:
        """The API token, or escalation `esc_id`'s own answer capability."""
        given = _bearer(authorization)
        capability = answer_capability(self._token, esc_id).encode()
        if not (
            hmac.compare_digest(given, self._expected) or hmac.compare_digest(given, capability)
        ):
            raise _deny()


def _bearer(authorization: str) -> bytes:
    scheme, _, given = authorization.partition(" ")
    return given.encode() if scheme.lower() == "bearer" else b""


def _deny() -> HTTPException:
    return HTTPException(401, "a valid bearer token is required",
                         headers={"WWW-Authenticate": "Bearer"})  # fmt: skip


def status_router(
    journal: Journal, auth: Auth, status: Callable[[], dict[str, Any]] | None
) -> APIRouter:
    """`GET /healthz` (no token) and `GET /v1/status` (`status()`, else the last tick)."""
    router = APIRouter()

    @router.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/v1/status", dependencies=[Depends(auth.authorized)])
    def get_status() -> dict[str, Any]:
        if status is not None:
            return status()
        ticks = journal.meta.ticks(1)
        return {"last_tick": ticks[0] if ticks else None}

    return router


def escalations_router(
    journal: Journal, auth: Auth, clock: Callable[[], float], on_answer: Callable[[int], None]
) -> APIRouter:
    """List and show escalations (the API token); answer one (the token or its capability)."""
    router = APIRouter()

    @router.get("/v1/escalations", dependencies=[Depends(auth.authorized)])
    def list_escalations(status: str | None = None) -> list[dict[str, Any]]:
        return journal.escalations.recent(status=status)

    @router.get("/v1/escalations/{esc_id}", dependencies=[Depends(auth.authorized)])
    def show(esc_id: int) -> dict[str, Any]:
        esc = journal.escalations.escalation(esc_id)
        if esc is None:
            raise HTTPException(404, f"no escalation #{esc_id}")
        return esc

    @router.post("/v1/escalations/{esc_id}/answer", dependencies=[Depends(auth.may_answer)])
    def answer(esc_id: int, body: Answer) -> dict[str, Any]:
        if journal.escalations.escalation(esc_id) is None:
            raise HTTPException(404, f"no escalation #{esc_id}")
        result = _record_answer(journal, esc_id, body, clock())
        log.info("escalation #%d %s over HTTP by %s", esc_id, result["status"], body.by)
        on_answer(esc_id)
        return result

    return router


def _record_answer(journal: Journal, esc_id: int, body: Answer, now: float) -> dict[str, Any]:
    """Deny or approve escalation `esc_id` as `body` says; 409 or 422 when it cannot be."""
    try:
        if body.decision == "deny":
            approvals.deny(journal, esc_id, by=body.by, now=now)
            return {"status": "denied"}
        chosen = approvals.approve(
            journal,
            esc_id,
            by=body.by,
            now=now,
            action=body.action,
            params=body.params,
            override=body.override,
        )
        return {"status": "approved", "answer": chosen}
    except approvals.ApprovalError as exc:
        code = 409 if "not pending" in str(exc) or "meanwhile" in str(exc) else 422
        raise HTTPException(code, str(exc)) from exc


class Server:
    """uvicorn in a daemon thread; `stop()` shuts it down."""

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", access_log=False, lifespan="off"
        )
        self._server = uvicorn.Server(config)  # in a thread it installs no signal handlers
        self._thread = threading.Thread(target=self._server.run, name="fleetgate-api", daemon=True)

    def start(self, wait_s: float = 10.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + wait_s
        while not self._server.started and self._thread.is_alive():
            if time.monotonic() > deadline:
                raise RuntimeError("the HTTP API did not start in time")
            time.sleep(0.02)
        if not self._server.started:
            raise RuntimeError("the HTTP API could not start (is the port in use?)")

    @property
    def port(self) -> int:
        servers = getattr(self._server, "servers", [])
        for s in servers:
            for sock in s.sockets:
                return int(sock.getsockname()[1])
        return int(self._server.config.port)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

"""The controller's HTTP API: answers to escalations, status, health.

    POST /v1/escalations/{id}/answer   {"decision": "approve"|"deny", "action"?, "params"?, "by"?}
    GET  /v1/escalations[?status=pending]
    GET  /v1/escalations/{id}
    GET  /v1/status
    GET  /healthz                        (no token) the process answers and can write the journal
    GET  /readyz                         (no token) the ticks run: 200, or 503 with the reasons
    GET  /, /escalations/{id}, ...       the operator's pages (`controller.service.dashboard`)

Every /v1 call needs `Authorization: Bearer <token>` (compared in constant time). An answer may
instead carry that escalation's own capability (`escalation.capabilities`: one journal, one
escalation, one choice, until its deadline; no action, parameters or overrides): what
message buttons (ntfy) hold, so the API token itself is never put in a message; the answer
route alone also answers a browser's CORS preflight (the ntfy web app's buttons). An answer is
the same as `fleetgate escalations approve|deny`: it is validated, journaled, and the action
runs through the guards on the next tick. Served by uvicorn in a background thread, its
connections bounded in number and in the time a request may take to arrive
(`controller.service.connections`).

`create_app` includes the routers it is given (the instance API), then `status_router`
(health, readiness, status) and `escalations_router`, both behind the checks of `Auth`, and
the pages (`dashboard_router`: a sign-in with the token, a session cookie, CSRF-checked forms
that answer through the same path as the JSON answer).

In front of every route, `controller.service.api_guard.Guard` checks the caller before the body
is read (the operator's token, or an answer's capability; the instance API a bearer header,
its route then the token) and caps the body as it streams in (413 past `MAX_OPERATOR_BODY`,
or `MAX_INSTANCE_BODY`, the instance API's own cap). An id no row can have (below 1,
beyond 2**63-1) is 404; a body that fails validation is 422 listing field names and
reasons, never the input.
`create_instance_app` serves the instance API alone, for a listener of its own
(`api.instance_listen`).
"""

from __future__ import annotations

import errno
import hmac
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from controller.service.api_guard import Guard, Refusal, bad_id, bearer
from controller.service.connections import BACKLOG, BoundedH11
from controller.service.dashboard import View, dashboard_router
from controller.service.metrics import metrics_router
from controller.service.status import last_finished_tick, readiness
from controller.store import lease
from controller.store.backend import JournalError, JournalLost
from controller.store.journal import Journal
from escalation import approvals
from escalation.capabilities import check_capability

log = logging.getLogger(__name__)


class Answer(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    decision: Literal["approve", "deny"]
    action: str | None = None
    params: dict[str, Any] | None = None
    # who answered comes from the credential, never from here (kept so old bodies still parse)
    by: str | None = Field(None, max_length=80, pattern=r"^[A-Za-z0-9_.@-]+$")
    override: list[str] = Field(default_factory=list, description="budget caps to exceed")


def create_app(
    journal: Journal,
    token: SecretStr,
    clock: Callable[[], float],
    on_answer: Callable[[int], None] = lambda _id: None,
    status: Callable[[], dict[str, Any]] | None = None,
    routers: Sequence[APIRouter] = (),
    view: View | None = None,
) -> FastAPI:
    """The API over `journal`; `on_answer` runs after an answer is stored (closes alerts);
    `routers` adds more (the instance lifecycle API); `view`: the running controller's
    settings the pages and /readyz read (interval, lease holder, guards, rules)."""
    app = _bare()
    for router in routers:
        app.include_router(router)
    journal_id = journal.meta.identity()
    auth = Auth(token, journal_id)
    view = view or View()
    app.include_router(status_router(journal, auth, status, clock, view, journal_id))
    settle = answerer(journal, clock, on_answer)
    app.include_router(escalations_router(journal, auth, clock, settle))
    app.include_router(metrics_router(journal, view.holder))

    def record(esc_id: int, decision: str, action: str | None, by: str) -> dict[str, Any]:
        return settle(esc_id, Answer(decision=decision, action=action), by)

    app.include_router(dashboard_router(journal, token, clock, record, view, status))
    app.add_middleware(Guard, policy=auth.policy, cap=body_cap, cross_origin=is_answer)
    return app


def create_instance_app(routers: Sequence[APIRouter]) -> FastAPI:
    """The instance API alone (and `/healthz`), for a listener apart from the operator's: an
    operator route there is 404 whatever token it carries."""
    app = _bare()
    for router in routers:
        app.include_router(router)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    app.add_middleware(Guard, policy=instance_policy, cap=body_cap)
    return app


MAX_OPERATOR_BODY = 64 * 1024  # an answer is a few hundred bytes
MAX_INSTANCE_BODY = 1 << 20  # the instance API's routes refuse more themselves (MAX_BODY_BYTES)
INSTANCES = "/v1/instances/"
_ESCALATION = re.compile(r"^/v1/escalations/([^/]+)(/answer)?/?$")
_CAPABILITY = re.compile(r"^(?:(?:approve|deny)\.[0-9]{1,12}\.)?[0-9a-f]{64}$")


def is_answer(path: str) -> bool:
    """Whether `path` is an escalation's answer route: what a message's button calls, from the
    ntfy web app too (a page of another origin)."""
    esc = _ESCALATION.match(path)
    return esc is not None and esc.group(2) is not None


_COMMAND = re.compile(r"^/v1/instances/[^/]+/commands/([^/]+)/")


def body_cap(path: str) -> int:
    return MAX_INSTANCE_BODY if path.startswith(INSTANCES) else MAX_OPERATOR_BODY


def instance_policy(path: str, authorization: str) -> Refusal | None:
    """The instance API: a bearer value before the body (its route checks which one), and
    command ids a row can have."""
    if not path.startswith(INSTANCES):
        return None
    if not bearer(authorization):
        return Refusal(401, "a valid fleet bearer token is required")
    command = _COMMAND.match(path)
    if command and bad_id(command.group(1)):
        return Refusal(404, "no such command")
    return None


def _bare() -> FastAPI:
    app = FastAPI(title="fleetgate", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    return app


async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming the fields and what was wrong with each, never the values sent."""
    errors = []
    for e in exc.errors()[:20]:
        loc = [_name(p) for p in e.get("loc", ())]
        if e.get("type") == "extra_forbidden" and loc:  # the name is the caller's, not ours
            loc[-1] = "(unknown field)"
        errors.append({"loc": loc, "msg": str(e.get("msg", ""))[:200]})
    return JSONResponse({"detail": errors}, status_code=422)


def _name(part: object) -> str | int:
    """A location part as a field name, cut and stripped to safe characters."""
    if isinstance(part, int):
        return part
    return re.sub(r"[^A-Za-z0-9_.-]", "?", str(part))[:40]


class Auth:
    """The bearer checks (the token compared in constant time): `policy` for the guard, before
    any body is read, and the same checks as FastAPI dependencies on the routes."""

    def __init__(self, token: SecretStr, journal_id: str = "") -> None:
        self._token = token
        self._journal_id = journal_id
        self._expected = token.get_secret_value().encode()

    def policy(self, path: str, authorization: str) -> Refusal | None:
        """Operator routes (all of /v1 but the instance API): the token, or on an answer
        something of a capability's form; then an id no escalation can have is 404."""
        if not path.startswith("/v1/") or path.startswith(INSTANCES):
            return instance_policy(path, authorization)
        given = bearer(authorization).encode()
        allowed = hmac.compare_digest(given, self._expected)
        esc = _ESCALATION.match(path)
        if not allowed and esc is not None and esc.group(2) is not None:
            # an answer may carry a capability instead: the route verifies it (it needs the
            # journal); before the body only its form is checked, and the body stays capped
            allowed = bool(_CAPABILITY.match(given.decode("latin-1")))
        if not allowed:
            return Refusal(401, "a valid bearer token is required")
        if esc and bad_id(esc.group(1)):
            return Refusal(404, "no such escalation")
        return None

    def authorized(self, authorization: str = Header(default="")) -> None:
        """The API token itself."""
        if not hmac.compare_digest(_bearer(authorization), self._expected):
            raise _deny()

    def capability(self, esc_id: int, given: str) -> tuple[str, int] | None:
        """(choice, expires) of escalation `esc_id`'s capability `given` of this journal."""
        return check_capability(self._token, given, journal_id=self._journal_id, esc_id=esc_id)

    def may_answer(self, esc_id: int, authorization: str = Header(default="")) -> Credential:
        """The API token (the operator), or escalation `esc_id`'s own answer capability."""
        given = _bearer(authorization)
        if hmac.compare_digest(given, self._expected):
            return Credential("operator", None, None)
        cap = self.capability(esc_id, given.decode(errors="replace"))
        if cap is None:
            raise _deny()
        return Credential("button", cap[0], cap[1])


@dataclass(frozen=True)
class Credential:
    """Who answers: the operator's token, or a button's capability (one choice, until then)."""

    who: str
    choice: str | None
    expires: int | None


def _bearer(authorization: str) -> bytes:
    scheme, _, given = authorization.partition(" ")
    return given.encode() if scheme.lower() == "bearer" else b""


def _deny() -> HTTPException:
    return HTTPException(401, "a valid bearer token is required",
                         headers={"WWW-Authenticate": "Bearer"})  # fmt: skip


HEALTH_KEY = "healthz.at"  # the key/value row /healthz writes to prove the journal takes writes


def status_router(
    journal: Journal,
    auth: Auth,
    status: Callable[[], dict[str, Any]] | None,
    clock: Callable[[], float] = time.time,
    view: View | None = None,
    journal_id: str | None = None,
) -> APIRouter:
    """`GET /healthz` and `GET /readyz` (no token), `GET /v1/status` (`status()`, else the
    last tick). `journal_id`: the identity of the journal this process opened."""
    router = APIRouter()
    view = view or View()

    @router.get("/healthz", response_model=None)
    def healthz() -> dict[str, str] | JSONResponse:
        """Liveness: the process answers and the journal it opened takes a write (a deleted
        or replaced journal file took the write, into a file nobody reads, while every tick
        held until a restart)."""
        try:
            if journal_id is not None:
                journal.meta.check_identity(journal_id)
            journal.meta.put(HEALTH_KEY, clock())
        except JournalLost as exc:
            log.error("/healthz: %s", exc)
            return JSONResponse({"status": "failed", "reason": "the journal this process "
                                 "opened is gone or was replaced: restart it"},
                                status_code=503)  # fmt: skip
        except JournalError as exc:
            log.error("/healthz: the journal cannot be written: %s", exc)
            return JSONResponse({"status": "failed", "reason": "the journal cannot be written"},
                                status_code=503)  # fmt: skip
        return {"status": "ok"}

    @router.get("/readyz", response_model=None)
    def readyz() -> JSONResponse:
        """Readiness: the last tick's age against the interval, its sensors, the lease."""
        try:
            doc = readiness(last_finished_tick(journal), now=clock(),
                            interval_s=view.interval_s, holder=view.holder,
                            leader=lease.read(journal, ttl_s=view.ttl_s))  # fmt: skip
        except JournalError as exc:
            log.error("/readyz: the journal cannot be read: %s", exc)
            doc = {"status": "not ready", "ready": False,
                   "reasons": ["the journal cannot be read"]}  # fmt: skip
        return JSONResponse(doc, status_code=200 if doc["ready"] else 503)

    @router.get("/v1/status", dependencies=[Depends(auth.authorized)])
    def get_status() -> dict[str, Any]:
        if status is not None:
            return status()
        ticks = journal.meta.ticks(1)
        return {"last_tick": ticks[0] if ticks else None}

    return router


Settle = Callable[[int, Answer, str], dict[str, Any]]


def answerer(journal: Journal, clock: Callable[[], float],
             on_answer: Callable[[int], None]) -> Settle:  # fmt: skip
    """How an answer is taken, by the JSON endpoint and the pages' forms alike: recorded
    (`_record_answer`: validated, journaled), logged, then `on_answer`."""

    def settle(esc_id: int, body: Answer, by: str) -> dict[str, Any]:
        if journal.escalations.escalation(esc_id) is None:
            raise HTTPException(404, f"no escalation #{esc_id}")
        result = _record_answer(journal, esc_id, body, clock(), by=by)
        log.info("escalation #%d %s over HTTP by %s", esc_id, result["status"], by)
        on_answer(esc_id)
        return result

    return settle


def escalations_router(
    journal: Journal, auth: Auth, clock: Callable[[], float], settle: Settle
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

    @router.post("/v1/escalations/{esc_id}/answer")
    def answer(
        esc_id: int,
        body: Answer,
        cred: Credential = Depends(auth.may_answer),  # noqa: B008
    ) -> dict[str, Any]:
        if journal.escalations.escalation(esc_id) is None:
            raise HTTPException(404, f"no escalation #{esc_id}")
        now = clock()
        if cred.choice is not None:  # a button: its one answer, nothing more
            if body.decision != cred.choice:
                raise HTTPException(403, f"this button can only {cred.choice} escalation #{esc_id}")
            if body.action is not None or body.params is not None or body.override:
                raise HTTPException(403, "a button approves the proposal its message showed; "
                                    "another action, parameters or overrides need the "
                                    "operator's token")  # fmt: skip
            if cred.expires is not None and now > cred.expires:
                raise HTTPException(403, f"this button expired with escalation #{esc_id}")
        return settle(esc_id, body, cred.who)

    return router


def _record_answer(journal: Journal, esc_id: int, body: Answer, now: float, *, by: str = "operator"
                   ) -> dict[str, Any]:  # fmt: skip
    """Deny or approve escalation `esc_id` as `body` says, as `by` (from the credential); 409
    or 422 with a sentence when it cannot be."""
    try:
        if body.decision == "deny":
            approvals.deny(journal, esc_id, by=by, now=now)
            return {"status": "denied", "by": by}
        chosen = approvals.approve(
            journal,
            esc_id,
            by=by,
            now=now,
            action=body.action,
            params=body.params,
            override=body.override,
        )
        return {"status": "approved", "by": by, "answer": chosen,
                "note": "it runs through the guards on the next tick; they may trim or veto "
                "it (see the journal)"}  # fmt: skip
    except approvals.ApprovalError as exc:
        code = 409 if "not pending" in str(exc) or "meanwhile" in str(exc) else 422
        raise HTTPException(code, str(exc)) from exc


class ApiStartError(Exception):
    """The HTTP API cannot listen where the config says: one sentence, naming the key."""


def listening_socket(host: str, port: int, key: str = "api.listen") -> socket.socket:
    """A socket bound and listening on host:port, as uvicorn would make it; an
    `ApiStartError` naming `key` and the reason when the address cannot be had (another
    `fleetgate run` on the port, an address this host does not have)."""
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)  # fmt: skip
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
        except OSError:
            sock.close()
            raise
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        hint = ""
        if exc.errno == errno.EADDRINUSE:
            hint = ("; another program listens there (a `fleetgate run` already running on "
                    f"this config?): stop it, or give {key} another port")  # fmt: skip
        raise ApiStartError(f"{key} {host}:{port}: cannot listen: {reason}{hint}") from exc
    return sock


class Server:
    """uvicorn in a daemon thread; `stop()` shuts it down."""

    def __init__(self, app: FastAPI, host: str, port: int, key: str = "api.listen") -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                lifespan="off", http=BoundedH11, backlog=BACKLOG)  # fmt: skip
        self._server = uvicorn.Server(config)  # in a thread it installs no signal handlers
        self._address = (host, port, key)
        self._thread: threading.Thread | None = None

    def start(self, wait_s: float = 10.0) -> None:
        sock = listening_socket(*self._address)  # an address in use is a sentence, at once
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="fleetgate-api", daemon=True)  # fmt: skip
        self._thread.start()
        deadline = time.monotonic() + wait_s
        while not self._server.started and self._thread.is_alive():
            if time.monotonic() > deadline:
                raise ApiStartError(f"{self._address[2]}: the HTTP API did not start in time")
            time.sleep(0.02)
        if not self._server.started:
            raise ApiStartError(f"{self._address[2]}: the HTTP API could not start")

    @property
    def port(self) -> int:
        servers = getattr(self._server, "servers", [])
        for s in servers:
            for sock in s.sockets:
                return int(sock.getsockname()[1])
        return int(self._server.config.port)

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)


class Servers:
    """The operator API's server and, on an address of its own, the instance API's."""

    def __init__(self, operator: Server, instances: Server | None = None) -> None:
        self.operator, self.instances = operator, instances

    def start(self) -> None:
        self.operator.start()
        if self.instances is not None:
            try:
                self.instances.start()
            except BaseException:
                self.operator.stop()
                raise

    @property
    def port(self) -> int:
        return self.operator.port

    @property
    def instance_port(self) -> int:
        return (self.instances or self.operator).port

    def stop(self) -> None:
        try:
            if self.instances is not None:
                self.instances.stop()
        finally:
            self.operator.stop()

"""The operator's pages beside the JSON API: the dashboard (`GET /`) and a page per escalation
(`GET /escalations/{id}`, what message links open) with its answer buttons.

    GET  /                          the dashboard (a session; else to the sign-in form)
    GET  /login, POST /login        the sign-in form; the operator's API token sets a session
    POST /logout
    GET  /escalations/{id}          HTML for a browser (Accept: text/html), else the JSON state
    POST /escalations/{id}/answer   the page's Approve/Deny form

Signing in: the form posts the API token once; the answer is a session cookie
`<expires>.<nonce>.<mac>`, the mac an HMAC-SHA256 under the token of this journal's id, the
expiry and a random nonce. It is HttpOnly and SameSite=Strict (Secure over https or when the
public URL is https), never holds the token, and lapses `SESSION_S` after sign-in by the wall
clock; a new token ends every session.

Answers: every form carries a CSRF value, an HMAC of the session's own mac and what the form is
for (one escalation; sign-out), so a value answers nothing else and in no other session. A POST
whose Origin (else Referer) is not this server is refused, then one without a valid session,
both before its body is read. The answer goes through `record`, the JSON endpoint's own path:
validated, journaled, and carried out through the guards on the next tick.

Pages are jinja2, autoescaped, with no script; every page forbids framing and caching and its
content security policy allows this server's stylesheet and forms only. Nothing here decides
anything or writes to the journal but through `record`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from pydantic import SecretStr

from controller.core.fields import is_digits
from controller.core.policy import Guards
from controller.rules.model import Rulebook
from controller.service import autonomy
from controller.service.status import last_finished_tick, readiness
from controller.store import lease
from controller.store.journal import Journal
from escalation import approvals
from escalation.render import format_value, iso8601

COOKIE = "fleetgate_session"
SESSION_S = 12 * 3600  # a sign-in lasts this long (wall clock)
MAX_ROWS = 200  # instances listed on the dashboard; the rest are counted
MAX_FORM_FIELDS = 8
_NEXT = re.compile(r"^/(?:escalations/[0-9]{1,19})?$")  # where sign-in may send the browser
ICON = (b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" '
        b'height="16" rx="3" fill="#1d232a"/><path d="M4 12V4h7M4 8h5" stroke="#fff" '
        b'stroke-width="2" fill="none"/></svg>')  # fmt: skip
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

# escalation id, decision, action (None: the proposal shown), who -> the JSON answer's result;
# raises HTTPException (404, 409, 422) with a sentence when the answer cannot be taken
Record = Callable[[int, str, str | None, str], dict[str, Any]]
# a form's fields ("" holds the session's mac), or the refusal to send instead
Form = dict[str, str] | Response


class Refused(Exception):
    """A form POST refused before its body was read; `response` says why."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


@dataclass(frozen=True)
class View:
    """What the pages and /readyz read besides the journal: the running controller's config."""

    interval_s: float | None = None  # between ticks; None: a tick's age is shown, not judged
    holder: str | None = None  # this controller's name on the leader lease
    ttl_s: float = 15.0
    guards: Guards = field(default_factory=Guards)
    rulebook: Callable[[], Rulebook] | None = None  # the rules in force
    public_url: str | None = None  # how browsers reach the API (its origin is this server too)
    wall: Callable[[], float] = time.time  # sessions lapse by the wall clock
    # how messages print the ways to answer an escalation (`Escalator.how`: this controller's
    # --config and --state, the API token where the config reads it)
    how: Callable[..., dict[str, str]] | None = None


class Sessions:
    """Session cookies and CSRF values: HMACs under the API token, bound to the journal."""

    def __init__(self, token: SecretStr, journal_id: str, wall: Callable[[], float]) -> None:
        self._key = token.get_secret_value().encode()
        self._journal_id = journal_id
        self._wall = wall

    def token_ok(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._key)

    def _mac(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def mint(self) -> str:
        expires = int(self._wall()) + SESSION_S
        nonce = secrets.token_hex(12)
        mac = self._mac(f"fleetgate-session:v1:{self._journal_id}:{expires}:{nonce}")
        return f"{expires}.{nonce}.{mac}"

    def valid(self, cookie: str | None) -> str | None:
        """The session's mac when `cookie` is a live session of this journal, else None."""
        expires, _, rest = (cookie or "").partition(".")
        nonce, _, mac = rest.partition(".")
        if not is_digits(expires) or len(expires) > 12 or not nonce or len(nonce) > 64:
            return None
        expected = self._mac(f"fleetgate-session:v1:{self._journal_id}:{expires}:{nonce}")
        if not hmac.compare_digest(mac.encode(), expected.encode()):
            return None
        return mac if int(expires) > self._wall() else None

    def csrf(self, session: str, purpose: str) -> str:
        return self._mac(f"fleetgate-csrf:v1:{self._journal_id}:{session}:{purpose}")

    def csrf_ok(self, session: str, purpose: str, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.csrf(session, purpose).encode())


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("controller.service", "templates"),
        autoescape=select_autoescape(["html"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["iso"] = lambda ts: iso8601(ts) if ts is not None else "-"
    env.filters["ago"] = ago
    env.filters["value"] = format_value
    return env


def ago(seconds: float | None) -> str:
    """A duration in words short enough for a table cell: 45 s, 12 min, 3.5 h, 2.0 d."""
    if seconds is None:
        return "-"
    s = max(0.0, float(seconds))
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def wants_html(accept: str) -> bool:
    """Whether an Accept header prefers HTML to JSON (a browser), not `*/*` (an API client)."""
    weights: dict[str, float] = {}
    for part in accept.split(","):
        kind, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for p in params:
            name, _, value = p.partition("=")
            if name.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        weights[kind.lower()] = max(q, weights.get(kind.lower(), 0.0))
    return weights.get("text/html", 0.0) > 0 and (
        weights.get("text/html", 0.0) >= weights.get("application/json", 0.0)
    )


def _netloc(url: str) -> str:
    try:
        return urlsplit(url).netloc.lower()
    except ValueError:
        return ""


def public_doc(esc: dict[str, Any], how: Callable[..., dict[str, str]] | None = None
               ) -> dict[str, Any]:  # fmt: skip
    """What an escalation's link shows anyone: its state and how to answer it, while it takes
    an answer (no facts, proposals or secrets). `how`: the commands messages print for it."""
    esc_id = esc["id"]
    doc = {"id": esc_id, "status": esc["status"], "kind": esc["kind"],
           "subject": esc["subject"], "deadline": esc["deadline"]}  # fmt: skip
    if esc["status"] != "pending":  # answered, expired or resolved: every answer is refused
        return {**doc, "answer": f"escalation #{esc_id} is {esc['status']}: it takes no answer"}
    proposed = bool((esc.get("situation") or {}).get("proposals"))
    printed = how(esc_id, proposed=proposed) if how is not None else {}
    token = printed.get("deny_http", "").partition("Bearer ")[2].partition('"')[0]
    approve = printed.get("approve_cli", f"fleetgate escalations approve {esc_id}")
    if not proposed:
        approve += " --action NAME"
    deny = printed.get("deny_cli", f"fleetgate escalations deny {esc_id}")
    body = '{"decision": "approve"} or {"decision": "deny"}' if proposed else (
        '{"decision": "approve", "action": "NAME"} or {"decision": "deny"}')  # fmt: skip
    return {
        **doc,
        "answer": f"POST /v1/escalations/{esc_id}/answer with "
        f'"Authorization: Bearer {token or "$FLEETGATE_API_TOKEN"}", Content-Type: '
        f"application/json and a body {body}; or run `{approve}` / `{deny}`; "
        "or sign in to this page with the API token",
    }  # fmt: skip


def overview(journal: Journal, now: float, view: View,
             status: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Everything the dashboard shows, read from the journal (and the rules in force)."""
    last = last_finished_tick(journal)
    summary: dict[str, Any] = last["summary"] if last else {}
    hist = journal.fleet.history(now)
    tracks = sorted(hist.instances.values(), key=lambda t: (is_digits(t.id), len(t.id), t.id))
    rates = {**hist.host_rates, **hist.measured_rates()}
    by_state = Counter(t.stage if t.status == "running" else t.status for t in tracks)
    instances = [
        {"id": t.id, "machine": t.machine_id, "stage": t.stage, "status": t.status,
         "daemon": t.daemon, "rate": t.bench_rate if t.bench_rate is not None
         else rates.get(t.machine_id), "since_s": now - t.stage_since,
         "blocked": hist.host_blocked(t.machine_id, now)}
        for t in tracks[:MAX_ROWS]
    ]  # fmt: skip
    demand = summary.get("demand") or (
        [{"task": "all", "pending": summary.get("pending"), "running":
          summary.get("running_tasks"), "oldest_pending_s": None}] if last else []
    )  # fmt: skip
    escalations = journal.escalations.recent(limit=50)
    escalations.sort(key=lambda e: (e["status"] != "pending", -int(e["id"])))
    leader = lease.read(journal, ttl_s=view.ttl_s)
    book = view.rulebook() if view.rulebook is not None else None
    reloads = journal.store.query("SELECT * FROM rule_reloads ORDER BY id DESC LIMIT 1", ())
    guards = view.guards
    spend = summary.get("spend_per_h")
    return {
        "now": now,
        "provider": (status or {}).get("provider"),
        "paused": bool(journal.meta.get("paused", False)) or guards.paused
        or bool((status or {}).get("paused")),
        "last_tick": last,
        "ready": readiness(last, now=now, interval_s=view.interval_s, leader=leader,
                           holder=view.holder),
        "fleet": {"tracked": len(tracks), "by_state": sorted(by_state.items()),
                  "instances": instances, "more": max(0, len(tracks) - MAX_ROWS),
                  "spend_per_h": spend, "foreign": summary.get("foreign") or [],
                  "foreign_total": summary.get("foreign_total")},
        "demand": demand,
        "actions": journal.actions.recent(30)[::-1],
        "escalations": escalations,
        "pending": sum(1 for e in escalations if e["status"] == "pending"),
        "rules": {"paths": list(book.paths) if book else [], "count": len(book.rules)
                  if book else None, "digest": book.digest if book else
                  (last or {}).get("rules"), "reload": reloads[0] if reloads else None},
        "lease": {**leader.as_dict(), "mine": view.holder is not None
                  and leader.holder == view.holder},
        "autonomy": autonomy.status_part(journal),  # suggestions, demotions, the record
        "budgets": [
            ("spend per hour ($)", spend, guards.max_spend_per_hour),
            ("launches in the last hour", hist.launches_since(now - 3600),
             guards.max_launches_per_hour),
            ("instances", summary.get("instances", len(tracks)), guards.max_instances),
            ("launches per tick", None, guards.max_launches_per_tick),
            ("share destroyed per tick", None, guards.max_destroy_share_per_tick),
        ],
    }  # fmt: skip


def dashboard_router(journal: Journal, token: SecretStr, clock: Callable[[], float],
                     record: Record, view: View,
                     status: Callable[[], dict[str, Any]] | None = None) -> APIRouter:  # fmt: skip
    """The pages over `journal`; `clock` is the controller's (what ages and deadlines are
    measured by), `record` takes an answer as the JSON endpoint does."""
    sessions = Sessions(token, journal.meta.identity(), view.wall)
    env = _environment()
    css = resources.files("controller.service").joinpath("templates/dashboard.css").read_bytes()
    router = APIRouter(include_in_schema=False)
    own = {_netloc(view.public_url)} - {""} if view.public_url else set()
    secure_default = (view.public_url or "").startswith("https:")

    def page(name: str, code: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(name).render(**context)
        return HTMLResponse(html, status_code=code, headers=_SECURITY_HEADERS)

    def refused(code: int, message: str, session: str | None = None) -> HTMLResponse:
        return page("message.html", code, title="Refused", message=message,
                    signed_in=session is not None,
                    logout_csrf=sessions.csrf(session, "logout") if session else "")  # fmt: skip

    def same_origin(request: Request) -> bool:
        allowed = own | {request.headers.get("host", "").lower()}
        origin = request.headers.get("origin")
        if origin is not None:
            return origin != "null" and _netloc(origin) in allowed
        referer = request.headers.get("referer")
        return referer is not None and _netloc(referer) in allowed

    def session_of(request: Request) -> str | None:
        return sessions.valid(request.cookies.get(COOKIE))

    def posting(request: Request) -> str | None:
        """A form POST's checks before its body: this server's origin; the session (None on
        the sign-in form, which needs none)."""
        if not same_origin(request):
            raise Refused(refused(403, "this form was not sent from this server's pages "
                                  "(Origin or Referer)"))  # fmt: skip
        session = session_of(request)
        if session is None and request.url.path != "/login":
            raise Refused(refused(401, "sign in first: the session is missing or has lapsed"))
        if request.headers.get("content-type", "").split(";")[0].strip().lower() != (
            "application/x-www-form-urlencoded"
        ):
            raise Refused(refused(415, "a form is sent as application/x-www-form-urlencoded"))
        return session

    async def form(request: Request) -> dict[str, str] | Response:
        try:
            session = posting(request)
        except Refused as exc:
            return exc.response
        body = (await request.body()).decode("utf-8", errors="replace")
        try:
            fields = parse_qs(body, max_num_fields=MAX_FORM_FIELDS)
        except ValueError:
            return refused(400, "too many form fields", session)
        return {k: v[0] for k, v in fields.items()} | {"": session or ""}

    def csrf_refusal(fields: dict[str, str], purpose: str) -> Response | None:
        session = fields[""]
        if not sessions.csrf_ok(session, purpose, fields.get("csrf", "")):
            return refused(403, "the form's CSRF value is missing or wrong: reload the page "
                           "and answer again", session)  # fmt: skip
        return None

    @router.get("/assets/dashboard.css")
    def stylesheet() -> Response:
        return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=300"})

    @router.get("/favicon.ico")
    def icon() -> Response:
        return Response(
            ICON, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"}
        )

    @router.get("/login")
    def login_form(next: str = "/") -> Response:
        return page("login.html", next=next if _NEXT.match(next) else "/", error=None, esc=None)

    @router.post("/login")
    def login(request: Request, fields: Form = Depends(form)) -> Response:  # noqa: B008
        if isinstance(fields, Response):
            return fields
        target = fields.get("next", "/")
        target = target if _NEXT.match(target) else "/"
        if not sessions.token_ok(fields.get("token", "")):
            return page("login.html", 401, next=target, error="That is not the API token.",
                        esc=None)  # fmt: skip
        response = RedirectResponse(target, status_code=303, headers=_SECURITY_HEADERS)
        response.set_cookie(COOKIE, sessions.mint(), max_age=SESSION_S, path="/",
                            httponly=True, samesite="strict",
                            secure=secure_default or request.url.scheme == "https")  # fmt: skip
        return response

    @router.post("/logout")
    def logout(fields: Form = Depends(form)) -> Response:  # noqa: B008
        if isinstance(fields, Response):
            return fields
        if (bad := csrf_refusal(fields, "logout")) is not None:
            return bad
        response = RedirectResponse("/login", status_code=303, headers=_SECURITY_HEADERS)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    @router.get("/")
    def dashboard(request: Request) -> Response:
        session = session_of(request)
        if session is None:
            return RedirectResponse("/login", status_code=303, headers=_SECURITY_HEADERS)
        data = overview(journal, clock(), view, status() if status is not None else None)
        return page("dashboard.html", d=data, logout_csrf=sessions.csrf(session, "logout"),
                    signed_in=True)  # fmt: skip

    @router.get("/escalations/{esc_id}", response_model=None)
    def escalation_page(esc_id: int, request: Request) -> Response | dict[str, Any]:
        esc = journal.escalations.escalation(esc_id) if 0 < esc_id < 2**63 else None
        html = wants_html(request.headers.get("accept", ""))
        if esc is None:
            if html:
                return refused(404, f"There is no escalation #{esc_id}.")
            raise HTTPException(404, f"no escalation #{esc_id}")
        if not html:
            return public_doc(esc, view.how)
        session = session_of(request)
        if session is None:  # what it is, and the sign-in form that comes back here
            return page("login.html", next=f"/escalations/{esc_id}", error=None, esc=esc)
        return escalation_view(esc, session)

    def escalation_view(esc: dict[str, Any], session: str, code: int = 200,
                        notice: str | None = None) -> Response:  # fmt: skip
        esc_id = int(esc["id"])
        situation = esc.get("situation") or {}
        return page(
            "escalation.html", code, esc=esc, s=situation, now=clock(),
            shown=approvals.shown_proposal(journal, esc) if esc["status"] == "pending" else None,
            deliveries=journal.escalations.deliveries(esc_id),
            actions=journal.actions.actions_for_escalation(esc_id),
            csrf=sessions.csrf(session, f"answer:{esc_id}"), notice=notice,
            logout_csrf=sessions.csrf(session, "logout"), signed_in=True,
        )  # fmt: skip

    @router.post("/escalations/{esc_id}/answer")
    def answer(esc_id: int, fields: Form = Depends(form)) -> Response:  # noqa: B008
        if isinstance(fields, Response):
            return fields
        if not 0 < esc_id < 2**63:
            return refused(404, f"There is no escalation #{esc_id}.", fields[""])
        if (bad := csrf_refusal(fields, f"answer:{esc_id}")) is not None:
            return bad
        decision = fields.get("decision", "")
        if decision not in ("approve", "deny"):
            return refused(422, "the answer is approve or deny", fields[""])
        action = (fields.get("action") or None) if decision == "approve" else None
        try:
            record(esc_id, decision, action, "operator")
        except HTTPException as exc:
            esc = journal.escalations.escalation(esc_id) if 0 < esc_id < 2**63 else None
            if esc is None:
                return refused(exc.status_code, str(exc.detail), fields[""])
            return escalation_view(esc, fields[""], exc.status_code, str(exc.detail))
        return RedirectResponse(f"/escalations/{esc_id}?answered={quote(decision)}",
                                status_code=303, headers=_SECURITY_HEADERS)  # fmt: skip

    return router

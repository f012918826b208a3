"""`SimVastAPI`: vast.ai's REST API answered by the simulated world, below the HTTP wire.

Mounted on a `requests.Session`, it answers what `controller.fleet.vast_client` sends with
vast's paths, query encoding, JSON shapes and status codes, so the production client and
provider run unchanged against the simulation (`calls` counts requests per endpoint):

    endpoint  request                                 answer
    list      GET    /api/v1/instances/               paged: limit (<= 25), after_token, ...
    list_v0   GET    /api/v0/instances/               410 Gone (retired)
    show      GET    /api/v0/instances/{id}/          {"instances": obj | null}
    search    POST   /api/v0/bundles/                 {"offers": [...]}: machines not rented
    create    PUT    /api/v0/asks/{ask}/              {"success", "new_contract"}; 404 no_such_ask
    destroy   DELETE /api/v0/instances/{id}/          404 when vast does not know it
    reboot    PUT    /api/v0/instances/reboot/{id}/
    update    PUT    /api/v0/instances/{id}/          {"state": "running"|"stopped"} or {"label"}
                                                      (a start that waits for its host's
                                                      GPUs: success false, "state change
                                                      queued", as vast answers it)

Every call needs `Authorization: Bearer <api_key>` (else 401). The account's foreign instances,
empty API labels and late creates live in `World.account`; wire faults (SimConfig
`vast_*_fraction`, `create_*_fraction`) and late-create delays are drawn per call from an RNG
seeded by the world's salt and the call counter in the world's state, never the world's RNG.
A create's `env` (its FLEETGATE_* values, among them the instance's own token) is kept in
`World.account.env` for the container's agent, as a real container's environment holds it.

Must not decide anything about the fleet; no sockets, no threads, no wall clock: time is the
`now` it is given.
"""

from __future__ import annotations

import datetime
import http
import json
import random
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import BaseAdapter
from requests.cookies import RequestsCookieJar
from requests.models import PreparedRequest, Response
from requests.structures import CaseInsensitiveDict

from controller.fleet.base import PermanentProviderError
from controller.sim import vast_views as views
from controller.sim.config import SimConfig
from controller.sim.simulation import Simulation
from controller.sim.vast_listing import Listing, ListQuery, Reply, error
from controller.sim.world import World

READS = ("list", "list_v0", "show", "search")
MUTATIONS = ("destroy", "reboot", "update")
_ROUTES = (
    ("GET", re.compile(r"/api/v1/instances/?"), "list"),
    ("GET", re.compile(r"/api/v0/instances/?"), "list_v0"),
    ("GET", re.compile(r"/api/v0/instances/(\d+)/?"), "show"),
    ("POST", re.compile(r"/api/v0/bundles/?"), "search"),
    ("PUT", re.compile(r"/api/v0/asks/(\d+)/?"), "create"),
    ("DELETE", re.compile(r"/api/v0/instances/(\d+)/?"), "destroy"),
    ("PUT", re.compile(r"/api/v0/instances/reboot/(\d+)/?"), "reboot"),
    ("PUT", re.compile(r"/api/v0/instances/(\d+)/?"), "update"),
)


@dataclass(frozen=True)
class Raw:
    """A body sent as it is (e.g. JSON cut short)."""

    text: str
    content_type: str = "application/json"


@dataclass(frozen=True)
class _Draw:
    """One call's uniform numbers in [0, 1), always drawn in this order."""

    rate_limit: float
    unavailable: float
    truncate: float
    create: float
    late: float


class SimVastAPI(BaseAdapter):
    """A requests transport answering as vast.ai does, from a simulated world."""

    def __init__(
        self, sim: Simulation | World, api_key: str, *, now: Callable[[], float] | None = None
    ) -> None:
        super().__init__()
        if isinstance(sim, World):
            if now is None:
                raise TypeError("SimVastAPI on a World needs its virtual clock `now`")
            self._world, self._now = sim, now
        else:
            self._world, self._now = sim.world, now or sim.now
        self._auth = f"Bearer {api_key}"
        self._prefix = ""
        self.calls: Counter[str] = Counter()

    def mount(self, session: requests.Session, base_url: str) -> None:
        """Answer every request `session` sends under `base_url`. Also sets the session's
        `trust_env` off: nothing from the environment (proxies, ~/.netrc) applies to it."""
        self._prefix = urlsplit(base_url).path.rstrip("/")
        session.trust_env = False
        session.mount(base_url.rstrip("/") + "/", self)

    def send(
        self,
        request: PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float, float] | tuple[float, None] | None = None,
        verify: bool | str = True,
        cert: bytes | str | tuple[bytes | str, bytes | str] | None = None,
        proxies: Mapping[str, str] | None = None,
    ) -> Response:
        url = urlsplit(request.url or "")
        path = url.path.removeprefix(self._prefix)
        endpoint, number = _route((request.method or "GET").upper(), path)
        self.calls[endpoint] += 1
        code, body = self._answer(request, endpoint, number, url.query)
        return _response(request, code, body)

    def close(self) -> None:
        """Nothing to close: no sockets."""

    # ---- one call ------------------------------------------------------------------------

    def _answer(self, request: PreparedRequest, endpoint: str, number: int, query: str) -> Reply:
        if endpoint == "unknown":
            return 404, error("not_found", "no such endpoint")
        if request.headers.get("Authorization") != self._auth:
            return 401, error("auth_error", "Invalid user key")
        cfg, draw = self._world.config, self._draw()
        if draw.rate_limit < cfg.vast_429_fraction:
            return 429, "API requests too frequent"
        if endpoint in READS + MUTATIONS and draw.unavailable < cfg.vast_5xx_fraction:
            return 503, "<html><body><h1>503 Service Unavailable</h1></body></html>"
        if endpoint == "create":
            return self._create(number, _body(request), draw, cfg)
        code, data = self._handle(endpoint, number, query, _body(request))
        if endpoint in READS and code == 200 and draw.truncate < cfg.vast_truncated_fraction:
            text = encode(data)
            return code, Raw(text[: len(text) // 2])
        return code, data

    def _draw(self) -> _Draw:
        account = self._world.account
        rng = random.Random(f"{account.salt}:wire:{account.wire_calls}")
        account.wire_calls += 1
        return _Draw(*(rng.random() for _ in range(5)))

    def _handle(self, endpoint: str, number: int, query: str, body: Any) -> Reply:
        world, now = self._world, self._now()
        listing = Listing(world, now)
        if endpoint == "list":
            try:
                return 200, listing.page(_list_query(query))
            except ValueError as exc:
                return 400, error("invalid_args", str(exc))
        if endpoint == "list_v0":
            return 410, "Gone: this listing is retired, use /api/v1/instances/"
        if endpoint == "show":
            return 200, {"instances": listing.show(str(number))}
        if endpoint == "search":
            return _search(world, body)
        if not listing.exists(str(number)):
            return 404, error("no_such_instance", f"Instance {number} not found.")
        try:
            if endpoint == "destroy":
                return listing.destroy(str(number))
            if endpoint == "reboot":
                return listing.reboot(str(number))
            return listing.update(str(number), body)
        except PermanentProviderError as exc:
            return 400, error("invalid_request", str(exc))

    def _create(self, ask: int, body: Any, draw: _Draw, cfg: SimConfig) -> Reply:
        world, now = self._world, self._now()
        machine_id = views.machine_of_ask(ask)
        if machine_id not in world.machines or machine_id in world.busy_machines():
            return 404, error("no_such_ask", f"Instance type {ask} is no longer available.")
        body = body if isinstance(body, dict) else {}
        image, label = body.get("image"), body.get("label") or ""
        if not isinstance(image, str) or not image:
            return 400, error("invalid_args", "image is required")
        if not isinstance(label, str):
            return 400, error("invalid_args", "label must be a string")
        failed, lost = cfg.create_failed_fraction, cfg.create_lost_fraction
        if draw.create < failed:
            return 500, error("server_error", "Internal server error")
        instance_id = world.launch_on(machine_id, label, now)
        world.account.keep_env(instance_id, body.get("env"))
        low, high = cfg.late_create_s
        if high > 0:
            world.account.hidden_until[instance_id] = now + low + (high - low) * draw.late
        if draw.create < failed + lost:
            return 502, "<html><body><h1>502 Bad Gateway</h1></body></html>"
        return 200, {"success": True, "new_contract": int(instance_id)}


def _search(world: World, body: Any) -> Reply:
    if not isinstance(body, dict):
        return 400, error("invalid_args", "the search body must be a JSON object")
    try:
        terms = views.terms(body)
        limit = body.get("limit", 64)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"bad limit {limit!r}")
        busy = world.busy_machines()
        offers = [views.offer(m) for m in world.machines.values() if m.machine_id not in busy]
        found = views.ordered((o for o in offers if views.matches(o, terms)), body.get("order", []))
    except ValueError as exc:
        return 400, error("invalid_args", str(exc))
    return 200, {"offers": found[:limit]}


def _route(method: str, path: str) -> tuple[str, int]:
    """(endpoint name, the number in the path or 0); ("unknown", 0) for anything else."""
    for verb, pattern, endpoint in _ROUTES:
        found = pattern.fullmatch(path) if verb == method else None
        if found:
            return endpoint, int(found.group(1)) if found.groups() else 0
    return "unknown", 0


def _body(request: PreparedRequest) -> Any:
    raw = request.body
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _response(request: PreparedRequest, code: int, body: Any) -> Response:
    """A finished `Response`: the body encoded once, as JSON unless it is text already."""
    if isinstance(body, Raw):
        text, kind = body.text, body.content_type
    elif isinstance(body, str):
        text, kind = body, "text/html" if body.startswith("<") else "text/plain"
    else:
        text, kind = encode(body), "application/json"
    content = text.encode("utf-8")
    response = Response.__new__(Response)  # what Response() sets, with one empty cookie jar
    response.__dict__.update(
        _content=content, _content_consumed=False, _next=None, status_code=code,
        headers=CaseInsensitiveDict({"Content-Type": kind, "Content-Length": str(len(content))}),
        raw=None, url=request.url or "", encoding="utf-8", history=[],
        reason=http.HTTPStatus(code).phrase, cookies=_NO_COOKIES, elapsed=_NO_TIME,
        request=request,
    )  # fmt: skip
    return response


_NO_COOKIES = RequestsCookieJar()  # vast sets none; shared by every reply, never written
_NO_TIME = datetime.timedelta(0)


_TEXTS: dict[int, tuple[dict[str, Any], str]] = {}  # id(instance object) -> (it, its JSON)


def encode(body: Any) -> str:
    """`json.dumps(body)`, byte for byte, reusing each instance object's text: a listing's
    objects are shared and never mutated (`vast_views`), and every tick lists them again."""
    if not isinstance(body, dict) or not body or next(reversed(body)) != "instances":
        return json.dumps(body)
    rows = body["instances"]
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        return json.dumps(body)
    if len(_TEXTS) > views.ROWS_CACHED:
        _TEXTS.clear()
    texts = []
    for row in rows:
        held = _TEXTS.get(id(row))
        if held is None or held[0] is not row:
            held = _TEXTS[id(row)] = (row, json.dumps(row))
        texts.append(held[1])
    head = json.dumps({k: v for k, v in body.items() if k != "instances"})
    start = f"{head[:-1]}, " if len(body) > 1 else "{"
    return f'{start}"instances": [{", ".join(texts)}]}}'


@lru_cache(maxsize=256)
def _list_query(query: str) -> ListQuery:
    """A list call's query, parsed once per distinct query string (every tick sends the same
    first page); ValueError as `ListQuery.parse`."""
    return ListQuery.parse(query)

"""A fake vast.ai API: real HTTP on 127.0.0.1, state on a virtual clock, scripted faults.

    with FakeVast(offers=[offer(101, machine_id=7, dph=0.50)]) as fake:
        settings = VastSettings(base_url=fake.url, api_key=fake.api_key, image="img")
        fake.script("list", RateLimited(), Status(503))
        fake.advance(60)                  # instances boot: null -> loading -> running
        fake.requests, fake.creates_by_label, fake.instances

It speaks what controller/fleet/vast_client.py sends (the official CLI's requests):

    endpoint   request
    list       GET    /api/v1/instances/?limit=..&after_token=..  (paged, next_token)
    list_v0    GET    /api/v0/instances/                          (always 410 Gone: retired)
    show       GET    /api/v0/instances/{id}/                     ({"instances": obj | null})
    search     POST   /api/v0/bundles/                            (ops eq neq gt gte lt lte in..)
    create     PUT    /api/v0/asks/{offer}/                       (one offer = one instance)
    destroy    DELETE /api/v0/instances/{id}/
    update     PUT    /api/v0/instances/{id}/                     ({"state": ..} or {"label": ..})
    reboot     PUT    /api/v0/instances/reboot/{id}/

Every request needs `Authorization: Bearer <api_key>` (else 401) and is recorded. A request
takes the next fault scripted for its endpoint, if any:

    Status(code, body)   answer that, do nothing          RateLimited()  429, plain text, no
    Malformed(body)      200 with a broken JSON body                       Retry-After
    Empty()              an empty listing (list only)      Close()        hang up, no answer
    Delay(s, then)       wait s seconds, then `then` or the normal answer (a client timeout)
    Lost(reply)          do the work (e.g. create), then answer `reply` (a Status or Close())

Instances' public address is loopback (a health check must never leave this machine);
`on_create(fields)` may change a new instance's fields (e.g. its port mapping).
`late_creates = n` hides each new instance from the listing (and show, unless
`late_shows = False`) for the next n listing calls (a listing call is a first-page request).
`vanish(offer_id)` keeps an offer in search results but answers its create with 404 no_such_ask.
`unschedulable` holds offers vast cannot schedule now (their GPUs are busy): a create with
`cancel_unavail` is refused (HTTP 200, success false; vast's own words for it are not known)
and rents nothing; one without it rents an instance that stays stopped (intended_status
running), as vast's CLI says it does ("rather than creating a stopped instance").
`taken_hosts` holds instances whose host's GPUs someone else rented while they were stopped: a
start answers as vast does then (HTTP 200, success false, "state change queued") and leaves the
instance stopped with intended_status running until the test lets it run.
`empty_as_null = True` answers a listing page without instances `"instances": null`, which
vast's own client reads as none (vast-cli: `data.get("instances") or []`).
`stopped_as = "exited"` lists a stopped instance as instances stopped with `vastai stop instance`
have been reported listed (`actual_status: exited`, `intended_status: stopped`) instead of as
vast's docs say (`stopped`).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fakes.base import QuietHandler, RecordingServer

EPOCH = 1_700_000_000.0  # start_date of an instance created at virtual time 0
_SEARCH_KEYS = ("order", "type", "limit", "allocated_storage", "disable_bundling")
START_QUEUED_MSG = "Required resources are currently unavailable, state change queued."
UNAVAILABLE_MSG = "Required resources are currently unavailable."  # a guess at vast's words


@dataclass(frozen=True)
class Status:
    code: int
    body: str = '{"success": false, "error": "server_error", "msg": "scripted failure"}'
    content_type: str = "application/json"


@dataclass(frozen=True)
class RateLimited:
    body: str = "API requests too frequent"


@dataclass(frozen=True)
class Malformed:
    body: str = '{"instances": [{"id": 1,'


@dataclass(frozen=True)
class Empty:
    pass


@dataclass(frozen=True)
class Close:
    pass


@dataclass(frozen=True)
class Delay:
    seconds: float
    then: Fault | None = None


@dataclass(frozen=True)
class Lost:
    reply: Status | Close


Fault = Status | RateLimited | Malformed | Empty | Close | Delay | Lost


@dataclass(frozen=True)
class Recorded:
    endpoint: str
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


@dataclass
class _Instance:
    fields: dict[str, Any]
    created_at: float
    visible_after: int = 0  # listing calls before it shows
    status: str | None = None  # an override of the boot timeline (stopped, exited, ...)
    status_until: float | None = None  # the override ends then (rebooting)
    reboots: int = 0


def offer(
    offer_id: int, machine_id: int | None = None, dph: float = 0.50, **fields: Any
) -> dict[str, Any]:
    """An offer that passes fleetgate's default filter, with `fields` over it."""
    machine = machine_id if machine_id is not None else offer_id * 10
    base = {
        "id": offer_id, "machine_id": machine, "host_id": machine + 100000,
        "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564, "cpu_ram": 257000,
        "cpu_cores": 32, "disk_space": 500.0, "inet_down": 900.0, "dph_total": dph,
        "reliability": 0.99, "cuda_max_good": 13.0, "geolocation": "SE", "verified": True,
        "external": False, "rentable": True, "rented": False,
    }  # fmt: skip
    return {**base, **fields}


class FakeVast:
    """The server; a context manager that starts it in a thread and stops it on exit."""

    def __init__(
        self,
        api_key: str = "fake-vast-key-0123456789abcdef",
        offers: list[dict[str, Any]] | None = None,
        *,
        boot_s: float = 30.0,
        load_s: float = 120.0,
        reboot_s: float = 20.0,
        first_id: int = 5000,
    ) -> None:
        self.api_key = api_key
        self.boot_s, self.load_s, self.reboot_s = boot_s, load_s, reboot_s
        self.now = 0.0
        self.late_creates = 0
        self.late_shows = True  # False: show finds an instance the listing still hides
        self.on_create: Callable[[dict[str, Any]], None] | None = None
        self.list_calls = 0
        self.requests: list[Recorded] = []
        self.creates_by_label: Counter[str] = Counter()
        self.errors: list[BaseException] = []
        self.offers: dict[int, dict[str, Any]] = {o["id"]: dict(o) for o in offers or []}
        self._vanished: set[int] = set()
        self.taken_hosts: set[int] = set()  # instances a start leaves waiting (see above)
        self.unschedulable: set[int] = set()  # offers whose GPUs are busy now (see above)
        self.stopped_as = "stopped"  # or "exited" (see above)
        self.empty_as_null = False  # True: a page without instances lists null (see above)
        self._instances: dict[int, _Instance] = {}
        self._next_id = first_id
        self._faults: dict[str, deque[Fault]] = {}
        self.lock = threading.RLock()
        self.stopping = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeVast:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    # ---- driving it ----------------------------------------------------------------------

    def script(self, endpoint: str, *faults: Fault) -> None:
        with self.lock:
            self._faults.setdefault(endpoint, deque()).extend(faults)

    def rate_limit(self, endpoint: str, times: int) -> None:
        self.script(endpoint, *[RateLimited()] * times)

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds

    def vanish(self, offer_id: int) -> None:
        with self.lock:
            self._vanished.add(offer_id)

    def add_instance(self, status: str | None = None, **fields: Any) -> int:
        """An instance that exists already (booted unless `status` says otherwise)."""
        with self.lock:
            iid = self._new_id()
            machine = fields.pop("machine_id", iid % 1000 + 1)
            base = _instance_fields(iid, offer(iid, machine_id=machine), fields.pop("label", ""))
            if status == "stopped":
                fields.setdefault("intended_status", "stopped")
            inst = _Instance({**base, **fields}, self.now - self.boot_s - self.load_s)
            inst.status = status
            self._instances[iid] = inst
            return iid

    def set_status(self, instance_id: int, status: str | None) -> None:
        with self.lock:
            self._instances[instance_id].status = status

    # ---- looking at it -------------------------------------------------------------------

    @property
    def instances(self) -> dict[int, dict[str, Any]]:
        """Every live instance as the API shows it (hidden late ones included)."""
        with self.lock:
            return {iid: self._view(inst) for iid, inst in self._instances.items()}

    def of(self, endpoint: str) -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests if r.endpoint == endpoint]

    # ---- used by the handler -------------------------------------------------------------

    def record(self, entry: Recorded) -> Fault | None:
        with self.lock:
            self.requests.append(entry)
            queue = self._faults.get(entry.endpoint)
            return queue.popleft() if queue else None

    def handle(self, req: Recorded) -> tuple[int, Any]:
        """The normal answer: (status, JSON-able body)."""
        if req.headers.get("Authorization") != f"Bearer {self.api_key}":
            return 401, {"success": False, "error": "auth_error", "msg": "Invalid user key"}
        route: Callable[[Recorded], tuple[int, Any]] = getattr(self, f"_{req.endpoint}")
        with self.lock:
            return route(req)

    def _list(self, req: Recorded) -> tuple[int, Any]:
        try:
            limit = json.loads(req.query.get("limit", "25"))
            assert isinstance(json.loads(req.query.get("select_filters", "{}")), dict)
            assert isinstance(json.loads(req.query.get("order_by", "[]")), list)
            after = _decode_token(req.query["after_token"]) if "after_token" in req.query else None
        except (ValueError, AssertionError, binascii.Error):
            return 400, {"success": False, "error": "invalid_args", "msg": "bad query"}
        if not isinstance(limit, int) or not 1 <= limit <= 25:
            return 400, {"success": False, "error": "invalid_args", "msg": "limit must be 1-25"}
        if after is None:
            self.list_calls += 1
        visible = sorted(i for i, inst in self._instances.items() if self._visible(inst))
        rest = [i for i in visible if after is None or i > after]
        page, more = rest[:limit], len(rest) > limit
        return 200, {
            "success": True, "instances_found": len(page), "total_instances": len(visible),
            "next_token": _encode_token(page[-1]) if more else None,
            "instances": [self._view(self._instances[i]) for i in page]
            if page or not self.empty_as_null else None,
        }  # fmt: skip

    def _list_v0(self, req: Recorded) -> tuple[int, Any]:
        return 410, "Gone: this listing is retired, use /api/v1/instances/"

    def _show(self, req: Recorded) -> tuple[int, Any]:
        inst = self._instances.get(_path_id(req.path))
        shown = inst is not None and (self._visible(inst) or not self.late_shows)
        return 200, {"instances": self._view(inst) if shown and inst else None}

    def _search(self, req: Recorded) -> tuple[int, Any]:
        body = req.body if isinstance(req.body, dict) else {}
        terms = {k: v for k, v in body.items() if k not in _SEARCH_KEYS}
        bad = [k for k, v in terms.items() if not isinstance(v, dict) or set(v) - set(_OPS)]
        if bad:
            return 400, {"success": False, "error": "invalid_args", "msg": f"bad terms {bad}"}
        found = [o for o in self.offers.values() if all(_match(o, k, t) for k, t in terms.items())]
        for name, direction in reversed(body.get("order", [])):
            found.sort(key=lambda o: o.get(name) or 0, reverse=direction == "desc")  # noqa: B023
        return 200, {"offers": found[: int(body.get("limit", 64))]}

    def _create(self, req: Recorded) -> tuple[int, Any]:
        offer_id = _path_id(req.path)
        ask = self.offers.get(offer_id)
        if ask is None or offer_id in self._vanished:
            return 404, {"success": False, "error": "no_such_ask", "msg": f"no ask {offer_id}"}
        body = req.body if isinstance(req.body, dict) else {}
        if not body.get("image"):
            return 400, {"success": False, "error": "invalid_args", "msg": "image is required"}
        waits = offer_id in self.unschedulable
        if waits and body.get("cancel_unavail") is True:
            return 200, {"success": False, "error": "unavailable", "msg": UNAVAILABLE_MSG}
        iid = self._new_id()
        fields = _instance_fields(iid, ask, body.get("label") or "", body)
        if self.on_create is not None:
            self.on_create(fields)  # e.g. point its status port at a local stand-in
        inst = _Instance(fields, self.now)
        inst.status = "stopped" if waits else None  # rented, waiting for the GPUs
        inst.visible_after = self.list_calls + self.late_creates
        self._instances[iid] = inst
        del self.offers[offer_id]
        self.creates_by_label[body.get("label") or ""] += 1
        return 200, {"success": True, "new_contract": iid}

    def _destroy(self, req: Recorded) -> tuple[int, Any]:
        if self._instances.pop(_path_id(req.path), None) is None:
            return 404, {"success": False, "error": "no_such_instance", "msg": "no instance"}
        return 200, {"success": True}

    def _update(self, req: Recorded) -> tuple[int, Any]:
        inst = self._instances.get(_path_id(req.path))
        body = req.body if isinstance(req.body, dict) else {}
        if inst is None:
            return 404, {"success": False, "error": "no_such_instance", "msg": "no instance"}
        if body.get("state") in ("running", "stopped"):
            inst.fields["intended_status"] = body["state"]
            taken = _path_id(req.path) in self.taken_hosts and inst.status == "stopped"
            if body["state"] == "running" and taken:
                return 200, {"success": False, "msg": START_QUEUED_MSG}
            inst.status = None if body["state"] == "running" else "stopped"
        elif isinstance(body.get("label"), str):
            inst.fields["label"] = body["label"]
        else:
            return 400, {"success": False, "error": "invalid_args", "msg": "state or label"}
        return 200, {"success": True}

    def _reboot(self, req: Recorded) -> tuple[int, Any]:
        inst = self._instances.get(_path_id(req.path))
        if inst is None:
            return 404, {"success": False, "error": "no_such_instance", "msg": "no instance"}
        inst.reboots += 1
        inst.status, inst.status_until = "rebooting", self.now + self.reboot_s
        return 200, {"success": True}

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _visible(self, inst: _Instance) -> bool:
        return self.list_calls >= inst.visible_after

    def _view(self, inst: _Instance) -> dict[str, Any]:
        if inst.status_until is not None and self.now >= inst.status_until:
            inst.status, inst.status_until = None, None
        age = self.now - inst.created_at
        if inst.status is not None:
            status, msg = inst.status, f"scripted: {inst.status}"
        elif age < self.boot_s:
            status, msg = None, ""
        elif age < self.boot_s + self.load_s:
            status, msg = "loading", "Pulling image"
        else:
            status, msg = "running", "success, running"
        stopped = status == "stopped"
        if stopped and inst.fields.get("intended_status") == "stopped":
            status = self.stopped_as
        return {**inst.fields, "actual_status": status, "status_msg": msg,
                "cur_state": "stopped" if stopped else "running"}  # fmt: skip


_OPS = ("eq", "neq", "gt", "gte", "lt", "lte", "in", "notin")


def _match(item: dict[str, Any], name: str, term: dict[str, Any]) -> bool:
    value = item.get(name)
    for op, want in term.items():
        if op in ("eq", "neq") and (value == want) != (op == "eq"):
            return False
        if op in ("in", "notin") and (value in want) != (op == "in"):
            return False
        if op in ("gt", "gte", "lt", "lte"):
            if not isinstance(value, int | float):
                return False
            ok = {"gt": value > want, "gte": value >= want, "lt": value < want,
                  "lte": value <= want}[op]  # fmt: skip
            if not ok:
                return False
    return True


def _instance_fields(
    iid: int, ask: dict[str, Any], label: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    body = body or {}
    env = body.get("env") or {}
    return {
        "id": iid, "machine_id": ask["machine_id"], "host_id": ask["host_id"], "label": label,
        "intended_status": "running", "start_date": EPOCH + iid, "gpu_name": ask["gpu_name"],
        "num_gpus": ask["num_gpus"], "gpu_ram": ask["gpu_ram"], "cpu_ram": ask["cpu_ram"],
        "dph_total": ask["dph_total"], "reliability2": ask["reliability"],
        "geolocation": ask["geolocation"], "public_ipaddr": "127.0.0.1",
        "ssh_host": "ssh1.vast.ai", "ssh_port": 20000 + iid % 10000,
        "ports": {"9821/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(40000 + iid % 1000)}]},
        "image_uuid": body.get("image", "fake/image"), "image_runtype": body.get("runtype"),
        "extra_env": [[k, v] for k, v in env.items()], "onstart": body.get("onstart", ""),
        "disk_space": body.get("disk", 250.0), "mem_usage": 0.0, "mem_limit": 240.0,
    }  # fmt: skip


def _encode_token(last_id: int) -> str:
    return base64.b64encode(json.dumps({"after": last_id}).encode()).decode()


def _decode_token(token: str) -> int:
    value = json.loads(base64.b64decode(token.encode(), validate=True))["after"]
    if not isinstance(value, int):
        raise ValueError("bad token")
    return value


def _path_id(path: str) -> int:
    return int(re.findall(r"/(\d+)/?$", path)[0])


_ROUTES = (
    ("GET", re.compile(r"^/api/v1/instances/?$"), "list"),
    ("GET", re.compile(r"^/api/v0/instances/?$"), "list_v0"),
    ("GET", re.compile(r"^/api/v0/instances/\d+/$"), "show"),
    ("POST", re.compile(r"^/api/v0/bundles/$"), "search"),
    ("PUT", re.compile(r"^/api/v0/asks/\d+/$"), "create"),
    ("DELETE", re.compile(r"^/api/v0/instances/\d+/$"), "destroy"),
    ("PUT", re.compile(r"^/api/v0/instances/reboot/\d+/$"), "reboot"),
    ("PUT", re.compile(r"^/api/v0/instances/\d+/$"), "update"),
)


class _Server(RecordingServer):
    fake: FakeVast


class _Handler(QuietHandler):
    server: _Server

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        fake = self.server.fake
        url = urlsplit(self.path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        endpoint = next((e for m, p, e in _ROUTES if m == method and p.match(url.path)), "")
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        req = Recorded(endpoint, method, url.path, query, dict(self.headers), body)
        fault = fake.record(req)
        if not endpoint:
            self._send(404, {"success": False, "error": "not_found", "msg": url.path})
            return
        self._answer(req, fault)

    def _answer(self, req: Recorded, fault: Fault | None) -> None:
        fake = self.server.fake
        if isinstance(fault, Delay):
            if fake.stopping.wait(fault.seconds):
                return
            fault = fault.then
        if isinstance(fault, Close):
            self.close_connection = True
            return
        if isinstance(fault, Lost):
            fake.handle(req)
            self._answer(req, fault.reply)
        elif isinstance(fault, Status):
            self._send(fault.code, fault.body, fault.content_type)
        elif isinstance(fault, RateLimited):
            self._send(429, fault.body, "text/plain")
        elif isinstance(fault, Malformed):
            self._send(200, fault.body)
        elif isinstance(fault, Empty):
            empty: dict[str, Any] = {"success": True, "instances_found": 0, "total_instances": 0,
                     "next_token": None, "instances": []}  # fmt: skip
            self._send(200, empty)
        else:
            code, answer = fake.handle(req)
            self._send(code, answer, "text/plain" if isinstance(answer, str) else None)

    def _send(self, code: int, answer: Any, content_type: str | None = None) -> None:
        text = answer if isinstance(answer, str) else json.dumps(answer)
        data = text.encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", content_type or "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


__all__ = [
    "Close", "Delay", "Empty", "FakeVast", "Lost", "Malformed", "RateLimited", "Recorded",
    "Status", "offer",
]  # fmt: skip

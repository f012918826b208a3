"""The vast.ai REST client: one HTTP seam, per-endpoint pacing, retries, and an error per outcome.

What it sends is what vast's official client sends (vast-ai/vast-cli, `vastai/api/`): bearer
auth; the instance list from `GET /api/v1/instances/` paged with `limit` (at most 25) and
`after_token` (the previous page's `next_token`), query values JSON-encoded except plain
strings; offers from `POST /api/v0/bundles/`; a create is `PUT /api/v0/asks/{offer}/`. Unlike
the official client, the key never goes into a query string, and a create is never retried.

Every call waits for its endpoint's minimum interval first (the `min_interval_s` setting; vast
limits each endpoint to one call per interval and answers 429 otherwise). Then, with
attempts = 1 + `retries` and waits of backoff_s, 2*backoff_s, 4*backoff_s, ...:

    policy   calls                                 retried on
    read     list, show, search                    429, 5xx, timeouts, connection errors, and
                                                   a 2xx whose body is not JSON (cut short)
    mutate   destroy, reboot, set_state, set_label 429 (vast refuses before acting) and
                                                   connection errors before the request left;
                                                   a 2xx with a non-JSON body is taken as done
    create   create                                never: the request may have reached vast;
                                                   a 2xx that is not JSON is CreateOutcomeUnknown

A retried read logs a warning naming the call and why (never the key). A read whose last
attempt is still not JSON is a TemporaryProviderError (a SensorError for the listing).

Errors (messages are built from ids with !r and never hold the API key):

    ProviderError
     ├── TemporaryProviderError
     │    └── CreateOutcomeUnknown   the create may have happened: look for its label
     └── PermanentProviderError
          └── OfferGone              the offer was taken; nothing was created
    SensorError                      list_instances: the listing is unknown, never "empty"

This module must NOT choose offers, map instances or decide anything about the fleet
(`controller.fleet.vast` does), and must NOT sleep or read the clock except through the
`clock` and `sleep` it is given.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import requests

from controller.fleet import base
from controller.fleet.base import (
    PermanentProviderError,
    ProviderError,
    SensorError,
    TemporaryProviderError,
)
from controller.fleet.retry import reason, retry_delay

if TYPE_CHECKING:
    from controller.fleet.vast import VastSettings

log = logging.getLogger(__name__)

PAGE_LIMIT = 25  # vast's maximum page size for the v1 instance list
MAX_PAGES = 4000  # 100,000 instances: more means the cursor is going round in circles
_SNIPPET = 160
_BAD_REQUEST = (
    requests.exceptions.InvalidURL,
    requests.exceptions.MissingSchema,
    requests.exceptions.InvalidSchema,
    requests.exceptions.InvalidHeader,
)

Policy = Literal["read", "mutate", "create"]


class OfferGone(PermanentProviderError):
    """vast answered `no_such_ask`: somebody else rented the offer. Nothing was created."""

    def __init__(self, offer_id: int, label: str) -> None:
        super().__init__(f"offer {offer_id!r} is gone (no_such_ask); label {label!r} not created")
        self.offer_id = offer_id
        self.label = label


class CreateOutcomeUnknown(base.CreateOutcomeUnknown):
    """The create may have reached vast: an instance labelled `label` may exist (and bill)."""

    def __init__(self, offer_id: int, label: str, reason: str) -> None:
        super().__init__(label, f"create on offer {offer_id!r}: {reason}")
        self.offer_id = offer_id


class _Unreached(Exception):
    """Internal: no HTTP answer. `sent` is False only when the request surely never left."""

    def __init__(self, reason: str, sent: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sent = sent


class VastClient:
    """vast.ai's REST API as this project needs it; see the module docstring for the policies."""

    def __init__(
        self,
        settings: VastSettings,
        session: requests.Session | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self._session = session if session is not None else requests.Session()
        self._clock = clock
        self._sleep = sleep
        self._next_slot: dict[str, float] = {}
        self._prepared: dict[Any, requests.PreparedRequest] = {}
        self._lock = threading.Lock()

    @property
    def clock(self) -> Callable[[], float]:
        """The injected clock this client paces by; the provider times its offer cache by it."""
        return self._clock

    @property
    def _key(self) -> str:
        return self.settings.api_key.get_secret_value()

    # ---- reads ---------------------------------------------------------------------------

    def list_instances(self, *, expect_nonempty: bool = False) -> list[dict[str, Any]]:
        """Every instance of the account, all pages. SensorError on any doubt (see below).

        Raised on a failed or refused request, 410 Gone, a non-JSON or malformed page, a cursor
        that repeats, and an empty listing when `expect_nonempty` (the caller believes
        instances exist) or when vast's own `total_instances` says there are some.
        """
        rows: dict[int, dict[str, Any]] = {}
        token: str | None = None
        seen: set[str] = set()
        claimed = 0
        for page in range(1, MAX_PAGES + 1):
            data = self._list_page(page, token)
            instances, token, total = _listing_page(data, page)
            claimed = max(claimed, total)
            for raw in instances:
                rows.setdefault(raw["id"], raw)
            if not token:
                break
            if token in seen:
                raise SensorError(f"vast instance list: page {page} repeats an earlier next_token")
            seen.add(token)
        else:
            raise SensorError(f"vast instance list: still paging after {MAX_PAGES} pages")
        if not rows and (expect_nonempty or claimed > 0):
            why = "instances are expected" if expect_nonempty else f"total_instances={claimed}"
            raise SensorError(f"vast listed no instances while {why}: not read as zero")
        return list(rows.values())

    def _list_page(self, page: int, token: str | None) -> Any:
        params = {
            "select_filters": {},
            "order_by": [{"col": "id", "dir": "asc"}],
            "limit": PAGE_LIMIT,
        }
        if token:
            params["after_token"] = token
        what = f"vast instance list page {page}"
        try:
            return self._read_json("list", "GET", "/api/v1/instances/", what, params=params)
        except ProviderError as exc:
            raise SensorError(str(exc)) from None

    def show(self, instance_id: str) -> dict[str, Any] | None:
        """One instance, or None when vast does not know it (any more)."""
        iid = _instance_number(instance_id)
        what = f"vast show instance {instance_id!r}"
        response = self._read("other", "GET", f"/api/v0/instances/{iid}/", what, {"owner": "me"})
        if response.status_code == 404:
            return None
        data = self._json_reply(response, what)
        row = data.get("instances") if isinstance(data, dict) else None
        if row is None and isinstance(data, dict) and "instances" in data:
            return None
        if not isinstance(row, dict):
            raise TemporaryProviderError(f"{what}: the reply has no instance object")
        return row

    def search_offers(self, query: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Offers matching `query` (a vast search body: {field: {op: value}}, order, type...)."""
        what = "vast offer search"
        data = self._read_json("search", "POST", "/api/v0/bundles/", what, body=dict(query))
        offers = data.get("offers") if isinstance(data, dict) else None
        if not isinstance(offers, list) or not all(isinstance(o, dict) for o in offers):
            raise TemporaryProviderError(f"{what}: the reply has no list of offers")
        return offers

    # ---- the create ----------------------------------------------------------------------

    def create(self, offer_id: int, label: str, *, price: float | None = None) -> str:
        """Rent offer `offer_id` as an instance labelled `label`; its id (vast's new_contract).

        Sent once, never retried. OfferGone when the offer was taken; CreateOutcomeUnknown when
        the request may have reached vast and no clear answer came back.
        """
        s = self.settings
        body: dict[str, Any] = {
            # the agent in the container reports under the launch label (vast's API label
            # can be empty even when the container's is set)
            "client_id": "me", "image": s.image,
            "env": {**s.env, **{k: v.get_secret_value() for k, v in s.secret_env.items()},
                    "FLEETGATE_LABEL": label},
            "disk": s.disk_gb,
            "label": label, "onstart": s.onstart, "runtype": s.runtype,
        }  # fmt: skip
        if price is not None:
            body["price"] = price
        what = f"vast create on offer {offer_id!r} for label {label!r}"
        path = f"/api/v0/asks/{int(offer_id)}/"
        try:
            response = self._request("create", "PUT", path, what, "create", body=body)
        except _Unreached as exc:
            if exc.sent:
                raise CreateOutcomeUnknown(offer_id, label, exc.reason) from None
            raise TemporaryProviderError(f"{what}: not sent ({exc.reason})") from None
        instance_id = _create_outcome(response, offer_id, label, what, self._key)
        log.info("vast: created instance %r from offer %r for label %r", instance_id, offer_id,
                 label)  # fmt: skip
        return instance_id

    # ---- state changes -------------------------------------------------------------------

    def destroy(self, instance_id: str) -> None:
        """Destroy the instance (irreversible). An instance vast does not know counts as gone."""
        iid = _instance_number(instance_id)
        what = f"vast destroy instance {instance_id!r}"
        response = self._mutate("destroy", "DELETE", f"/api/v0/instances/{iid}/", what, {})
        if response.status_code == 404:
            log.info("%s: vast does not know it (already gone)", what)
            return
        _mutation_outcome(response, what, self._key)

    def reboot(self, instance_id: str) -> None:
        """Stop and start the container, keeping the GPU."""
        iid = _instance_number(instance_id)
        what = f"vast reboot instance {instance_id!r}"
        response = self._mutate("other", "PUT", f"/api/v0/instances/reboot/{iid}/", what, {})
        _mutation_outcome(response, what, self._key)

    def set_state(self, instance_id: str, state: Literal["running", "stopped"]) -> None:
        if state not in ("running", "stopped"):
            raise PermanentProviderError(f"state must be 'running' or 'stopped' (got {state!r})")
        self._update(instance_id, {"state": state}, f"vast set state {state!r}")

    def set_label(self, instance_id: str, label: str) -> None:
        self._update(instance_id, {"label": label}, f"vast set label {label!r}")

    def _update(self, instance_id: str, body: dict[str, str], doing: str) -> None:
        iid = _instance_number(instance_id)
        what = f"{doing} on instance {instance_id!r}"
        response = self._mutate("other", "PUT", f"/api/v0/instances/{iid}/", what, body)
        _mutation_outcome(response, what, self._key)

    # ---- the HTTP seam -------------------------------------------------------------------

    def _read_json(
        self,
        endpoint: str,
        method: str,
        path: str,
        what: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> Any:
        return self._json_reply(self._read(endpoint, method, path, what, params, body), what)

    def _read(
        self,
        endpoint: str,
        method: str,
        path: str,
        what: str,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> requests.Response:
        try:
            return self._request(endpoint, method, path, what, "read", params=params, body=body)
        except _Unreached as exc:
            attempts = 1 + self.settings.retries
            raise TemporaryProviderError(
                f"{what}: {exc.reason} (after {attempts} attempts)"
            ) from None

    def _json_reply(self, response: requests.Response, what: str) -> Any:
        """The decoded JSON of a 2xx answer; ProviderError for anything else."""
        code = response.status_code
        if not 200 <= code < 300:
            raise _http_error(response, what, self._key)
        try:
            data = _decoded(response)
        except ValueError:
            attempts = 1 + self.settings.retries  # reads retry an unreadable reply (_retry_reason)
            raise TemporaryProviderError(
                f"{what}: HTTP {code} but the reply is not JSON (after {attempts} attempts)"
            ) from None
        if isinstance(data, dict) and data.get("success") is False:
            says = _fields_text(_error_fields(response, self._key))
            raise PermanentProviderError(f"{what}: vast refused{says}")
        return data

    def _mutate(
        self, endpoint: str, method: str, path: str, what: str, body: Any
    ) -> requests.Response:
        try:
            return self._request(endpoint, method, path, what, "mutate", body=body)
        except _Unreached as exc:
            done = "it may have reached vast" if exc.sent else "not sent"
            raise TemporaryProviderError(f"{what}: {exc.reason} ({done})") from None

    def _request(
        self,
        endpoint: str,
        method: str,
        path: str,
        what: str,
        policy: Policy,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> requests.Response:
        """One call with its policy's retries: the last response, or _Unreached."""
        attempts = 1 if policy == "create" else 1 + self.settings.retries
        query = _encode_query(params) if params else None
        for attempt in range(attempts):
            response: requests.Response | None = None
            try:
                response = self._send(endpoint, method, path, query, body)
            except _BAD_REQUEST as exc:
                problem = f"{what}: {type(exc).__name__} (check base_url)"
                raise PermanentProviderError(problem) from None
            except requests.RequestException as exc:
                sent, problem = not _surely_unsent(exc), reason(exc)
                retry = policy == "read" or (policy == "mutate" and not sent)
                if not retry or attempt == attempts - 1:
                    raise _Unreached(problem, sent) from None
            else:
                why = _retry_reason(response, policy)
                if why is None or attempt == attempts - 1:
                    return response
                problem = why
            delay = retry_delay(response, attempt, self.settings.backoff_s)
            log.warning("%s: %s; retry %d of %d in %gs", what, problem, attempt + 1,
                        attempts - 1, delay)  # fmt: skip
            self._sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(
        self, endpoint: str, method: str, path: str, query: dict[str, str] | None, body: Any
    ) -> requests.Response:
        self._pace(endpoint)
        prepared = self._prepare(method, path, query, body)
        env = self._session.merge_environment_settings(prepared.url, {}, None, None, None)
        return self._session.send(prepared, timeout=self.settings.timeout_s,
                                  allow_redirects=False, **env)  # fmt: skip

    def _prepare(self, method: str, path: str, query: dict[str, str] | None,
                 body: Any) -> requests.PreparedRequest:  # fmt: skip
        """The request as `Session.request` would prepare it (the session's headers under
        ours; vast sets no cookies). A body-less one is prepared once and copied after: the
        listing sends the same first page every tick."""
        key = (
            (method, path, tuple(sorted(query.items())) if query else ()) if body is None else None
        )
        cached = self._prepared.get(key) if key is not None else None
        if cached is not None:
            return cached.copy()
        headers = {**self._session.headers, "Authorization": f"Bearer {self._key}",
                   "Accept": "application/json"}  # fmt: skip
        prepared = requests.Request(method, self.settings.base_url + path, params=query,
                                    json=body if method != "GET" else None,
                                    headers=headers).prepare()  # fmt: skip
        if key is not None:
            if len(self._prepared) >= 64:
                self._prepared.clear()
            self._prepared[key] = prepared.copy()
        return prepared

    def _pace(self, endpoint: str) -> None:
        """Wait until `endpoint`'s minimum interval since its previous call has passed."""
        intervals = self.settings.min_interval_s
        interval = intervals.get(endpoint, intervals.get("other", 1.0))
        with self._lock:
            now = self._clock()
            start = max(now, self._next_slot.get(endpoint, -math.inf))
            self._next_slot[endpoint] = start + interval
        if start > now:
            self._sleep(start - now)


# ---- pure helpers ------------------------------------------------------------------------


def _encode_query(params: Mapping[str, Any]) -> dict[str, str]:
    """Query values as vast's CLI sends them: strings as they are, everything else as JSON."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in params.items()}


def _retry_reason(response: requests.Response, policy: Policy) -> str | None:
    """Why `response` is worth another attempt under `policy` (see the table), or None."""
    code = response.status_code
    if policy == "create":
        return None
    if code == 429 or (policy == "read" and code >= 500):
        return f"HTTP {code}"
    if policy == "read" and 200 <= code < 300:
        try:
            _decoded(response)
        except ValueError:
            return f"HTTP {code} but the reply is not JSON (cut short?)"
    return None


def _decoded(response: requests.Response) -> Any:
    """`response.json()`, decoded once however often it is asked for."""
    if "_fleetgate_json" not in response.__dict__:
        response.__dict__["_fleetgate_json"] = response.json()
    return response.__dict__["_fleetgate_json"]


def _listing_page(data: Any, page: int) -> tuple[list[dict[str, Any]], str | None, int]:
    """(instances with an int id, next_token or None, total_instances) or SensorError."""
    where = f"vast instance list page {page}"
    if not isinstance(data, dict) or not isinstance(data.get("instances"), list):
        raise SensorError(f"{where}: the reply has no list of instances")
    instances = []
    for n, raw in enumerate(data["instances"]):
        iid = raw.get("id") if isinstance(raw, dict) else None
        if isinstance(iid, str) and iid.isdigit():
            iid = int(iid)
        if not isinstance(iid, int) or isinstance(iid, bool):
            raise SensorError(f"{where}: entry {n} has no integer id")
        instances.append({**raw, "id": iid})
    token = data.get("next_token")
    if token is not None and not isinstance(token, str):
        raise SensorError(f"{where}: next_token is a {type(token).__name__}, not a string")
    total = data.get("total_instances")
    claimed = total if isinstance(total, int) and not isinstance(total, bool) else 0
    return instances, token or None, claimed


def _create_outcome(
    response: requests.Response, offer_id: int, label: str, what: str, key: str
) -> str:
    """The new instance id, or the error that says what became of the create."""
    code = response.status_code
    fields = _error_fields(response, key)
    if code in (404, 410) or "no_such_ask" in fields:
        raise OfferGone(offer_id, label)
    if code == 429:
        raise TemporaryProviderError(f"{what}: rate limited (HTTP 429); not created")
    if code in (401, 403):
        raise PermanentProviderError(f"{what}: vast refused the API key (HTTP {code})")
    if 400 <= code < 500:
        raise PermanentProviderError(f"{what}: vast refused (HTTP {code}){_fields_text(fields)}")
    if not 200 <= code < 300:
        raise CreateOutcomeUnknown(offer_id, label, f"HTTP {code}")
    try:
        data = response.json()
    except ValueError:
        raise CreateOutcomeUnknown(offer_id, label, f"HTTP {code} but not JSON") from None
    if isinstance(data, dict) and data.get("success") is False:
        raise PermanentProviderError(f"{what}: vast refused{_fields_text(fields)}")
    contract = data.get("new_contract") if isinstance(data, dict) else None
    if isinstance(contract, str) and contract.isdigit():
        contract = int(contract)
    if not isinstance(contract, int) or isinstance(contract, bool):
        raise CreateOutcomeUnknown(offer_id, label, f"HTTP {code} without a new_contract id")
    return str(contract)


def _mutation_outcome(response: requests.Response, what: str, key: str) -> None:
    code = response.status_code
    if not 200 <= code < 300:
        raise _http_error(response, what, key)
    try:
        data = response.json()
    except ValueError:
        log.debug("%s: HTTP %d with a non-JSON body, taken as done", what, code)
        return
    if isinstance(data, dict) and data.get("success") is False:
        raise PermanentProviderError(
            f"{what}: vast refused{_fields_text(_error_fields(response, key))}"
        )


def _http_error(response: requests.Response, what: str, key: str) -> ProviderError:
    code = response.status_code
    says = _fields_text(_error_fields(response, key))
    if code in (401, 403):
        return PermanentProviderError(f"{what}: vast refused the API key (HTTP {code})")
    if code == 410:
        return PermanentProviderError(f"{what}: HTTP 410 Gone (the endpoint is retired){says}")
    if code == 429 or code >= 500:
        return TemporaryProviderError(f"{what}: HTTP {code}{says}")
    if code == 404:
        return PermanentProviderError(f"{what}: HTTP 404 not found{says}")
    return PermanentProviderError(f"{what}: vast refused (HTTP {code}){says}")


def _error_fields(response: requests.Response, key: str) -> str:
    """vast's `error` and `msg`/`message` (or the start of a plain-text body), one line.

    Scrubbed of the API key: this text goes into exception messages."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict):
        parts = [str(data[k]) for k in ("error", "msg", "message") if data.get(k)]
        text = ": ".join(parts)
    else:
        text = response.text[: _SNIPPET * 2]
    if len(key) >= 4:
        text = text.replace(key, "***")
    return " ".join(text.split())[:_SNIPPET]


def _fields_text(fields: str) -> str:
    return f": {fields}" if fields else ""


def _instance_number(instance_id: str) -> int:
    text = str(instance_id)
    if not text.isdigit():
        raise PermanentProviderError(f"vast instance ids are numbers (got {instance_id!r})")
    return int(text)


def _surely_unsent(exc: requests.RequestException) -> bool:
    """True when the request never left: no connection was made (refused, DNS, connect timeout)."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return True
    if not isinstance(exc, requests.exceptions.ConnectionError):
        return False
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        item = todo.pop()
        if id(item) in seen or item is None:
            continue
        seen.add(id(item))
        name = type(item).__name__
        if name in ("NewConnectionError", "NameResolutionError", "ConnectTimeoutError"):
            return True
        todo.extend(getattr(item, "args", ()))
        todo.append(getattr(item, "reason", None))
        todo.append(getattr(item, "__cause__", None))
    return False

"""The vast.ai client's HTTP seam: pacing per endpoint, the retry policies, and replies as JSON.

`VastHTTP` is the one place that sends requests to vast, through the `requests.Session` it is
given (tests and the simulator mount theirs). Every call waits for its endpoint's minimum
interval first (the `min_interval_s` setting; vast limits each endpoint to one call per interval
and answers 429 otherwise). Then, with attempts = 1 + `retries` and waits of backoff_s,
2*backoff_s, 4*backoff_s, ...:

    policy   calls                                 retried on
    read     list, show, search                    429, 5xx, timeouts, connection errors, and
                                                   a 2xx whose body is not JSON (cut short)
    mutate   destroy, reboot, set_state, set_label 429 (vast refuses before acting) and
                                                   connection errors before the request left;
                                                   a 2xx with a non-JSON body is taken as done
    create   create                                never: the request may have reached vast;
                                                   a 2xx that is not JSON is CreateOutcomeUnknown

A retried call logs a warning naming the call and why (never the key). A read whose last
attempt is still not JSON is a TemporaryProviderError. The key goes in the Authorization
header, never into a query string.

This module must NOT know vast's endpoints or the shape of their replies (`vast_client` does),
and must NOT sleep or read the clock except through the `clock` and `sleep` it is given.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import requests

from controller.fleet.base import NotDone, PermanentProviderError, TemporaryProviderError
from controller.fleet.retry import reason, retry_delay
from controller.fleet.vast_errors import error_fields, fields_text, http_error

if TYPE_CHECKING:
    from controller.fleet.vast import VastSettings

log = logging.getLogger(__name__)

_BAD_REQUEST = (
    requests.exceptions.InvalidURL,
    requests.exceptions.MissingSchema,
    requests.exceptions.InvalidSchema,
    requests.exceptions.InvalidHeader,
)

Policy = Literal["read", "mutate", "create"]


class Unreached(Exception):
    """No HTTP answer. `sent` is False only when the request surely never left."""

    def __init__(self, reason: str, sent: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sent = sent


class VastHTTP:
    """Paced, retried requests to vast's API; see the module docstring for the policies."""

    def __init__(
        self,
        settings: VastSettings,
        session: requests.Session,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self.settings = settings
        self.session = session
        self.clock = clock
        self._sleep = sleep
        self._next_slot: dict[str, float] = {}
        self._prepared: dict[Any, requests.PreparedRequest] = {}
        self._queries: dict[int, tuple[Mapping[str, Any], dict[str, str]]] = {}
        self._env: dict[str, Any] | None = None  # proxies and CA bundle from the environment
        self._lock = threading.Lock()

    @property
    def key(self) -> str:
        return self.settings.api_key.get_secret_value()

    def read_json(
        self,
        endpoint: str,
        method: str,
        path: str,
        what: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> Any:
        """A read's decoded JSON reply; TemporaryProviderError or PermanentProviderError."""
        return self.json_reply(self.read(endpoint, method, path, what, params, body), what)

    def read(
        self,
        endpoint: str,
        method: str,
        path: str,
        what: str,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> requests.Response:
        """A read's last response (any status); TemporaryProviderError when none came."""
        try:
            return self.request(endpoint, method, path, what, "read", params=params, body=body)
        except Unreached as exc:
            attempts = 1 + self.settings.retries
            raise TemporaryProviderError(
                f"{what}: {exc.reason} (after {attempts} attempts)"
            ) from None

    def json_reply(self, response: requests.Response, what: str) -> Any:
        """The decoded JSON of a 2xx answer; ProviderError for anything else."""
        code = response.status_code
        if not 200 <= code < 300:
            raise http_error(response, what, self.key)
        try:
            data = _decoded(response)
        except ValueError:
            attempts = 1 + self.settings.retries  # reads retry an unreadable reply (_retry_reason)
            raise TemporaryProviderError(
                f"{what}: HTTP {code} but the reply is not JSON (after {attempts} attempts)"
            ) from None
        if isinstance(data, dict) and data.get("success") is False:
            says = fields_text(error_fields(response, self.key))
            raise PermanentProviderError(f"{what}: vast refused{says}")
        return data

    def mutate(
        self, endpoint: str, method: str, path: str, what: str, body: Any
    ) -> requests.Response:
        """A state change's last response; TemporaryProviderError when none came."""
        try:
            return self.request(endpoint, method, path, what, "mutate", body=body)
        except Unreached as exc:
            if not exc.sent:
                raise NotDone(f"{what}: {exc.reason} (not sent)") from None
            reason = f"{exc.reason} (it may have reached vast)"
            raise TemporaryProviderError(f"{what}: {reason}") from None

    def request(
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
        """One call with its policy's retries: the last response, or Unreached."""
        attempts = 1 if policy == "create" else 1 + self.settings.retries
        query = self._query(params) if params else None
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
                    raise Unreached(problem, sent) from None
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

    def _query(self, params: Mapping[str, Any]) -> dict[str, str]:
        """`params` encoded; a read-only mapping (`MappingProxyType`), encoded once."""
        if not isinstance(params, MappingProxyType):
            return _encode_query(params)
        held = self._queries.get(id(params))
        if held is None or held[0] is not params:
            held = self._queries[id(params)] = (params, _encode_query(params))
        return held[1]

    def _send(
        self, endpoint: str, method: str, path: str, query: dict[str, str] | None, body: Any
    ) -> requests.Response:
        self._pace(endpoint)
        prepared = self._prepare(method, path, query, body)
        return self.session.send(prepared, timeout=self.settings.timeout_s,
                                 allow_redirects=False, **self._environment())  # fmt: skip

    def _environment(self) -> dict[str, Any]:
        """What `Session.request` takes from the environment (proxies, `REQUESTS_CA_BUNDLE`),
        read once: every call goes to the one host of `base_url`, and the environment of a
        running process does not change."""
        if self._env is None:
            url = self.settings.base_url
            self._env = dict(self.session.merge_environment_settings(url, {}, None, None, None))
        return self._env

    def _prepare(self, method: str, path: str, query: dict[str, str] | None,
                 body: Any) -> requests.PreparedRequest:  # fmt: skip
        """The request as `Session.request` would prepare it (the session's headers under
        ours; vast sets no cookies). A body-less one is prepared once and sent again after
        (the listing sends the same first page every tick): neither `Session.send` with
        redirects off nor a transport adapter changes a request it sends."""
        key = (
            (method, path, tuple(sorted(query.items())) if query else ()) if body is None else None
        )
        cached = self._prepared.get(key) if key is not None else None
        if cached is not None:
            return cached
        headers = {**self.session.headers, "Authorization": f"Bearer {self.key}",
                   "Accept": "application/json"}  # fmt: skip
        prepared = requests.Request(method, self.settings.base_url + path, params=query,
                                    json=body if method != "GET" else None,
                                    headers=headers).prepare()  # fmt: skip
        if key is not None:
            if len(self._prepared) >= 64:
                self._prepared.clear()
            self._prepared[key] = prepared
        return prepared

    def _pace(self, endpoint: str) -> None:
        """Wait until `endpoint`'s minimum interval since its previous call has passed."""
        intervals = self.settings.min_interval_s
        interval = intervals.get(endpoint, intervals.get("other", 1.0))
        with self._lock:
            now = self.clock()
            start = max(now, self._next_slot.get(endpoint, -math.inf))
            self._next_slot[endpoint] = start + interval
        if start > now:
            self._sleep(start - now)


# ---- pure functions ----------------------------------------------------------------------


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


def _surely_unsent(exc: requests.RequestException) -> bool:
    """True when the request never left: no connection was made (refused, DNS, connect timeout)."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return True
    if not isinstance(exc, requests.exceptions.ConnectionError):
        return False
    seen: set[int] = set()
    pending: list[object] = [exc]
    while pending:
        item = pending.pop()
        if id(item) in seen or item is None:
            continue
        seen.add(id(item))
        name = type(item).__name__
        if name in ("NewConnectionError", "NameResolutionError", "ConnectTimeoutError"):
            return True
        pending.extend(getattr(item, "args", ()))
        pending.append(getattr(item, "reason", None))
        pending.append(getattr(item, "__cause__", None))
    return False

"""The vast.ai REST client: its endpoints, the instance list's paging, and what answers mean.

What it sends is what vast's official client sends (vast-ai/vast-cli, `vastai/api/`): bearer
auth; the instance list from `GET /api/v1/instances/` paged with `limit` (at most 25) and
`after_token` (the previous page's `next_token`), query values JSON-encoded except plain
strings; offers from `POST /api/v0/bundles/`; a create is `PUT /api/v0/asks/{offer}/`. Unlike
the official client, the key never goes into a query string, and a create is never retried.

Every request goes through `VastHTTP` (`vast_http.py`: pacing per endpoint and the retry
policies read, mutate and create); the errors and their tree are in `vast_errors.py`. A listing
page whose last attempt is still not JSON, or that fails at all, is a SensorError: the listing
is unknown, never "empty".

This module must NOT choose offers, map instances or decide anything about the fleet
(`controller.fleet.vast` does), and must NOT sleep or read the clock except through the
`clock` and `sleep` it is given.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import requests

from controller.core.fields import is_digits
from controller.fleet.base import (
    NotDone,
    PermanentProviderError,
    ProviderError,
    SensorError,
    TemporaryProviderError,
)
from controller.fleet.vast_errors import (
    CreateOutcomeUnknown,
    OfferGone,
    error_fields,
    fields_text,
    http_error,
    key_refused,
)
from controller.fleet.vast_http import Unreached, VastHTTP

if TYPE_CHECKING:
    from controller.fleet.vast import VastSettings

log = logging.getLogger(__name__)

PAGE_LIMIT = 25  # vast's maximum page size for the v1 instance list
# vast's answer to a start whose host's GPUs someone else rented while it was stopped:
# {"success": false, "msg": "Required resources are currently unavailable, state change
# queued."} (HTTP 200): the start is taken and waits for them ("scheduling")
START_QUEUED = "state change queued"
MAX_PAGES = 4000  # 100,000 instances: more means the cursor is going round in circles


# the first page's query, every tick (one object: `VastHTTP` encodes a query it was given
# before once; never changed)
_FIRST_PAGE: Mapping[str, Any] = MappingProxyType(
    {
        "select_filters": {},
        "order_by": [{"col": "id", "dir": "asc"}],
        "limit": PAGE_LIMIT,
    }
)


class VastClient:
    """vast.ai's REST API as this project needs it; `vast_http` says how each call is retried."""

    def __init__(
        self,
        settings: VastSettings,
        session: requests.Session | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self._http = VastHTTP(
            settings, session if session is not None else requests.Session(), clock, sleep
        )

    @property
    def clock(self) -> Callable[[], float]:
        """The injected clock this client paces by; the provider times its offer cache by it."""
        return self._http.clock

    @property
    def _key(self) -> str:
        return self._http.key

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
            before = len(rows)
            for raw in instances:
                rows.setdefault(raw["id"], raw)
            if not token:
                break
            if token in seen:
                raise SensorError(f"vast instance list: page {page} repeats an earlier next_token")
            if len(rows) == before:  # fresh tokens, no new instance: it would go on for ever
                raise SensorError(f"vast instance list: page {page} lists no instance not "
                                  "listed before, and names a next page")  # fmt: skip
            seen.add(token)
        else:
            raise SensorError(f"vast instance list: still paging after {MAX_PAGES} pages")
        if not rows and (expect_nonempty or claimed > 0):
            why = "instances are expected" if expect_nonempty else f"total_instances={claimed}"
            raise SensorError(f"vast listed no instances while {why}: not read as zero")
        return list(rows.values())

    def _list_page(self, page: int, token: str | None) -> Any:
        params = {**_FIRST_PAGE, "after_token": token} if token else _FIRST_PAGE
        what = f"vast instance list page {page}"
        try:
            return self._http.read_json("list", "GET", "/api/v1/instances/", what, params=params)
        except ProviderError as exc:
            raise SensorError(str(exc)) from None

    def show(self, instance_id: str) -> dict[str, Any] | None:
        """One instance, or None when vast does not know it (any more)."""
        iid = _instance_number(instance_id)
        what = f"vast show instance {instance_id!r}"
        response = self._http.read(
            "other", "GET", f"/api/v0/instances/{iid}/", what, {"owner": "me"}
        )
        if response.status_code == 404:
            return None
        data = self._http.json_reply(response, what)
        row = data.get("instances") if isinstance(data, dict) else None
        if row is None and isinstance(data, dict) and "instances" in data:
            return None
        if not isinstance(row, dict):
            raise TemporaryProviderError(f"{what}: the reply has no instance object")
        return row

    def search_offers(self, query: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Offers matching `query` (a vast search body: {field: {op: value}}, order, type...)."""
        what = "vast offer search"
        data = self._http.read_json("search", "POST", "/api/v0/bundles/", what, body=dict(query))
        offers = data.get("offers") if isinstance(data, dict) else None
        if not isinstance(offers, list) or not all(isinstance(o, dict) for o in offers):
            raise TemporaryProviderError(f"{what}: the reply has no list of offers")
        return offers

    # ---- the create ----------------------------------------------------------------------

    def create(self, offer_id: int, label: str, *, price: float | None = None,
               env: Mapping[str, str] | None = None) -> str:  # fmt: skip
        """Rent offer `offer_id` as an instance labelled `label`; its id (vast's new_contract).

        Sent once, never retried. OfferGone when the offer was taken; CreateOutcomeUnknown when
        the request may have reached vast and no clear answer came back. It asks vast to refuse
        an offer it cannot schedule now (`cancel_unavail`; without it vast rents a stopped
        instance that waits for the GPUs and bills its disk): a PermanentProviderError.
        """
        s = self.settings
        body: dict[str, Any] = {
            # the agent in the container reports under the launch label (vast's API label
            # can be empty even when the container's is set)
            "client_id": "me", "image": s.image,
            "env": {**s.env, **{k: v.get_secret_value() for k, v in s.secret_env.items()},
                    **(env or {}), "FLEETGATE_LABEL": label},
            "disk": s.disk_gb,
            "label": label, "onstart": s.onstart, "runtype": s.runtype,
            # an offer vast cannot schedule now is refused, not rented as a stopped instance
            "cancel_unavail": True,
        }  # fmt: skip
        if price is not None:
            body["price"] = price
        what = f"vast create on offer {offer_id!r} for label {label!r}"
        path = f"/api/v0/asks/{int(offer_id)}/"
        try:
            response = self._http.request("create", "PUT", path, what, "create", body=body)
        except Unreached as exc:
            if exc.sent:
                raise CreateOutcomeUnknown(offer_id, label, exc.reason) from None
            raise NotDone(f"{what}: not sent ({exc.reason})") from None
        instance_id = _create_outcome(response, offer_id, label, what, self._key)
        log.info("vast: created instance %r from offer %r for label %r", instance_id, offer_id,
                 label)  # fmt: skip
        return instance_id

    # ---- state changes -------------------------------------------------------------------

    def destroy(self, instance_id: str) -> None:
        """Destroy the instance (irreversible). An instance vast does not know counts as gone."""
        iid = _instance_number(instance_id)
        what = f"vast destroy instance {instance_id!r}"
        response = self._http.mutate("destroy", "DELETE", f"/api/v0/instances/{iid}/", what, {})
        if response.status_code == 404:
            log.info("%s: vast does not know it (already gone)", what)
            return
        _mutation_outcome(response, what, self._key)

    def reboot(self, instance_id: str) -> None:
        """Stop and start the container, keeping the GPU."""
        iid = _instance_number(instance_id)
        what = f"vast reboot instance {instance_id!r}"
        response = self._http.mutate("other", "PUT", f"/api/v0/instances/reboot/{iid}/", what, {})
        _mutation_outcome(response, what, self._key)

    def set_state(self, instance_id: str, state: Literal["running", "stopped"]) -> None:
        """Stop or start the instance. A start vast queued until its host's GPUs are free
        (`START_QUEUED`) is done: vast starts it when they are, as it does from the console."""
        if state not in ("running", "stopped"):
            raise PermanentProviderError(f"state must be 'running' or 'stopped' (got {state!r})")
        queued = START_QUEUED if state == "running" else None
        self._update(instance_id, {"state": state}, f"vast set state {state!r}", queued)

    def set_label(self, instance_id: str, label: str) -> None:
        self._update(instance_id, {"label": label}, f"vast set label {label!r}")

    def _update(
        self, instance_id: str, body: dict[str, str], doing: str, queued: str | None = None
    ) -> None:
        iid = _instance_number(instance_id)
        what = f"{doing} on instance {instance_id!r}"
        response = self._http.mutate("other", "PUT", f"/api/v0/instances/{iid}/", what, body)
        _mutation_outcome(response, what, self._key, queued)


# ---- pure functions ----------------------------------------------------------------------


def _listing_page(data: Any, page: int) -> tuple[list[dict[str, Any]], str | None, int]:
    """(instances with an int id, next_token or None, total_instances) or SensorError.

    `"instances": null` is a page without instances, as vast's own client reads it;
    `list_instances` still refuses an empty listing it has reason to doubt."""
    where = f"vast instance list page {page}"
    rows = data.get("instances", ()) if isinstance(data, dict) else ()
    if rows is None:
        rows = []
    if not isinstance(rows, list):
        raise SensorError(f"{where}: the reply has no list of instances")
    instances = []
    for n, raw in enumerate(rows):
        iid = raw.get("id") if isinstance(raw, dict) else None
        if isinstance(iid, str) and is_digits(iid):
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
    fields = error_fields(response, key)
    if code in (404, 410) or "no_such_ask" in fields:
        raise OfferGone(offer_id, label)
    if code == 429:
        raise NotDone(f"{what}: rate limited (HTTP 429); not created")
    if code in (401, 403):
        raise key_refused(what, code)
    if 400 <= code < 500:
        raise PermanentProviderError(f"{what}: vast refused (HTTP {code}){fields_text(fields)}")
    if not 200 <= code < 300:
        raise CreateOutcomeUnknown(offer_id, label, f"HTTP {code}")
    try:
        data = response.json()
    except ValueError:
        raise CreateOutcomeUnknown(offer_id, label, f"HTTP {code} but not JSON") from None
    if isinstance(data, dict) and data.get("success") is False:
        raise PermanentProviderError(f"{what}: vast refused{fields_text(fields)}")
    contract = data.get("new_contract") if isinstance(data, dict) else None
    if isinstance(contract, str) and is_digits(contract):
        contract = int(contract)
    if not isinstance(contract, int) or isinstance(contract, bool):
        raise CreateOutcomeUnknown(offer_id, label, f"HTTP {code} without a new_contract id")
    return str(contract)


def _mutation_outcome(
    response: requests.Response, what: str, key: str, queued: str | None = None
) -> None:
    """Nothing when vast did it; the error that says why not. A refusal whose words hold
    `queued` (vast's own for a change it took and will make later) counts as done."""
    code = response.status_code
    if not 200 <= code < 300:
        raise http_error(response, what, key)
    try:
        data = response.json()
    except ValueError:
        log.debug("%s: HTTP %d with a non-JSON body, taken as done", what, code)
        return
    if isinstance(data, dict) and data.get("success") is False:
        said = error_fields(response, key)
        if queued is not None and queued in said.lower():
            log.info("%s: vast queued it (%s)", what, said)
            return
        raise PermanentProviderError(f"{what}: vast refused{fields_text(said)}")


def _instance_number(instance_id: str) -> int:
    text = str(instance_id)
    if not is_digits(text):
        raise PermanentProviderError(f"vast instance ids are numbers (got {instance_id!r})")
    return int(text)

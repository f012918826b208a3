"""The vast.ai fleet provider: offers chosen by filter and measured speed, instances as `Instance`.

`VastProvider` implements `base.Provider` over a `VastClient` (`vast_client.py`, the one HTTP
seam). Launching:

1. search offers with the filter of `VastSettings` (vast's CLI defaults `verified`, `rentable`,
   not `rented`, not `external`; RAM in MB; excluded machines `notin`; price capped);
2. rank them: machines with a known rate of at least GOOD_RATE proofs/hour first, best rate per
   dollar first; then unmeasured machines; then known slow ones; cheapest first in each tier;
3. create on the first; an offer taken meanwhile (`OfferGone`) moves on to the next, up to
   `max_offers_tried`; a create whose outcome is unknown (`CreateOutcomeUnknown`) is re-raised
   at once and no other offer is tried: the first may exist and bill. The caller finds it by
   its label (`find_by_label`) before launching again.

The offer cache: vast allows about one search per 6 s, so the ranked offers of a search are kept
for `offer_cache_s` seconds (0: never) and the next launches with the same search body,
exclusions, price cap and measured rates take them instead of searching again (one search per
tick, however many launches). An offer is dropped from the cache once a create used it (it
succeeded, or its outcome is unknown) or found it gone; a create refused without renting (429,
a refusal) leaves it. A cache that has expired or has no offers left searches again.

`confirm_gone` shows instances one by one: those vast answers as gone (`{"instances": null}` or
404) are confirmed; one whose show fails or that vast still shows is not.

Listing maps vast's fields only: `stage` is "provisioning" while vast boots the container and
"registered" after, a placeholder that the controller overlays with its lifecycle records, and
`daemon`/`sidecar` are "unknown" until the controller's health checks fill them in.

This module must NOT send HTTP itself, sleep, or read the clock: the client does all of that
(the offer cache reads the time only through the client's injected `VastClient.clock`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from controller.core.model import Instance
from controller.fleet.base import (
    LaunchRequest,
    PermanentProviderError,
    ProviderError,
    SensorError,
    TemporaryProviderError,
)
from controller.fleet.vast_client import CreateOutcomeUnknown, OfferGone, VastClient

__all__ = [
    "CreateOutcomeUnknown", "OfferGone", "VastClient", "VastProvider", "VastSettings",
    "offer_query", "rank_offers", "to_instance",
]  # fmt: skip

log = logging.getLogger(__name__)

DEFAULT_MIN_INTERVAL_S = {"list": 1.0, "create": 4.5, "destroy": 3.0, "search": 6.0, "other": 1.0}
FILTER_OPS = ("eq", "neq", "gt", "gte", "lt", "lte", "in", "notin")
GOOD_RATE = 20.0  # proofs/hour: a machine measured at least this fast is preferred
MB_PER_GB = 1000  # vast's CLI multiplies GB by 1000 for cpu_ram and gpu_ram
_BOOTING = ("provisioning", "created", "loading")


class VastSettings(BaseModel):
    """How to reach vast.ai, what to launch, and which offers qualify.

    RAM limits are in GB here and sent to vast in MB (GB x 1000, as vast's CLI does).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # -- the API
    base_url: str = "https://console.vast.ai"
    api_key: SecretStr
    timeout_s: float = Field(20.0, gt=0, description="connect and read timeout of one request")
    retries: int = Field(3, ge=0, le=10, description="attempts after the first (see the policies)")
    backoff_s: float = Field(1.0, ge=0, description="wait before the first retry, doubling")
    min_interval_s: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_MIN_INTERVAL_S),
        description="seconds between two calls of one endpoint: list, create, destroy, search,"
        " other (show, reboot, label, state); keys not given keep their defaults",
    )
    # -- what to launch
    image: str = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict, description='e.g. {"-p 9821:9821": "1"}')
    secret_env: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="environment entries every create adds that are secrets (the instances' "
        "token for the instance API); never logged or shown",
    )
    onstart: str = ""
    disk_gb: float = Field(250.0, gt=0)
    runtype: str = Field("ssh", min_length=1, description="vast's CLI default is 'ssh'")
    offer_type: Literal["on-demand", "bid"] = "on-demand"
    bid_price: float | None = Field(None, gt=0, description="$/hour; required for offer_type bid")
    search_limit: int = Field(64, ge=1, le=1000, description="offers asked for per search")
    max_offers_tried: int = Field(5, ge=1, description="creates per launch on gone offers")
    offer_cache_s: float = Field(
        30.0,
        ge=0,
        description="seconds the ranked offers of a search serve the next launches with the same"
        " search (vast allows ~1 search per 6 s); offers used or gone are dropped; 0: no cache",
    )
    # -- which offers qualify
    min_cpu_ram_gb: float = Field(240.0, ge=0)
    min_disk_gb: float = Field(250.0, ge=0)
    max_dph: float = Field(0.90, gt=0, description="$/hour, all-in (dph_total)")
    min_gpu_ram_gb: float = Field(12.5, ge=0)
    min_cpu_cores: int = Field(25, ge=0)
    min_inet_down_mbps: float = Field(100.0, ge=0)
    min_cuda: float = Field(13.0, ge=0)
    min_reliability: float = Field(0.95, ge=0, le=1)
    verified: bool = True
    gpu_names: list[str] = Field(default_factory=list, description='e.g. ["RTX 4090"]; [] = any')
    extra_filter: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="raw vast query terms {field: {op: value}}, merged last"
    )

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/?#\s]+", value):
            raise ValueError(f"base_url must start with http:// or https:// (got {value!r})")
        return value.rstrip("/")

    @field_validator("min_interval_s")
    @classmethod
    def _intervals(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(DEFAULT_MIN_INTERVAL_S))
        if unknown:
            raise ValueError(
                f"unknown endpoint(s) {', '.join(map(repr, unknown))}"
                f" (expected one of {', '.join(DEFAULT_MIN_INTERVAL_S)})"
            )
        negative = sorted(k for k, v in value.items() if not v >= 0)
        if negative:
            raise ValueError(f"intervals must be >= 0 seconds (bad: {', '.join(negative)})")
        return {**DEFAULT_MIN_INTERVAL_S, **value}

    @field_validator("extra_filter")
    @classmethod
    def _terms(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, term in value.items():
            bad = sorted(set(term) - set(FILTER_OPS))
            if bad or not term:
                raise ValueError(
                    f"term {name!r}: unknown operator(s) {', '.join(map(repr, bad)) or '(none)'}"
                    f" (expected one of {', '.join(FILTER_OPS)})"
                )
        return value

    @model_validator(mode="after")
    def _bid(self) -> VastSettings:
        if self.offer_type == "bid" and self.bid_price is None:
            raise ValueError("offer_type 'bid' needs bid_price ($/hour)")
        return self


@dataclass
class _CachedOffers:
    """The ranked offers of one search, best first, usable until `until` (the client's clock)."""

    offers: list[dict[str, Any]]
    until: float


class VastProvider:
    """`base.Provider` on vast.ai. `expect_nonempty` says whether instances are believed to exist
    (the journal knows); an empty listing is then an error, never "zero instances"."""

    def __init__(
        self,
        client: VastClient,
        settings: VastSettings,
        *,
        expect_nonempty: Callable[[], bool] = lambda: False,
    ) -> None:
        self._client = client
        self._settings = settings
        self._expect_nonempty = expect_nonempty
        self.last_raw: dict[str, dict[str, Any]] = {}
        self._offer_cache: dict[tuple[Any, ...], _CachedOffers] = {}  # by _cache_key

    def list_instances(self, expect_nonempty: bool | None = None) -> list[Instance]:
        """Every instance, by id. SensorError when the listing is in any doubt."""
        expect = self._expect_nonempty() if expect_nonempty is None else expect_nonempty
        raws = self._client.list_instances(expect_nonempty=expect)
        self.last_raw = {str(raw["id"]): dict(raw) for raw in raws}  # ports, address: health
        return sorted((to_instance(raw) for raw in raws), key=lambda i: int(i.id))

    def launch(self, request: LaunchRequest) -> str:
        """Rent one instance labelled `request.label` (see the module docstring); its id."""
        s = self._settings
        price = s.bid_price if s.offer_type == "bid" else None
        gone: list[int] = []
        for offer in self._offers_for(request)[: s.max_offers_tried]:
            offer_id = int(offer["id"])
            log.info("vast: launch %r on offer %r (machine %r, $%s/h)", request.label, offer_id,
                     offer.get("machine_id"), offer.get("dph_total"))  # fmt: skip
            used = True  # rented, taken by somebody else, or perhaps rented: not to be tried again
            try:
                return self._client.create(offer_id, request.label, price=price)
            except OfferGone:
                gone.append(offer_id)
                log.info("vast: offer %r was taken; trying the next for %r", offer_id,
                         request.label)  # fmt: skip
            except ProviderError as exc:
                used = isinstance(exc, CreateOutcomeUnknown)
                raise
            finally:
                if used:
                    self._forget_offer(offer_id)
        raise TemporaryProviderError(
            f"label {request.label!r} not created: offers {gone!r} were all taken meanwhile"
        )

    def _offers_for(self, request: LaunchRequest) -> list[dict[str, Any]]:
        """The ranked offers for `request`: the cached ones of an earlier search, or a new one."""
        s = self._settings
        cap = _price_cap(s, request)
        query = offer_query(s, request)
        key = _cache_key(query, request, cap)
        now = self._client.clock()
        self._offer_cache = {
            k: c for k, c in self._offer_cache.items() if c.offers and now < c.until
        }
        cached = self._offer_cache.get(key)
        if cached is not None:
            log.debug("vast: launch %r takes %d cached offers (no new search)", request.label,
                      len(cached.offers))  # fmt: skip
            return list(cached.offers)
        found = self._client.search_offers(query)
        offers = rank_offers(found, request, cap)
        if not offers:
            raise PermanentProviderError(
                f"no offer matches the filter for label {request.label!r}: {len(found)} found,"
                f" {len(request.exclude_machines)} machines excluded, max_dph {cap!r}"
            )
        if s.offer_cache_s > 0:
            until = self._client.clock() + s.offer_cache_s
            self._offer_cache[key] = _CachedOffers(list(offers), until)
        return offers

    def _forget_offer(self, offer_id: int) -> None:
        """Drop `offer_id` from every cached search: it is rented or gone."""
        for cached in self._offer_cache.values():
            cached.offers = [o for o in cached.offers if int(o["id"]) != offer_id]

    def confirm_gone(self, instance_ids: Iterable[str], limit: int = 10) -> set[str]:
        """Those of the first `limit` (distinct) `instance_ids` that vast's show answers as gone.

        Gone is `{"instances": null}` or 404. An id whose show fails (an error, a timeout) or that
        vast still shows is not in the result: only vast's own word confirms a disappearance."""
        distinct = dict.fromkeys(str(i) for i in instance_ids)
        gone: set[str] = set()
        for iid in islice(distinct, max(limit, 0)):
            try:
                shown = self._client.show(iid)
            except ProviderError as exc:
                log.warning("vast: instance %r not confirmed gone: %s", iid, exc)
                continue
            if shown is None:
                gone.add(iid)
            else:
                log.info("vast: instance %r still exists (%r)", iid, shown.get("actual_status"))
        return gone

    def find_by_label(self, label: str) -> Instance | None:
        """The instance labelled `label` (the lowest id if several), or None.

        A failed listing is a TemporaryProviderError, never "not found"."""
        try:
            instances = self.list_instances()
        except SensorError as exc:
            raise TemporaryProviderError(
                f"cannot tell whether label {label!r} exists: {exc}"
            ) from exc
        return next((i for i in instances if i.label == label), None)

    def destroy(self, instance_id: str) -> None:
        self._client.destroy(instance_id)

    def reboot(self, instance_id: str) -> None:
        self._client.reboot(instance_id)

    def restart_daemon(self, instance_id: str) -> None:
        raise PermanentProviderError("vast cannot restart a daemon; the instance agent does")

    def drain(self, instance_id: str) -> None:
        raise PermanentProviderError("vast cannot drain an instance; Curio does (unschedulable)")


# ---- pure functions ----------------------------------------------------------------------


def offer_query(settings: VastSettings, request: LaunchRequest) -> dict[str, Any]:
    """The search body for `POST /api/v0/bundles/`: filter terms, then order, type and limit."""
    s = settings
    query: dict[str, Any] = {"rentable": {"eq": True}, "rented": {"eq": False},
                             "external": {"eq": False}}  # fmt: skip
    if s.verified:
        query["verified"] = {"eq": True}
    query |= {
        "cpu_ram": {"gte": s.min_cpu_ram_gb * MB_PER_GB},
        "gpu_ram": {"gte": s.min_gpu_ram_gb * MB_PER_GB},
        "disk_space": {"gte": max(s.min_disk_gb, s.disk_gb)},
        "cpu_cores": {"gte": s.min_cpu_cores},
        "inet_down": {"gte": s.min_inet_down_mbps},
        "cuda_max_good": {"gte": s.min_cuda},
        "reliability": {"gte": s.min_reliability},
        "dph_total": {"lte": _price_cap(s, request)},
    }
    if s.gpu_names:
        query["gpu_name"] = {"in": list(s.gpu_names)}
    if request.exclude_machines:
        query["machine_id"] = {"notin": _machine_ids(request.exclude_machines)}
    for name, term in s.extra_filter.items():
        query[name] = _merge_term(query.get(name, {}), term)
    query |= {"order": [["dph_total", "asc"]], "type": s.offer_type, "limit": s.search_limit,
              "allocated_storage": s.disk_gb}  # fmt: skip
    return query


def rank_offers(
    offers: Iterable[Mapping[str, Any]], request: LaunchRequest, max_dph: float
) -> list[dict[str, Any]]:
    """Usable offers best first: known fast machines by rate per dollar, unknown, known slow.

    Offers on excluded machines, above `max_dph` or without a numeric id and price are dropped
    (vast filters them too; this is the second line)."""
    rates = dict(request.prefer_rates)
    usable = [
        dict(o) for o in offers
        if _number(o.get("id")) is not None
        and (price := _number(o.get("dph_total"))) is not None and price <= max_dph
        and str(o.get("machine_id")) not in request.exclude_machines
    ]  # fmt: skip
    return sorted(usable, key=lambda o: _rank(o, rates))


def to_instance(raw: Mapping[str, Any]) -> Instance:
    """One vast instance object as an `Instance`; SensorError on a field of the wrong type."""
    iid = raw["id"]
    status = _text(raw, "actual_status") or "provisioning"
    dph = _number(raw.get("dph_total"), 0.0)
    start = raw.get("start_date")
    if dph is None or (start is not None and _number(start) is None):
        bad = "dph_total" if dph is None else "start_date"
        raise SensorError(f"vast instance {iid!r}: {bad} is not a number ({raw.get(bad)!r})")
    gpus = raw.get("num_gpus")
    return Instance(
        id=str(iid),
        label=_text(raw, "label").strip(),
        machine_id=_text(raw, "machine_id"),
        host_id=_text(raw, "host_id"),
        status=status,
        stage="provisioning" if status in _BOOTING else "registered",
        daemon="unknown",
        sidecar="unknown",
        gpu_name=_text(raw, "gpu_name"),
        num_gpus=gpus if isinstance(gpus, int) and not isinstance(gpus, bool) else 1,
        dph=dph,
        status_msg=_text(raw, "status_msg").strip(),
        start_date=_number(start),
    )


def _cache_key(query: Mapping[str, Any], request: LaunchRequest, cap: float) -> tuple[Any, ...]:
    """Everything that changes a search or its ranking: the body, exclusions, cap and rates
    (the rates as the request holds them, a tuple: thousands of machines hash fast)."""
    body = json.dumps(dict(query), sort_keys=True, default=str)
    return (body, tuple(sorted(request.exclude_machines)), cap, tuple(request.prefer_rates))


def _price_cap(settings: VastSettings, request: LaunchRequest) -> float:
    if request.max_dph is None:
        return settings.max_dph
    return min(settings.max_dph, request.max_dph)


def _rank(offer: Mapping[str, Any], rates: Mapping[str, float]) -> tuple[int, float, float, float]:
    price = float(offer["dph_total"])
    known = rates.get(str(offer.get("machine_id")))
    if known is None:
        tier, value = 1, 0.0
    elif known >= GOOD_RATE:
        tier, value = 0, -known / max(price, 1e-9)
    else:
        tier, value = 2, 0.0
    return (tier, value, price, float(offer["id"]))


def _merge_term(term: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`extra` over `term`, op by op; two `notin` lists are joined (an exclusion stays)."""
    merged = {**term, **extra}
    if "notin" in term and "notin" in extra:
        merged["notin"] = list(term["notin"]) + [
            v for v in extra["notin"] if v not in term["notin"]
        ]
    return merged


def _machine_ids(machines: Iterable[str]) -> list[int | str]:
    """vast's machine ids are integers; ids that are not stay strings (they match nothing)."""
    return sorted((int(m) if m.isdigit() else m for m in machines), key=str)


def _number(value: Any, default: float | None = None) -> float | None:
    """A JSON number (or numeric string) as float; `default` for null; None when not a number."""
    if value is None:
        return default
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and re.fullmatch(r"-?\d+(\.\d+)?", value.strip()):
        return float(value)
    return None


def _text(raw: Mapping[str, Any], name: str) -> str:
    value = raw.get(name)
    if value is None:
        return ""
    if isinstance(value, str | int) and not isinstance(value, bool):
        return str(value)
    raise SensorError(f"vast instance {raw.get('id')!r}: {name} is a {type(value).__name__}")

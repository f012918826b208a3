"""vast.ai offers: the search body, the ranking, and the cache of ranked offers between launches.

`offer_query` builds the search for `POST /api/v0/bundles/` from `VastSettings` (vast's CLI
defaults `verified`, `rentable`, not `rented`, not `external`; RAM in MB; excluded machines
`notin`; price capped; `extra_filter` merged last). `rank_offers` puts machines with a known
rate of at least GOOD_RATE proofs/hour first, best rate per dollar first; then unmeasured
machines; then known slow ones; cheapest first in each tier.

`OfferCache` keeps the ranked offers of a search until a time on the client's clock, keyed by
`cache_key` (the search body, exclusions, price cap and measured rates); `forget` drops an
offer from every search once a create used it or found it gone.

Pure: no HTTP, and the time is always passed in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controller.core.fields import is_digits
from controller.fleet.base import LaunchRequest
from controller.fleet.vast_instances import number

if TYPE_CHECKING:
    from controller.fleet.vast import VastSettings

GOOD_RATE = 20.0  # proofs/hour: a machine measured at least this fast is preferred
MB_PER_GB = 1000  # vast's CLI multiplies GB by 1000 for cpu_ram and gpu_ram


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
        "dph_total": {"lte": price_cap(s, request)},
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
        if number(o.get("id")) is not None
        and (price := number(o.get("dph_total"))) is not None and price <= max_dph
        and str(o.get("machine_id")) not in request.exclude_machines
    ]  # fmt: skip
    return sorted(usable, key=lambda o: _rank(o, rates))


def price_cap(settings: VastSettings, request: LaunchRequest) -> float:
    """The lower of the settings' `max_dph` and the request's, $/hour."""
    if request.max_dph is None:
        return settings.max_dph
    return min(settings.max_dph, request.max_dph)


def cache_key(query: Mapping[str, Any], request: LaunchRequest, cap: float) -> tuple[Any, ...]:
    """Everything that changes a search or its ranking: the body, exclusions, cap and rates
    (the rates as the request holds them, a tuple: thousands of machines hash fast)."""
    body = json.dumps(dict(query), sort_keys=True, default=str)
    return (body, tuple(sorted(request.exclude_machines)), cap, tuple(request.prefer_rates))


@dataclass
class _CachedOffers:
    """The ranked offers of one search, best first, usable until `until` (the client's clock)."""

    offers: list[dict[str, Any]]
    until: float


class OfferCache:
    """Ranked offers by `cache_key`; an entry that expired or has no offers left is dropped."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], _CachedOffers] = {}

    def get(self, key: tuple[Any, ...], now: float) -> list[dict[str, Any]] | None:
        """A copy of the offers cached under `key` and still usable at `now`, or None."""
        self._entries = {k: c for k, c in self._entries.items() if c.offers and now < c.until}
        cached = self._entries.get(key)
        return list(cached.offers) if cached is not None else None

    def put(self, key: tuple[Any, ...], offers: Iterable[dict[str, Any]], until: float) -> None:
        self._entries[key] = _CachedOffers(list(offers), until)

    def forget(self, offer_id: int) -> None:
        """Drop `offer_id` from every cached search: it is rented or gone."""
        for cached in self._entries.values():
            cached.offers = [o for o in cached.offers if int(o["id"]) != offer_id]


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
    return sorted((int(m) if is_digits(m) else m for m in machines), key=str)

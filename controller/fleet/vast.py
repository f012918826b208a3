"""The vast.ai fleet provider: `VastProvider` launches, lists and acts on instances.

`VastProvider` implements `base.Provider` over a `VastClient` (`vast_client.py`, the one HTTP
seam). `VastSettings` says how to reach vast, what to launch and which offers qualify.
Launching:

1. search offers with the filter of `VastSettings` (`vast_offers.offer_query`);
2. rank them (`vast_offers.rank_offers`: known fast machines first, by rate per dollar);
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

Listing maps vast's fields only (`vast_instances.to_instance`): the stage is a placeholder the
controller overlays with its lifecycle records, daemon and sidecar are "unknown" until its
health checks fill them in.

This module must NOT send HTTP itself, sleep, or read the clock: the client does all of that
(the offer cache reads the time only through the client's injected `VastClient.clock`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from controller.core.fields import Secret
from controller.core.model import Instance
from controller.fleet.base import (
    LaunchRequest,
    PermanentProviderError,
    ProviderError,
    SensorError,
    TemporaryProviderError,
)
from controller.fleet.vast_client import VastClient
from controller.fleet.vast_errors import CreateOutcomeUnknown, OfferGone
from controller.fleet.vast_instances import to_instance
from controller.fleet.vast_offers import OfferCache, cache_key, offer_query, price_cap, rank_offers

__all__ = [
    "CreateOutcomeUnknown", "OfferGone", "VastClient", "VastProvider", "VastSettings",
    "offer_query", "rank_offers", "to_instance",
]  # fmt: skip

log = logging.getLogger(__name__)

DEFAULT_MIN_INTERVAL_S = {"list": 1.0, "create": 4.5, "destroy": 3.0, "search": 6.0, "other": 1.0}
FILTER_OPS = ("eq", "neq", "gt", "gte", "lt", "lte", "in", "notin")
REFUSED_OFFER_S = 600.0  # an offer vast refused a create on is not tried again this long


class VastSettings(BaseModel):
    """How to reach vast.ai, what to launch, and which offers qualify.

    RAM limits are in GB here and sent to vast in MB (GB x 1000, as vast's CLI does).
    """

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True, strict=True)

    # -- the API
    base_url: str = "https://console.vast.ai"
    api_key: Secret
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
    secret_env: dict[str, Secret] = Field(
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
        self._offer_cache = OfferCache()
        # offer id -> until when it is not tried: vast refused a create on it (an offer it
        # cannot schedule now, with cancel_unavail, stays in its search results)
        self._refused: dict[int, float] = {}
        self._show_failed: set[str] = set()  # ids whose last show failed (`confirm_gone`)

    def list_instances(self, expect_nonempty: bool | None = None) -> list[Instance]:
        """Every instance, by id. SensorError when the listing is in any doubt."""
        expect = self._expect_nonempty() if expect_nonempty is None else expect_nonempty
        raws = self._client.list_instances(expect_nonempty=expect)
        self.last_raw = {str(raw["id"]): dict(raw) for raw in raws}  # ports, address: health
        cap = self._settings.max_dph
        return sorted((to_instance(raw, cap) for raw in raws), key=lambda i: int(i.id))

    def launch(self, request: LaunchRequest) -> str:
        """Rent one instance labelled `request.label` (see the module docstring); its id."""
        s = self._settings
        price = s.bid_price if s.offer_type == "bid" else None
        gone: list[int] = []
        for offer in self._offers_for(request)[: s.max_offers_tried]:
            offer_id = int(offer["id"])
            log.info("vast: launch %r on offer %r (machine %r, $%s/h)", request.label, offer_id,
                     offer.get("machine_id"), _price(offer.get("dph_total")))  # fmt: skip
            used = True  # rented, taken by somebody else, or perhaps rented: not to be tried again
            try:
                return self._client.create(offer_id, request.label, price=price,
                                           env=dict(request.env))  # fmt: skip
            except OfferGone:
                gone.append(offer_id)
                log.info("vast: offer %r was taken; trying the next for %r", offer_id,
                         request.label)  # fmt: skip
            except ProviderError as exc:
                used = isinstance(exc, CreateOutcomeUnknown)
                if isinstance(exc, PermanentProviderError):  # refused: the next launch moves on
                    used = True
                    self._refused[offer_id] = self._client.clock() + REFUSED_OFFER_S
                raise
            finally:
                if used:
                    self._offer_cache.forget(offer_id)
        raise TemporaryProviderError(
            f"label {request.label!r} not created: offers {gone!r} were all taken meanwhile"
        )

    def _offers_for(self, request: LaunchRequest) -> list[dict[str, Any]]:
        """The ranked offers for `request`: the cached ones of an earlier search, or a new one."""
        s = self._settings
        cap = price_cap(s, request)
        query = offer_query(s, request)
        key = cache_key(query, request, cap)
        now = self._client.clock()
        self._refused = {o: until for o, until in self._refused.items() if until > now}
        cached = self._offer_cache.get(key, now)
        if cached is not None:
            log.debug("vast: launch %r takes %d cached offers (no new search)", request.label,
                      len(cached))  # fmt: skip
            return [o for o in cached if int(o["id"]) not in self._refused]
        found = self._client.search_offers(query)
        offers = [o for o in rank_offers(found, request, cap) if int(o["id"]) not in self._refused]
        if not offers:
            raise PermanentProviderError(
                f"no offer matches the filter for label {request.label!r}: {len(found)} found,"
                f" {len(request.exclude_machines)} machines excluded, {len(self._refused)} "
                f"refused a create lately, max_dph {cap!r}"
            )
        if s.offer_cache_s > 0:
            self._offer_cache.put(key, offers, self._client.clock() + s.offer_cache_s)
        return offers

    def confirm_gone(self, instance_ids: Iterable[str], limit: int = 10) -> set[str]:
        """Those of the first `limit` (distinct) `instance_ids` that vast's show answers as gone.

        Gone is `{"instances": null}`, 404, or an instance shown `destroyed` or `terminated`
        (its `intended_status` or `actual_status`: vast's own client reads those as gone). An id
        whose show fails (an error, a timeout) or that vast still shows otherwise is not in the
        result: only vast's own word confirms a disappearance.

        A show that failed for a while (429, 5xx, a timeout: each retried with backoff, a
        Retry-After honoured up to 30 s a wait) ends the round: the rest are shown at the next
        call, those whose show failed last, so that ten of them never hold a tick for ten times
        that, and one vast keeps failing never keeps the others from being shown."""
        distinct = dict.fromkeys(str(i) for i in instance_ids)
        self._show_failed &= set(distinct)
        gone: set[str] = set()
        for iid in islice(sorted(distinct, key=lambda i: i in self._show_failed), max(limit, 0)):
            try:
                shown = self._client.show(iid)
            except TemporaryProviderError as exc:
                self._show_failed.add(iid)
                log.warning("vast: instance %r not confirmed gone: %s (the rest are shown at "
                            "the next tick)", iid, exc)  # fmt: skip
                break
            except ProviderError as exc:
                log.warning("vast: instance %r not confirmed gone: %s", iid, exc)
                continue
            self._show_failed.discard(iid)
            said = {shown.get("intended_status"), shown.get("actual_status")} if shown else set()
            if shown is None or said & {"destroyed", "terminated"}:
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

    def stop(self, instance_id: str) -> None:
        self._client.set_state(instance_id, "stopped")

    def start(self, instance_id: str) -> None:
        self._client.set_state(instance_id, "running")

    def restart_daemon(self, instance_id: str) -> None:
        raise PermanentProviderError("vast cannot restart a daemon; the instance agent does")

    def drain(self, instance_id: str) -> None:
        raise PermanentProviderError("vast cannot drain an instance; Curio does (unschedulable)")

    def undrain(self, instance_id: str) -> None:
        raise PermanentProviderError("vast cannot undrain an instance; Curio does (unschedulable)")


def _price(dph: Any) -> Any:
    """An offer's $/h as people read it (a float sum printed whole reads 0.41000000000000003)."""
    return round(dph, 4) if isinstance(dph, float) else dph

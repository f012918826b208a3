"""The vast.ai provider against a fake vast API (a real HTTP server on 127.0.0.1).

Time is a fake clock: pacing and backoff sleeps are recorded, never slept; instance boot
follows the fake server's virtual clock (`advance`). Only client timeouts take real time.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from fakes.vast_server import (
    Close,
    Delay,
    Empty,
    FakeVast,
    Lost,
    Malformed,
    RateLimited,
    Status,
    offer,
)
from pydantic import SecretStr, ValidationError

from controller.core.model import Instance
from controller.fleet.base import (
    LaunchRequest,
    NotDone,
    PermanentProviderError,
    ProviderError,
    SensorError,
    TemporaryProviderError,
)
from controller.fleet.vast import REFUSED_OFFER_S, VastProvider, VastSettings
from controller.fleet.vast_client import VastClient
from controller.fleet.vast_errors import CreateOutcomeUnknown, OfferGone
from controller.fleet.vast_instances import to_instance
from controller.fleet.vast_offers import offer_query, rank_offers

KEY = "vast-test-key-7f3c9a1e5d2b"
IMAGE = "ghcr.io/example/cuzk-curio:1.2"
ENV = {"CURIO_LAYERS": "gpu", "-p 9821:9821": "1"}
ONSTART = "supervisorctl start cuzk"


class FakeTime:
    """A monotonic clock that only moves when something sleeps on it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


class Rig:
    """A client and provider wired to one fake, with the fake clock they sleep on."""

    def __init__(self, settings: VastSettings, session: requests.Session) -> None:
        self.time = FakeTime()
        self.settings = settings
        self.client = VastClient(settings, session, clock=self.time.clock, sleep=self.time.sleep)
        self.provider = VastProvider(self.client, settings)


MakeRig = Callable[..., Rig]


@pytest.fixture
def fake() -> Iterator[FakeVast]:
    with FakeVast(api_key=KEY) as server:
        yield server


@pytest.fixture
def rig(fake: FakeVast) -> Iterator[MakeRig]:
    sessions: list[requests.Session] = []

    def make(url: str | None = None, **overrides: Any) -> Rig:
        fields: dict[str, Any] = {
            "base_url": url or fake.url, "api_key": KEY, "image": IMAGE, "env": ENV,
            "onstart": ONSTART, "timeout_s": 2.0, **overrides,
        }  # fmt: skip
        sessions.append(requests.Session())
        return Rig(VastSettings(**fields), sessions[-1])

    yield make
    for session in sessions:
        session.close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def wait_for(predicate: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for the fake"
        time.sleep(0.02)


# ---- settings ----------------------------------------------------------------------------


def test_settings_defaults_hide_the_key_and_match_the_filter_of_the_old_manager() -> None:
    s = VastSettings(api_key=SecretStr(KEY), image=IMAGE)
    assert s.base_url == "https://console.vast.ai" and s.runtype == "ssh"
    assert (s.timeout_s, s.retries, s.backoff_s) == (20.0, 3, 1.0)
    assert s.min_interval_s == {"list": 1.0, "create": 4.5, "destroy": 3.0, "search": 6.0,
                                "other": 1.0}  # fmt: skip
    assert (s.min_cpu_ram_gb, s.min_disk_gb, s.max_dph, s.min_gpu_ram_gb) == (240, 250, 0.9, 12.5)
    assert (s.min_cpu_cores, s.min_inet_down_mbps, s.min_cuda) == (25, 100, 13.0)
    assert s.verified and s.offer_type == "on-demand" and s.gpu_names == []
    assert KEY not in repr(s) and KEY not in str(s)
    partial = VastSettings(api_key=SecretStr(KEY), image=IMAGE, min_interval_s={"search": 10.0})
    assert partial.min_interval_s["search"] == 10.0 and partial.min_interval_s["create"] == 4.5


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"imgae": "x"}, "Extra inputs are not permitted"),
        ({"min_interval_s": {"lists": 1.0}}, "unknown endpoint(s) 'lists' (expected one of"),
        ({"offer_type": "bid"}, "offer_type 'bid' needs bid_price"),
        ({"extra_filter": {"geolocation": {"not": ["CN"]}}}, "term 'geolocation': unknown"),
        ({"base_url": "console.vast.ai"}, "base_url must start with http:// or https://"),
        ({"timeout_s": 0}, "greater than 0"),
    ],
)
def test_bad_settings_are_refused_with_a_sentence(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        VastSettings(**{"api_key": KEY, "image": IMAGE, **fields})
    assert message in str(info.value)
    assert KEY not in str(info.value)


# ---- listing -----------------------------------------------------------------------------


def test_listing_follows_next_token_across_three_pages(fake: FakeVast, rig: MakeRig) -> None:
    ids = [fake.add_instance(label=f"fg-{n}") for n in range(60)]
    rows = rig().client.list_instances()
    assert [r["id"] for r in rows] == sorted(ids)
    pages = fake.of("list")
    assert len(pages) == 3
    assert all(p.path == "/api/v1/instances/" and p.method == "GET" for p in pages)
    assert all(p.headers["Authorization"] == f"Bearer {KEY}" for p in pages)
    assert all("api_key" not in p.query for p in pages)  # the key never rides in a URL
    first, second, third = (p.query for p in pages)
    assert json.loads(first["limit"]) == 25 and json.loads(first["select_filters"]) == {}
    assert json.loads(first["order_by"]) == [{"col": "id", "dir": "asc"}]
    assert "after_token" not in first
    assert second["after_token"] and third["after_token"] != second["after_token"]
    assert fake.list_calls == 1  # one listing, three pages


def test_vast_fields_map_onto_instance(fake: FakeVast, rig: MakeRig) -> None:
    iid = fake.add_instance(label="fg-7-3-0-abc", machine_id=4242, dph_total=0.613,
                            gpu_name="RTX 5090", num_gpus=2)  # fmt: skip
    fake.set_status(iid, "exited")
    (inst,) = rig().provider.list_instances()
    assert inst == Instance(
        id=str(iid), label="fg-7-3-0-abc", machine_id="4242", host_id=str(4242 + 100000),
        status="exited", stage="registered", daemon="unknown", sidecar="unknown",
        gpu_name="RTX 5090", num_gpus=2, dph=0.613, status_msg="scripted: exited",
        start_date=1_700_000_000.0 + iid, intended_status="running",
    )  # fmt: skip


def test_to_instance_reads_null_status_as_provisioning_and_refuses_wrong_types() -> None:
    raw = {"id": 9, "actual_status": None, "label": None, "machine_id": 3, "dph_total": None}
    inst = to_instance(raw, 0.9)
    assert (inst.status, inst.stage, inst.label, inst.dph, inst.start_date) == (
        "provisioning", "provisioning", "", 0.9, None)  # fmt: skip
    assert to_instance({**raw, "dph_total": "cheap"}, 0.9).dph == 0.9  # unpriced: at the cap
    bad: dict[str, Any]
    for bad in ({"label": ["x"]}, {"start_date": {}}):
        with pytest.raises(SensorError, match="vast instance 9"):
            to_instance({**raw, **bad})


def test_instances_boot_on_the_virtual_clock(fake: FakeVast, rig: MakeRig) -> None:
    fake.offers[1] = offer(1)
    r = rig()
    iid = r.provider.launch(LaunchRequest(label="fg-boot"))
    seen = []
    for _ in range(3):
        (inst,) = r.provider.list_instances()
        seen.append((inst.id, inst.status, inst.stage))
        fake.advance(100)
    assert seen == [(iid, "provisioning", "provisioning"), (iid, "loading", "provisioning"),
                    (iid, "running", "registered")]  # fmt: skip


# ---- offers and launching ----------------------------------------------------------------


def test_offer_query_sends_ram_in_mb_excluded_machines_and_cheapest_first(
    fake: FakeVast, rig: MakeRig
) -> None:
    fake.offers.update({1: offer(1, machine_id=7), 2: offer(2, machine_id=8, dph=0.3),
                        3: offer(3, machine_id=9, cpu_ram=128000)})  # fmt: skip
    r = rig(gpu_names=["RTX 4090", "RTX 5090"], extra_filter={"machine_id": {"notin": [99]},
            "geolocation": {"notin": ["CN"]}})  # fmt: skip
    request = LaunchRequest(label="fg-q", exclude_machines=frozenset({"7", "12"}), max_dph=0.6)
    iid = r.provider.launch(request)
    (search,) = fake.of("search")
    body = search.body
    assert search.method == "POST" and search.path == "/api/v0/bundles/"
    assert body == offer_query(r.settings, request)
    assert body["cpu_ram"] == {"gte": 240_000} and body["gpu_ram"] == {"gte": 12_500}
    assert body["machine_id"] == {"notin": [12, 7, 99]}  # both exclusions stay
    assert body["geolocation"] == {"notin": ["CN"]}
    assert body["gpu_name"] == {"in": ["RTX 4090", "RTX 5090"]}
    assert body["dph_total"] == {"lte": 0.6}  # the request's cap is lower than the setting
    assert body["disk_space"] == {"gte": 250} and body["allocated_storage"] == 250
    assert body["cpu_cores"] == {"gte": 25} and body["inet_down"] == {"gte": 100}
    assert body["cuda_max_good"] == {"gte": 13.0} and body["reliability"] == {"gte": 0.95}
    for name, value in (("verified", True), ("rentable", True), ("rented", False),
                        ("external", False)):  # fmt: skip
        assert body[name] == {"eq": value}
    assert body["order"] == [["dph_total", "asc"]] and body["type"] == "on-demand"
    assert fake.instances[int(iid)]["machine_id"] == 8  # 7 excluded, 9 has too little RAM


def test_offers_rank_by_known_rate_per_dollar_then_unknown_then_slow(
    fake: FakeVast, rig: MakeRig
) -> None:
    offers = [offer(1, 11, 0.40), offer(2, 12, 0.80), offer(3, 13, 0.50), offer(4, 14, 0.30),
              offer(5, 15, 0.35), offer(6, 16, 0.95)]  # fmt: skip
    rates = (("12", 40.0), ("13", 30.0), ("14", 5.0), ("16", 99.0))
    request = LaunchRequest(label="fg-r", prefer_rates=rates)
    ranked = rank_offers(offers, request, max_dph=0.9)
    # 13: 60 proofs/$ beats 12: 50/$; then unmeasured by price; the slow one last; 16 too dear
    assert [o["id"] for o in ranked] == [3, 2, 5, 1, 4]
    fake.offers.update({o["id"]: o for o in offers})
    fake.vanish(3)
    fake.vanish(2)
    iid = rig().provider.launch(request)
    assert [r.path for r in fake.of("create")] == [f"/api/v0/asks/{n}/" for n in (3, 2, 5)]
    assert fake.instances[int(iid)]["machine_id"] == 15


def test_create_sends_image_env_disk_label_onstart_and_runtype(
    fake: FakeVast, rig: MakeRig
) -> None:
    fake.offers[1] = offer(1)
    iid = rig().provider.launch(LaunchRequest(label="fg-12-4-0-a1b2c3"))
    (create,) = fake.of("create")
    assert create.method == "PUT" and create.path == "/api/v0/asks/1/"
    assert create.body == {
        "client_id": "me", "image": IMAGE, "env": {**ENV, "FLEETGATE_LABEL": "fg-12-4-0-a1b2c3"},
        "disk": 250.0, "label": "fg-12-4-0-a1b2c3", "onstart": ONSTART, "runtype": "ssh",
        "cancel_unavail": True,
    }  # fmt: skip
    assert fake.creates_by_label == {"fg-12-4-0-a1b2c3": 1}
    assert fake.instances[int(iid)]["label"] == "fg-12-4-0-a1b2c3"


def test_bid_launch_sends_the_bid_price_and_type(fake: FakeVast, rig: MakeRig) -> None:
    fake.offers[1] = offer(1)
    rig(offer_type="bid", bid_price=0.42).provider.launch(LaunchRequest(label="fg-bid"))
    assert fake.of("search")[0].body["type"] == "bid"
    assert fake.of("create")[0].body["price"] == 0.42


def test_a_launch_logs_its_offers_price_as_dollars(
    fake: FakeVast, rig: MakeRig, caplog: pytest.LogCaptureFixture
) -> None:
    fake.offers[1] = offer(1, dph=0.1 + 0.31)  # vast's JSON carries such sums whole
    with caplog.at_level(logging.INFO, logger="controller.fleet.vast"):
        rig().provider.launch(LaunchRequest(label="fg-price"))
    assert "(machine 10, $0.41/h)" in caplog.text, caplog.text


def test_a_gone_offer_moves_on_to_the_next(fake: FakeVast, rig: MakeRig) -> None:
    fake.offers.update({1: offer(1, dph=0.3), 2: offer(2, dph=0.4)})
    fake.vanish(1)
    iid = rig().provider.launch(LaunchRequest(label="fg-next"))
    assert [r.path for r in fake.of("create")] == ["/api/v0/asks/1/", "/api/v0/asks/2/"]
    assert fake.instances[int(iid)]["machine_id"] == 20
    assert fake.creates_by_label == {"fg-next": 1}


def test_offers_all_gone_is_temporary_and_tries_at_most_max_offers(
    fake: FakeVast, rig: MakeRig
) -> None:
    for n in range(1, 5):
        fake.offers[n] = offer(n)
        fake.vanish(n)
    with pytest.raises(TemporaryProviderError, match=r"offers \[1, 2, 3\] were all taken"):
        rig(max_offers_tried=3).provider.launch(LaunchRequest(label="fg-gone"))
    assert len(fake.of("create")) == 3 and not fake.instances


def test_no_offer_matching_the_filter_is_permanent(fake: FakeVast, rig: MakeRig) -> None:
    fake.offers[1] = offer(1, cuda_max_good=12.2)
    with pytest.raises(PermanentProviderError, match="no offer matches the filter for label"):
        rig().provider.launch(LaunchRequest(label="fg-none"))
    assert not fake.of("create")


def test_launches_of_one_tick_share_one_offer_search(fake: FakeVast, rig: MakeRig) -> None:
    fake.offers.update({n: offer(n, dph=0.30 + n / 100) for n in range(1, 7)})
    r = rig()
    ids = [r.provider.launch(LaunchRequest(label=f"fg-c{n}")) for n in range(4)]
    assert len(fake.of("search")) == 1
    assert [c.path for c in fake.of("create")] == [f"/api/v0/asks/{n}/" for n in (1, 2, 3, 4)]
    assert len(set(ids)) == 4 and fake.creates_by_label == {f"fg-c{n}": 1 for n in range(4)}
    assert fake.of("search")[0] and r.time.now < 1030.0  # searched at 1000 on the fake clock
    r.time.now = 1029.9  # offer_cache_s (30) has not quite passed on the client's clock
    r.provider.launch(LaunchRequest(label="fg-c4"))
    assert len(fake.of("search")) == 1 and fake.of("create")[-1].path == "/api/v0/asks/5/"
    r.time.now = 1030.0  # now it has
    r.provider.launch(LaunchRequest(label="fg-c5"))
    assert len(fake.of("search")) == 2 and fake.of("create")[-1].path == "/api/v0/asks/6/"


def test_a_different_search_is_not_served_from_the_cache(fake: FakeVast, rig: MakeRig) -> None:
    fake.offers.update({n: offer(n, dph=0.30 + n / 100) for n in range(1, 8)})
    r = rig()
    r.provider.launch(LaunchRequest(label="fg-a"))
    r.provider.launch(LaunchRequest(label="fg-b", exclude_machines=frozenset({"20"})))
    r.provider.launch(LaunchRequest(label="fg-c", prefer_rates=(("50", 40.0),)))
    r.provider.launch(LaunchRequest(label="fg-d", max_dph=0.5))
    assert len(fake.of("search")) == 4
    assert [c.path for c in fake.of("create")] == [f"/api/v0/asks/{n}/" for n in (1, 3, 5, 2)]
    r.provider.launch(LaunchRequest(label="fg-e"))  # the first search's offers, less those used
    assert len(fake.of("search")) == 4 and fake.of("create")[-1].path == "/api/v0/asks/4/"
    uncached = rig(offer_cache_s=0.0)
    uncached.provider.launch(LaunchRequest(label="fg-f"))
    uncached.provider.launch(LaunchRequest(label="fg-g"))
    assert len(fake.of("search")) == 6


def test_a_gone_offer_is_skipped_by_the_next_launch_without_a_new_search(
    fake: FakeVast, rig: MakeRig
) -> None:
    fake.offers.update({n: offer(n, dph=0.30 + n / 100) for n in range(1, 5)})
    r = rig()
    r.provider.launch(LaunchRequest(label="fg-1"))
    fake.vanish(2)  # taken by somebody else after the search
    r.provider.launch(LaunchRequest(label="fg-2"))  # 2 is gone: 3
    r.provider.launch(LaunchRequest(label="fg-3"))  # straight to 4, 2 is not tried again
    assert [c.path for c in fake.of("create")] == [f"/api/v0/asks/{n}/" for n in (1, 2, 3, 4)]
    assert len(fake.of("search")) == 1
    with pytest.raises(TemporaryProviderError, match=r"offers \[2\] were all taken"):
        r.provider.launch(LaunchRequest(label="fg-4"))  # used up: a new search finds only 2
    assert len(fake.of("search")) == 2


def test_an_offer_whose_create_was_refused_stays_and_an_unknown_one_goes(
    fake: FakeVast, rig: MakeRig
) -> None:
    fake.offers.update({n: offer(n, dph=0.30 + n / 100) for n in range(1, 4)})
    fake.script("create", RateLimited(), Lost(Status(500)))
    r = rig()
    with pytest.raises(TemporaryProviderError, match="not created"):
        r.provider.launch(LaunchRequest(label="fg-429"))
    with pytest.raises(CreateOutcomeUnknown):
        r.provider.launch(LaunchRequest(label="fg-lost"))  # offer 1 again: it was not rented
    r.provider.launch(LaunchRequest(label="fg-next"))  # 1 may be rented: never tried again
    assert [c.path for c in fake.of("create")] == [f"/api/v0/asks/{n}/" for n in (1, 1, 2)]
    assert len(fake.of("search")) == 1


@pytest.mark.parametrize("lost", [Status(500), Close()], ids=["500", "connection-closed"])
def test_a_create_whose_answer_is_lost_is_unknown_and_its_label_is_found_late(
    fake: FakeVast, rig: MakeRig, lost: Status | Close
) -> None:
    fake.offers.update({1: offer(1), 2: offer(2)})
    fake.late_creates = 2
    fake.script("create", Lost(lost))
    r = rig()
    with pytest.raises(CreateOutcomeUnknown) as info:
        r.provider.launch(LaunchRequest(label="fg-lost"))
    assert info.value.label == "fg-lost" and info.value.offer_id == 1
    assert isinstance(info.value, TemporaryProviderError)
    assert "looked for by its label" in str(info.value) and "'fg-lost'" in str(info.value)
    from controller.fleet.base import CreateOutcomeUnknown as Unknown

    assert isinstance(info.value, Unknown)  # the actuator catches the interface's type
    assert len(fake.of("create")) == 1  # never retried, never another offer
    assert fake.creates_by_label == {"fg-lost": 1}  # vast did create it
    assert r.provider.find_by_label("fg-lost") is None  # not listed yet (late)
    found = r.provider.find_by_label("fg-lost")
    assert found is not None and found.label == "fg-lost" and found.machine_id == "10"
    assert len(fake.of("create")) == 1


def test_a_create_that_times_out_is_unknown(fake: FakeVast, rig: MakeRig) -> None:
    fake.offers[1] = offer(1)
    fake.script("create", Delay(1.0))
    r = rig(timeout_s=0.3)
    with pytest.raises(CreateOutcomeUnknown, match="timed out"):
        r.provider.launch(LaunchRequest(label="fg-slow"))
    wait_for(lambda: fake.creates_by_label["fg-slow"] == 1)  # vast went on and created it
    found = r.provider.find_by_label("fg-slow")
    assert found is not None and len(fake.of("create")) == 1


@pytest.mark.parametrize(
    ("reply", "error", "text"),
    [
        (RateLimited(), NotDone, "rate limited (HTTP 429); not created"),
        (
            Status(400, '{"success": false, "error": "invalid_args", "msg": "bad image"}'),
            PermanentProviderError,
            "invalid_args: bad image",
        ),
        (
            Status(200, '{"success": false, "error": "insufficient_credit", "msg": "top up"}'),
            PermanentProviderError,
            "insufficient_credit",
        ),
        (Status(410, "gone"), OfferGone, "offer 1 is gone"),
        (Status(200, '{"success": true}'), CreateOutcomeUnknown, "without a new_contract"),
        (Status(200, "<html>ok</html>", "text/html"), CreateOutcomeUnknown, "not JSON"),
        (Status(502, "bad gateway", "text/plain"), CreateOutcomeUnknown, "HTTP 502"),
    ],
    ids=["429", "400", "refused", "410", "no-id", "not-json", "502"],
)
def test_create_answers_map_to_what_became_of_the_create(
    fake: FakeVast, rig: MakeRig, reply: Status | RateLimited, error: type, text: str
) -> None:
    fake.offers[1] = offer(1)
    fake.script("create", reply)
    with pytest.raises(ProviderError) as info:
        rig().client.create(1, "fg-x")
    assert type(info.value) is error and text in str(info.value)
    assert len(fake.of("create")) == 1  # a create is sent once, whatever comes back


def test_a_refused_create_stops_the_launch_instead_of_trying_other_offers(
    fake: FakeVast, rig: MakeRig
) -> None:
    fake.offers.update({1: offer(1), 2: offer(2)})
    fake.script("create", Status(400, '{"success": false, "error": "invalid_args"}'))
    with pytest.raises(PermanentProviderError, match="invalid_args"):
        rig().provider.launch(LaunchRequest(label="fg-refused"))
    assert len(fake.of("create")) == 1


def test_an_offer_vast_cannot_schedule_is_refused_and_rents_nothing(
    fake: FakeVast, rig: MakeRig
) -> None:
    fake.offers.update({1: offer(1), 2: offer(2)})
    fake.unschedulable.add(1)  # its GPUs are busy: vast would rent a stopped instance
    r = rig()
    with pytest.raises(PermanentProviderError, match="vast refused: unavailable"):
        r.provider.launch(LaunchRequest(label="fg-wait"))
    assert not fake.instances and fake.creates_by_label == {}  # nothing stopped, nothing billed
    assert fake.of("create")[0].body["cancel_unavail"] is True
    # it stays in vast's search results, first by price: the next launches move on to the
    # next offer (from the cached search, and from a new one) instead of being refused again
    iid = r.provider.launch(LaunchRequest(label="fg-next"))
    assert [q.path for q in fake.of("create")] == ["/api/v0/asks/1/", "/api/v0/asks/2/"]
    fake.offers[3] = offer(3)
    r.time.now += 60  # past the offer cache: a new search lists 1 again
    r.provider.launch(LaunchRequest(label="fg-third"))
    assert fake.of("create")[-1].path == "/api/v0/asks/3/" and len(fake.of("search")) == 2
    assert iid in {str(i) for i in fake.instances}
    r.time.now += REFUSED_OFFER_S  # it may be schedulable again: tried again, first
    with pytest.raises(PermanentProviderError, match="vast refused"):
        r.provider.launch(LaunchRequest(label="fg-later"))
    assert fake.of("create")[-1].path == "/api/v0/asks/1/"


def test_a_create_that_never_connected_is_not_unknown(rig: MakeRig) -> None:
    r = rig(url=closed_port_url())
    with pytest.raises(TemporaryProviderError) as info:
        r.client.create(1, "fg-unsent")
    assert not isinstance(info.value, CreateOutcomeUnknown) and "not sent" in str(info.value)
    assert r.time.sleeps == []  # and not retried


# ---- failures of the listing -------------------------------------------------------------


def test_plain_text_429_bursts_are_retried_with_backoff(
    fake: FakeVast, rig: MakeRig, caplog: pytest.LogCaptureFixture
) -> None:
    fake.add_instance(label="a")
    fake.rate_limit("list", 2)
    r = rig()
    with caplog.at_level(logging.WARNING):
        rows = r.client.list_instances(expect_nonempty=True)
    assert len(rows) == 1 and len(fake.of("list")) == 3
    assert r.time.sleeps == [1.0, 2.0]  # backoff_s, then doubled
    assert caplog.text.count("HTTP 429; retry") == 2


def test_5xx_beyond_the_retries_is_a_sensor_error(fake: FakeVast, rig: MakeRig) -> None:
    fake.script("list", Status(503), Status(502), Status(500), Status(504))
    r = rig()
    with pytest.raises(SensorError, match="HTTP 504"):
        r.provider.list_instances()
    assert len(fake.of("list")) == 4 and r.time.sleeps == [1.0, 2.0, 4.0]


def test_read_timeouts_and_hangups_are_retried(fake: FakeVast, rig: MakeRig) -> None:
    fake.add_instance(label="a")
    fake.script("list", Delay(1.0), Close())
    r = rig(timeout_s=0.3)
    assert [i.label for i in r.provider.list_instances()] == ["a"]
    assert len(fake.of("list")) == 3


def test_an_unreachable_api_is_a_sensor_error(rig: MakeRig) -> None:
    r = rig(url=closed_port_url(), retries=1)
    with pytest.raises(SensorError, match="ConnectionError"):
        r.provider.list_instances()
    assert r.time.sleeps == [1.0]


def test_410_gone_is_a_sensor_error_and_the_retired_listing_is_never_used(
    fake: FakeVast, rig: MakeRig
) -> None:
    fake.add_instance()
    h = {"Authorization": f"Bearer {KEY}"}
    with requests.get(fake.url + "/api/v0/instances/", headers=h, timeout=5) as old:
        assert old.status_code == 410  # the fake retires the v0 collection, as vast did
    fake.script("list", Status(410, "Gone", "text/plain"))
    r = rig()
    with pytest.raises(SensorError, match="410 Gone"):
        r.provider.list_instances()
    assert len(fake.of("list")) == 1  # a 410 is not retried
    assert [i.id for i in r.provider.list_instances()] == [str(min(fake.instances))]
    assert len(fake.of("list_v0")) == 1  # only the probe above


def test_an_empty_listing_is_an_error_when_instances_are_expected(
    fake: FakeVast, rig: MakeRig
) -> None:
    fake.add_instance()
    r = rig()
    fake.script("list", Empty(), Empty(), Empty(), Empty())
    with pytest.raises(SensorError, match="listed no instances while instances are expected"):
        r.provider.list_instances(expect_nonempty=True)
    assert r.provider.list_instances(expect_nonempty=False) == []
    believing = VastProvider(r.client, r.settings, expect_nonempty=lambda: True)
    with pytest.raises(SensorError):
        believing.list_instances()
    with pytest.raises(TemporaryProviderError, match="cannot tell whether label 'x' exists"):
        believing.find_by_label("x")  # a failed listing is never "not found"
    assert len(believing.list_instances()) == 1


def test_a_listing_of_null_instances_is_an_empty_page(fake: FakeVast, rig: MakeRig) -> None:
    fake.empty_as_null = True  # vast's client reads `"instances": null` as none
    r = rig()
    assert r.provider.list_instances() == []  # an account with none: a fleet may start
    assert len(fake.of("list")) == 1  # readable: not retried
    with pytest.raises(SensorError, match="listed no instances while instances are expected"):
        r.provider.list_instances(expect_nonempty=True)  # null is no proof the fleet is gone
    fake.script("list", Status(200, '{"instances": null, "total_instances": 2}'))
    with pytest.raises(SensorError, match="total_instances=2"):
        r.provider.list_instances()
    fake.script("list", Status(200, '{"success": true, "next_token": null}'))
    with pytest.raises(SensorError, match="no list of instances"):
        r.provider.list_instances()  # no `instances` at all: not read as none
    ids = [fake.add_instance() for _ in range(25)]  # one full page, then an empty one
    full = {"instances": [fake.instances[i] for i in ids], "next_token": "more"}
    fake.script("list", Status(200, json.dumps(full)))
    fake.script("list", Status(200, '{"instances": null, "next_token": null}'))
    assert [i.id for i in r.provider.list_instances()] == [str(i) for i in ids]


@pytest.mark.parametrize(
    "reply",
    [
        Malformed(),
        Status(200, "<html>maintenance</html>", "text/html"),
        Status(200, '{"success": true, "instances": {"1": {}}}'),
        Status(200, '{"success": true, "instances": [{"label": "no id"}]}'),
        Status(200, '{"success": true, "instances": [{"id": 1}], "next_token": 7}'),
        Status(200, '{"success": false, "error": "internal", "msg": "db down"}'),
        Status(200, '{"instances": [], "total_instances": 3, "next_token": null}'),
    ],
    ids=["truncated", "html", "not-a-list", "no-id", "token-type", "unsuccessful", "contradicts"],
)
def test_a_malformed_listing_is_a_sensor_error(
    fake: FakeVast, rig: MakeRig, reply: Malformed | Status
) -> None:
    fake.script("list", *[reply] * 4)  # every attempt: a reply that is not JSON is retried
    with pytest.raises(SensorError):
        rig().provider.list_instances()


def test_a_truncated_listing_page_is_retried_like_a_5xx(
    fake: FakeVast, rig: MakeRig, caplog: pytest.LogCaptureFixture
) -> None:
    ids = [fake.add_instance(label=f"fg-{n}") for n in range(30)]
    fake.script("list", Delay(0.0), Malformed())  # page 1 as usual, page 2 cut short once
    r = rig(min_interval_s={"list": 0.0})  # only the backoff sleeps
    with caplog.at_level(logging.WARNING):
        rows = r.client.list_instances(expect_nonempty=True)
    assert [row["id"] for row in rows] == sorted(ids)
    pages = [p.query.get("after_token") for p in fake.of("list")]
    assert len(pages) == 3 and pages[0] is None and pages[1] == pages[2]  # page 2 again
    assert r.time.sleeps == [1.0]
    assert "vast instance list page 2: HTTP 200 but the reply is not JSON" in caplog.text
    assert KEY not in caplog.text


def test_truncated_replies_share_the_5xx_retry_budget(fake: FakeVast, rig: MakeRig) -> None:
    fake.add_instance()
    fake.script("list", Status(503), Malformed(), Status(502), Malformed())
    r = rig()
    with pytest.raises(SensorError, match=r"not JSON \(after 4 attempts\)"):
        r.provider.list_instances()
    assert len(fake.of("list")) == 4 and r.time.sleeps == [1.0, 2.0, 4.0]


def test_truncated_show_and_search_replies_are_retried(fake: FakeVast, rig: MakeRig) -> None:
    iid = fake.add_instance(label="shown")
    fake.offers[1] = offer(1)
    fake.script("show", Malformed('{"instances": {"id": '))
    fake.script("search", Malformed('{"offers": [{"id": 1'), Status(200, ""))
    r = rig()
    shown = r.client.show(str(iid))
    assert shown is not None and shown["label"] == "shown" and len(fake.of("show")) == 2
    assert [o["id"] for o in r.client.search_offers({})] == [1]
    assert len(fake.of("search")) == 3


def test_truncated_replies_to_creates_and_mutations_are_never_resent(
    fake: FakeVast, rig: MakeRig
) -> None:
    iid = fake.add_instance()
    fake.offers[1] = offer(1)
    fake.script("create", Lost(Status(200, '{"success": true, "new_con')))
    fake.script("reboot", Malformed('{"succ'))
    r = rig()
    with pytest.raises(CreateOutcomeUnknown, match="not JSON"):
        r.client.create(1, "fg-cut")
    assert len(fake.of("create")) == 1 and fake.creates_by_label == {"fg-cut": 1}
    r.client.reboot(str(iid))  # a 2xx is vast's yes: taken as done, not sent twice
    assert len(fake.of("reboot")) == 1 and r.time.sleeps == []


def test_a_cursor_that_goes_round_in_circles_is_a_sensor_error(
    fake: FakeVast, rig: MakeRig
) -> None:
    page = '{"instances": [{"id": 1}], "next_token": "again"}'
    fake.script("list", Status(200, page), Status(200, page))
    with pytest.raises(SensorError, match="repeats an earlier next_token"):
        rig().client.list_instances()


def test_a_cursor_that_names_fresh_tokens_without_going_on_is_a_sensor_error(
    fake: FakeVast, rig: MakeRig
) -> None:
    """A new token every page and the same instance: it paged on to 4,000 pages, about 67
    minutes of one tick at vast's pace."""
    pages = [Status(200, f'{{"instances": [{{"id": 1}}], "next_token": "t{n}"}}')
             for n in range(5)]  # fmt: skip
    fake.script("list", *pages)
    with pytest.raises(SensorError, match="page 2 lists no instance not listed before"):
        rig().client.list_instances()
    assert len(fake.of("list")) == 2


def test_an_empty_listing_that_vast_says_is_not_empty_is_a_sensor_error(
    fake: FakeVast, rig: MakeRig
) -> None:
    fake.script("list", Status(200, '{"instances": [], "total_instances": 2}'))
    r = rig()
    with pytest.raises(SensorError, match="listed no instances while total_instances=2"):
        r.provider.list_instances(expect_nonempty=False)
    assert len(fake.of("list")) == 1  # readable JSON: not retried
    fake.script("list", Status(410, "Gone", "text/plain"))
    with pytest.raises(SensorError, match="410 Gone"):
        r.provider.list_instances(expect_nonempty=False)
    assert r.provider.list_instances(expect_nonempty=False) == []  # vast agrees: none


def test_a_refused_key_is_permanent_and_never_shown(fake: FakeVast, rig: MakeRig) -> None:
    r = rig(api_key="wrong-key-0000111122223333")
    with pytest.raises(SensorError, match="refused the API key") as listing:
        r.provider.list_instances()
    with pytest.raises(PermanentProviderError, match="refused the API key") as search:
        r.client.search_offers({})
    for exc in (listing.value, search.value):
        assert "wrong-key" not in str(exc) and KEY not in str(exc)
        # where to look: a wrong key does not mend itself, as a sensing failure might
        assert "check vast.api_key" in str(exc) and "wrong or revoked" in str(exc), exc
    assert len(fake.of("list")) == 1  # a 401 is not retried


# ---- pacing ------------------------------------------------------------------------------


def test_each_endpoint_keeps_its_minimum_interval(fake: FakeVast, rig: MakeRig) -> None:
    fake.offers.update({1: offer(1), 2: offer(2)})
    r = rig()
    c, t = r.client, r.time
    c.list_instances()
    c.list_instances()  # list: 1 s
    c.search_offers({})
    c.search_offers({})  # search: 6 s
    a = c.create(1, "fg-a")
    b = c.create(2, "fg-b")  # create: 4.5 s
    c.reboot(a)
    c.set_label(a, "x")  # other: 1 s
    c.destroy(a)
    c.destroy(b)  # destroy: 3 s
    assert t.sleeps == [1.0, 6.0, 4.5, 1.0, 3.0]
    c.list_instances()
    t.now += 0.4
    c.list_instances()  # only the rest of the interval is waited
    assert t.sleeps[-1] == pytest.approx(0.6)


def test_intervals_come_from_the_settings(fake: FakeVast, rig: MakeRig) -> None:
    r = rig(min_interval_s={"list": 2.5})
    r.client.list_instances()
    r.client.list_instances()
    assert r.time.sleeps == [2.5]


# ---- the key -----------------------------------------------------------------------------


def test_the_key_is_in_no_exception_message_or_log_record(
    fake: FakeVast, rig: MakeRig, caplog: pytest.LogCaptureFixture
) -> None:
    fake.offers.update({1: offer(1), 2: offer(2)})
    fake.add_instance()
    echo = json.dumps({"success": False, "error": "invalid_args", "msg": f"bad key {KEY}"})
    fake.script("list", RateLimited(), Status(503), Malformed(), Malformed())
    fake.script("search", Status(400, echo))
    fake.script("create", Lost(Close()))
    fake.script("destroy", Status(500, echo))
    fake.script("update", Status(200, echo))
    r = rig(timeout_s=0.3)
    errors: list[BaseException] = []
    calls: list[Callable[[], object]] = [
        r.provider.list_instances, lambda: r.client.search_offers({}),
        lambda: r.client.create(1, "fg-k"), lambda: r.client.destroy("1"),
        lambda: r.client.set_label("1", "x"), lambda: r.client.show("not-a-number"),
    ]  # fmt: skip
    with caplog.at_level(logging.DEBUG):
        for call in calls:
            with pytest.raises((ProviderError, SensorError)) as info:
                call()
            errors.append(info.value)
    assert len(errors) == len(calls)
    texts = [str(e) for e in errors] + [repr(e) for e in errors] + [caplog.text]
    texts += [r.getMessage() for r in caplog.records]
    assert not [t for t in texts if KEY in t]
    assert "bad key ***" in str(errors[1])  # an echoed key is scrubbed
    assert KEY not in repr(r.client.settings) and KEY not in repr(r.client)


# ---- state changes -----------------------------------------------------------------------


def test_destroy_reboot_label_and_state_hit_the_right_paths(fake: FakeVast, rig: MakeRig) -> None:
    iid = fake.add_instance(label="old")
    r = rig()
    r.provider.reboot(str(iid))
    assert fake.instances[iid]["actual_status"] == "rebooting"
    r.client.set_label(str(iid), "fg-new")
    r.client.set_state(str(iid), "stopped")
    assert fake.instances[iid]["actual_status"] == "stopped"
    assert r.provider.find_by_label("fg-new") is not None
    r.provider.destroy(str(iid))
    assert iid not in fake.instances
    sent = [(q.method, q.path, q.body) for q in fake.requests if q.endpoint != "list"]
    assert sent == [
        ("PUT", f"/api/v0/instances/reboot/{iid}/", {}),
        ("PUT", f"/api/v0/instances/{iid}/", {"label": "fg-new"}),
        ("PUT", f"/api/v0/instances/{iid}/", {"state": "stopped"}),
        ("DELETE", f"/api/v0/instances/{iid}/", {}),
    ]


def test_state_changes_retry_only_on_429_and_unsent_requests(fake: FakeVast, rig: MakeRig) -> None:
    iid = fake.add_instance()
    r = rig()
    fake.script("destroy", Status(503))
    with pytest.raises(TemporaryProviderError, match="HTTP 503"):
        r.provider.destroy(str(iid))
    fake.script("destroy", Close())
    with pytest.raises(TemporaryProviderError, match="it may have reached vast"):
        r.provider.destroy(str(iid))
    assert len(fake.of("destroy")) == 2 and iid in fake.instances
    fake.rate_limit("destroy", 2)
    r.provider.destroy(str(iid))
    assert len(fake.of("destroy")) == 5 and iid not in fake.instances
    unsent = rig(url=closed_port_url(), retries=2)
    with pytest.raises(TemporaryProviderError, match="not sent"):
        unsent.provider.reboot("1")
    assert unsent.time.sleeps == [1.0, 2.0]  # nothing left, so it was safe to try again


def test_destroying_an_instance_vast_does_not_know_is_done(fake: FakeVast, rig: MakeRig) -> None:
    rig().provider.destroy("424242")
    assert fake.of("destroy")[0].path == "/api/v0/instances/424242/"
    with pytest.raises(PermanentProviderError, match="HTTP 404"):
        rig().provider.reboot("424242")


def test_show_returns_the_instance_or_none(fake: FakeVast, rig: MakeRig) -> None:
    iid = fake.add_instance(label="shown")
    c = rig().client
    shown = c.show(str(iid))
    assert shown is not None and shown["label"] == "shown"
    assert fake.of("show")[0].query == {"owner": "me"}
    assert c.show("999999") is None
    with pytest.raises(PermanentProviderError, match="ids are numbers"):
        c.show("../users")


def test_confirm_gone_takes_only_vasts_word_that_an_instance_is_gone(
    fake: FakeVast, rig: MakeRig
) -> None:
    destroyed, kept, failing = (fake.add_instance(label=n) for n in ("d", "k", "f"))
    fake.offers[1] = offer(1)
    fake.late_creates, fake.late_shows = 3, False
    r = rig()
    late = int(r.provider.launch(LaunchRequest(label="fg-late")))  # not listed yet; show sees it
    assert late not in {int(i.id) for i in r.provider.list_instances()}
    r.provider.destroy(str(destroyed))
    fake.script("show", Status(404, "{}"))  # the first show: vast does not know 424242
    fake.script("show", Delay(0.0), Delay(0.0), *[Status(503)] * 4)  # then `failing`: 503s
    ids = ["424242", str(destroyed), str(kept), str(failing), str(late)]
    assert r.provider.confirm_gone(ids) == {"424242", str(destroyed)}
    shows = [s.path.split("/")[-2] for s in fake.of("show")]
    assert shows == ids[:3] + [str(failing)] * 4  # 503 retried as a read; the rest wait
    assert r.provider.confirm_gone(ids[2:]) == set()  # the next round: the failed one last
    shows = [s.path.split("/")[-2] for s in fake.of("show")]
    assert shows[7:] == [str(kept), str(late), str(failing)]
    assert {failing, kept, late} <= set(fake.instances)


def test_a_rate_limited_show_ends_the_round_and_the_rest_are_shown_next(
    fake: FakeVast, rig: MakeRig
) -> None:
    """vast rate-limits its shows: ten instances missing from a listing were each shown
    through all their retries (7 s of backoff apiece, 90 s with a Retry-After of 30 s), and
    held the tick for minutes (with Retry-After, past systemd's watchdog). One show's retries
    end the round now."""
    ids = [str(900 + n) for n in range(10)]
    fake.script("show", *[Status(429, "API requests too frequent", "text/plain")] * 4)
    r = rig(retries=3, backoff_s=1.0)
    assert r.provider.confirm_gone(ids) == set()
    assert [s.path for s in fake.of("show")] == [f"/api/v0/instances/{ids[0]}/"] * 4
    assert sum(r.time.sleeps) < 15  # one show's backoff (1 + 2 + 4 s) and its pacing
    assert r.provider.confirm_gone(ids) == set(ids)  # vast answers again: all of them, the
    shown = [s.path.split("/")[-2] for s in fake.of("show")][4:]  # one that failed last
    assert shown == ids[1:] + ids[:1]


def test_an_instance_vast_shows_destroyed_or_terminated_is_gone(
    fake: FakeVast, rig: MakeRig
) -> None:
    """vast's show may still answer with a destroyed instance's object: its own client
    (vast.py, the self-test's cleanup) reads `destroyed` or `terminated`, intended or actual,
    as gone. Not confirmed gone, it kept its track and counted in the fleet."""
    ids = [
        fake.add_instance(status="destroyed", label="a"),
        fake.add_instance(label="b", intended_status="destroyed"),
        fake.add_instance(label="c", intended_status="terminated"),
        fake.add_instance(status="offline", label="d"),
    ]  # a host gone away: not vast's word
    r = rig()
    assert r.provider.confirm_gone([str(i) for i in ids]) == {str(i) for i in ids[:3]}


def test_confirm_gone_shows_at_most_limit_instances(fake: FakeVast, rig: MakeRig) -> None:
    r = rig()
    ids = [str(900 + n) for n in range(6)]
    assert r.provider.confirm_gone(ids + ids[:2], limit=3) == set(ids[:3])
    assert [s.path for s in fake.of("show")] == [f"/api/v0/instances/{i}/" for i in ids[:3]]
    assert r.provider.confirm_gone(iter(ids), limit=0) == set() and len(fake.of("show")) == 3
    assert r.provider.confirm_gone(["x1"]) == set()  # not a vast id: never confirmed


def test_restart_daemon_and_drain_are_not_vasts_to_do(fake: FakeVast, rig: MakeRig) -> None:
    p = rig().provider
    with pytest.raises(PermanentProviderError, match="the instance agent does"):
        p.restart_daemon("1")
    with pytest.raises(PermanentProviderError, match="Curio does"):
        p.drain("1")
    assert fake.requests == []


@pytest.mark.parametrize("iid", ["²", "٥٠٠١", "5001 "])
def test_an_id_of_digits_other_than_ascii_is_no_id(iid: str) -> None:
    """`str.isdigit` took "²" (then `int` raised out of the tick) and "٥٠٠١" (read as 5001,
    another instance's id)."""
    from controller.core.fields import is_digits
    from controller.fleet.base import SensorError
    from controller.fleet.vast_client import _listing_page

    assert not is_digits(iid)
    with pytest.raises(SensorError, match="entry 0 has no integer id"):
        _listing_page({"instances": [{"id": iid, "label": "x"}]}, 1)
    assert _listing_page({"instances": [{"id": "5001"}]}, 1)[0][0]["id"] == 5001

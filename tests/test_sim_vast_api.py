"""The simulated vast.ai API (SimVastAPI) through the production VastClient and VastProvider.

No sockets: the adapter is mounted on a requests.Session and answers from a Simulation; the
client's pacing and backoff read the simulation's virtual clock and never sleep.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pydantic
import pytest
import requests
from pydantic import SecretStr
from support import NO_FAULTS

from controller.fleet.base import (
    LaunchRequest,
    PermanentProviderError,
    SensorError,
    TemporaryProviderError,
)
from controller.fleet.vast import VastProvider, VastSettings
from controller.fleet.vast_client import VastClient
from controller.fleet.vast_errors import CreateOutcomeUnknown, OfferGone
from controller.fleet.vast_offers import offer_query
from controller.sim import SimConfig, Simulation
from controller.sim.vast_api import SimVastAPI
from controller.sim.vast_views import ask_id

BASE = "https://console.vast.ai"
KEY = "sim-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
FAST_BOOT: dict[str, Any] = {"boot_s": (30, 30), "pull_s": (60, 60), "reboot_s": 60.0}
VAST_FIELDS = {
    "id", "machine_id", "host_id", "label", "actual_status", "intended_status", "cur_state",
    "status_msg", "start_date", "gpu_name", "num_gpus", "gpu_ram", "cpu_ram", "mem_usage",
    "mem_limit", "dph_total", "reliability2", "public_ipaddr", "ssh_host", "ssh_port", "ports",
    "geolocation",
}  # fmt: skip


@dataclass
class Rig:
    sim: Simulation
    api: SimVastAPI
    session: requests.Session
    client: VastClient
    provider: VastProvider

    def raw(self) -> dict[str, dict[str, Any]]:
        """Every listed instance's vast object by id."""
        self.provider.list_instances()
        return self.provider.last_raw

    def get(self, path: str, **params: str) -> requests.Response:
        return self.session.get(BASE + path, params=params, headers=AUTH)


def rig(sim: Simulation | None = None, key: str = KEY, seed: int = 7, **config: Any) -> Rig:
    if sim is None:
        sim = Simulation(SimConfig(**{**NO_FAULTS, **FAST_BOOT, **config}), seed=seed)
    api = SimVastAPI(sim, KEY)
    session = requests.Session()
    api.mount(session, BASE)
    settings = VastSettings(base_url=BASE, api_key=SecretStr(key), image="img")
    client = VastClient(settings, session, clock=sim.now, sleep=lambda s: None)
    return Rig(sim, api, session, client, VastProvider(client, settings))


def launch(r: Rig, label: str, **kwargs: Any) -> str:
    return r.provider.launch(LaunchRequest(label=label, **kwargs))


def run_until(r: Rig, done: Callable[[], bool], limit_s: float = 900.0) -> None:
    waited = 0.0
    while not done():
        assert waited < limit_s, "condition not reached"
        r.sim.advance(10)
        waited += 10


def test_sixty_instances_list_in_three_pages_with_exact_ids_and_only_vast_fields() -> None:
    r = rig()
    for k in range(60):
        r.sim.world.launch(f"C.{k}", r.sim.now())
    r.sim.advance(45)  # booted (30 s), pulling the image (60 s)
    listed = r.provider.list_instances()
    assert [i.id for i in listed] == [str(10001 + k) for k in range(60)]
    assert [i.label for i in listed] == [f"C.{k}" for k in range(60)]
    assert r.api.calls["list"] == 3
    raws = r.provider.last_raw.values()
    assert all(set(raw) == VAST_FIELDS for raw in raws)  # no stage, daemon, bench rate
    assert {raw["actual_status"] for raw in raws} == {"loading"}
    first = r.get("/api/v1/instances/", limit="25").json()
    assert (first["instances_found"], first["total_instances"]) == (25, 60)
    last = r.get("/api/v1/instances/", limit="25", after_token=first["next_token"]).json()
    last = r.get("/api/v1/instances/", limit="25", after_token=last["next_token"]).json()
    assert len(last["instances"]) == 10 and last["next_token"] is None
    assert r.get("/api/v0/instances/").status_code == 410
    assert r.get("/api/v1/instances/", after_token="not-a-cursor").status_code == 400


def test_an_account_without_instances_lists_null_and_reads_as_none() -> None:
    r = rig()
    page = r.get("/api/v1/instances/", limit="25").json()
    assert page["instances"] is None and page["total_instances"] == 0  # as vast may answer
    assert r.provider.list_instances() == []
    iid = launch(r, "C.first")  # a fleet at zero can grow
    assert [i.id for i in r.provider.list_instances()] == [iid]


def test_foreign_instances_are_listed_hold_their_machines_and_never_change() -> None:
    r = rig(machines=5, foreign_instances=3)
    raw = r.raw()
    assert [(v["label"], v["actual_status"], v["intended_status"]) for v in raw.values()] == [
        ("jupyter", "running", "running"), ("", "running", "running"),
        ("old-prover", "exited", "stopped")]  # fmt: skip
    held = {v["machine_id"] for v in raw.values()}
    offers = r.client.search_offers({"order": [["dph_total", "asc"]]})
    assert len(offers) == 2 and not held & {o["machine_id"] for o in offers}
    assert r.sim.world.live_instances() == []  # not fleetgate's: no lifecycle, no tasks
    for label in ("C.a", "C.b"):
        launch(r, label)
    with pytest.raises(PermanentProviderError):  # the other three machines are taken
        r.sim.world.launch("C.c", r.sim.now())
    r.sim.advance(3600)
    assert {k: v for k, v in r.raw().items() if int(k) < 10001} == raw
    r.provider.destroy("9002")
    assert "9002" not in r.raw() and r.sim.stats["foreign_destroyed"] == 1


def test_some_api_labels_are_empty_while_the_containers_keep_theirs() -> None:
    r = rig(machines=40, empty_label_fraction=0.5)
    for k in range(40):
        r.sim.world.launch(f"C.{k}", r.sim.now())
    shown = {i.id: i.label for i in r.provider.list_instances()}
    empty = sorted(iid for iid, label in shown.items() if label == "")
    assert 8 <= len(empty) <= 32
    assert all(shown[i.id] in ("", i.label) and i.label for i in r.sim.world.live_instances())
    twin = rig(machines=40, empty_label_fraction=0.0)
    for k in range(40):
        twin.sim.world.launch(f"C.{k}", twin.sim.now())
    assert all(label for label in (i.label for i in twin.provider.list_instances()))
    assert twin.sim.to_json()["rng"] == r.sim.to_json()["rng"]  # no draw from the world's RNG
    assert twin.sim.world.to_json()["instances"] == r.sim.world.to_json()["instances"]


def test_a_late_create_is_missing_from_list_and_show_until_its_time() -> None:
    r = rig(late_create_s=(120.0, 120.0))
    iid = launch(r, "C.late")
    assert r.provider.list_instances() == [] and r.client.show(iid) is None
    assert r.provider.find_by_label("C.late") is None
    r.sim.advance(110)
    assert r.provider.list_instances() == [] and r.client.show(iid) is None
    r.sim.advance(10)
    assert [i.id for i in r.provider.list_instances()] == [iid]
    assert r.client.show(iid) is not None


def test_search_honours_max_dph_excluded_machines_and_order() -> None:
    r = rig(machines=30)
    taken = r.sim.world.get(r.sim.world.launch("C.x", r.sim.now())).machine_id
    request = LaunchRequest(label="C.y", exclude_machines=frozenset({"1003"}), max_dph=0.6)
    offers = r.client.search_offers(offer_query(r.provider._settings, request))
    free = [m for m in r.sim.world.machines.values() if m.machine_id != taken]
    cheap = [m for m in free if m.dph <= 0.6 and m.machine_id != "m003"]
    assert 0 < len(cheap) < len(free) - 1
    assert sorted(o["machine_id"] for o in offers) == sorted(1000 + int(m.machine_id[1:])
                                                             for m in cheap)  # fmt: skip
    assert [o["dph_total"] for o in offers] == sorted(m.dph for m in cheap)
    assert all(o["id"] == ask_id(f"m{o['machine_id'] - 1000:03d}") for o in offers)
    dear = r.client.search_offers({"order": [["dph_total", "desc"]], "limit": 5})
    assert [o["dph_total"] for o in dear] == sorted((m.dph for m in free), reverse=True)[:5]
    with pytest.raises(PermanentProviderError):  # an unknown operator: vast refuses
        r.client.search_offers({"gpu_name": {"like": "RTX"}})


def test_a_create_boots_through_advance_to_running() -> None:
    r = rig()
    iid = launch(r, "C.boot")
    seen: list[str | None] = []

    def status() -> str | None:
        value: str | None = r.raw()[iid]["actual_status"]
        if not seen or seen[-1] != value:
            seen.append(value)
        return value

    run_until(r, lambda: status() == "running")
    assert seen == [None, "loading", "running"]
    ask = ask_id(r.sim.world.get(iid).machine_id)
    with pytest.raises(OfferGone):  # rented now
        r.client.create(ask, "C.again")
    with pytest.raises(OfferGone):
        r.client.create(123, "C.none")


def test_destroy_reboot_label_and_state_change_what_vast_shows() -> None:
    r = rig(machines=5)
    a, b = launch(r, "C.a"), r.sim.world.launch("C.b", r.sim.now())
    run_until(r, lambda: r.raw()[a]["actual_status"] == "running" == r.raw()[b]["actual_status"])
    r.client.reboot(a)
    assert r.raw()[a]["actual_status"] == "rebooting"
    with pytest.raises(PermanentProviderError):  # vast refuses to stop a rebooting container
        r.client.set_state(a, "stopped")
    r.client.set_label(b, "renamed")
    assert r.raw()[b]["label"] == "renamed" and r.sim.world.get(b).label == "C.b"
    r.sim.advance(70)
    assert r.raw()[a]["actual_status"] == "running"
    r.client.set_state(b, "stopped")
    assert (r.raw()[b]["actual_status"], r.raw()[b]["cur_state"]) == ("stopped", "stopped")
    assert r.sim.world.get(b).sidecar == "down"  # its Curio node is stopped with it
    r.client.set_state(b, "running")
    run_until(r, lambda: r.raw()[b]["actual_status"] == "running", 120)
    r.provider.destroy(a)
    assert a not in r.raw() and r.client.show(a) is None
    r.provider.destroy(a)  # vast does not know it any more: already gone
    assert r.sim.stats["instances_destroyed"] == 1
    with pytest.raises(PermanentProviderError):
        r.client.reboot(a)


def test_every_call_needs_the_key() -> None:
    r = rig(key="wrong-key-0000")
    r.sim.world.launch("C.a", r.sim.now())
    with pytest.raises(SensorError, match="API key"):
        r.provider.list_instances()
    bare = r.session.get(BASE + "/api/v0/instances/10001/")
    assert bare.status_code == 401 and bare.json()["success"] is False
    assert bare.json()["error"] == "auth_error"
    assert r.sim.world.live_instances()[0].id == "10001"
    with pytest.raises(PermanentProviderError, match="API key"):
        r.client.destroy("10001")
    assert len(r.sim.world.live_instances()) == 1


def test_429_and_503_are_retried_by_the_client_and_leave_the_world_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    faulty = rig(vast_429_fraction=0.3, vast_5xx_fraction=0.2)
    clean = rig()
    for r in (faulty, clean):
        for k in range(60):
            r.sim.world.launch(f"C.{k}", r.sim.now())
        r.sim.advance(600)
    for _ in range(3):
        ids = [i.id for i in faulty.provider.list_instances()]
        assert ids == [i.id for i in clean.provider.list_instances()] and len(ids) == 60
    assert faulty.api.calls["list"] > 9 == clean.api.calls["list"]
    retried = " ".join(r.getMessage() for r in caplog.records)
    assert "HTTP 429; retry" in retried and "HTTP 503; retry" in retried
    refused = 0
    while True:  # a mutation answered 503 is not retried (vast may have acted): here it did not
        try:
            faulty.provider.destroy("10005")
            break
        except TemporaryProviderError:
            refused += 1
            assert faulty.sim.world.get("10005") and refused < 10
    assert faulty.client.show("10005") is None and faulty.client.show("10006") is not None
    clean.provider.destroy("10005")
    for r in (faulty, clean):
        r.sim.advance(600)
    assert faulty.sim.world.to_json()["instances"] == clean.sim.world.to_json()["instances"]


def test_wire_faults_look_as_vast_sends_them() -> None:
    r = rig(vast_429_fraction=1.0)
    limited = r.get("/api/v1/instances/")
    assert limited.status_code == 429 and "Retry-After" not in limited.headers
    assert limited.headers["Content-Type"].startswith("text/plain")
    r = rig(vast_truncated_fraction=1.0)
    r.sim.world.launch("C.a", r.sim.now())
    cut = r.get("/api/v1/instances/")
    assert cut.status_code == 200 and cut.text.startswith('{"success": true')
    with pytest.raises(ValueError):
        json.loads(cut.text)
    with pytest.raises(SensorError):  # an unreadable listing is never "no instances"
        r.provider.list_instances()


def test_a_failed_create_rents_nothing_and_a_lost_one_rents_one() -> None:
    failed = rig(create_failed_fraction=1.0)
    with pytest.raises(CreateOutcomeUnknown):
        launch(failed, "C.failed")
    assert failed.sim.world.live_instances() == [] and failed.provider.list_instances() == []
    lost = rig(create_lost_fraction=1.0)
    with pytest.raises(CreateOutcomeUnknown):
        launch(lost, "C.lost")
    assert [i.label for i in lost.sim.world.live_instances()] == ["C.lost"]
    found = lost.provider.find_by_label("C.lost")
    assert found is not None and found.id == lost.sim.world.live_instances()[0].id


def test_a_restored_world_keeps_its_foreign_instances_and_hidden_creates() -> None:
    r = rig(machines=10, foreign_instances=3, late_create_s=(300.0, 300.0), vast_429_fraction=0.2)
    iid = launch(r, "C.late")
    r.sim.advance(100)
    saved = json.loads(json.dumps(r.sim.to_json()))
    before = Counter(r.api.calls)
    back = rig(Simulation.from_json(saved))
    assert back.raw() == r.raw() and iid not in r.raw()
    labels = [back.provider.last_raw[k]["label"] for k in ("9001", "9002", "9003")]
    assert labels == ["jupyter", "", "old-prover"]
    for x in (r, back):
        x.sim.advance(200)
    assert iid in back.raw() and back.raw() == r.raw()
    assert back.api.calls == r.api.calls - before  # the same wire faults, call for call
    assert back.sim.world.to_json() == r.sim.world.to_json()
    old = {**saved, "world": {k: v for k, v in saved["world"].items() if k != "account"}}
    assert [i.id for i in rig(Simulation.from_json(old)).provider.list_instances()] == [iid]


def test_the_account_settings_are_strict() -> None:
    with pytest.raises(pydantic.ValidationError):
        SimConfig(machines=2, foreign_instances=3)
    with pytest.raises(pydantic.ValidationError):
        SimConfig(create_lost_fraction=0.6, create_failed_fraction=0.6)
    with pytest.raises(pydantic.ValidationError):
        SimConfig(late_create_s=(10.0, 5.0))

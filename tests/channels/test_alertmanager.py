"""The Alertmanager channel against a real Alertmanager (and a local receiver for faults).

Needs /usr/bin/prometheus-alertmanager (Debian/Ubuntu: apt-get install -y
prometheus-alertmanager). Without it these tests FAIL, on purpose: CI must install it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import requests
from fakes.receiver import Receiver

from escalation.channels.alertmanager import ALERTNAME, AlertmanagerChannel, label_value
from escalation.channels.base import ChannelError
from escalation.channels.http import HttpClient

from .helpers import VIEW_URL, sample_esc, send

BINARY = os.environ.get("FLEETGATE_ALERTMANAGER", "/usr/bin/prometheus-alertmanager")
CONFIG = """\
route:
  receiver: "null"
  group_wait: 1h
receivers:
  - name: "null"
"""
READY_WITHIN_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Alertmanager on 127.0.0.1 (cluster off, a null receiver); its base URL."""
    if not (shutil.which(BINARY) or Path(BINARY).is_file()):
        pytest.fail(
            f"Alertmanager not found at {BINARY!r}: install it (Debian/Ubuntu: "
            "apt-get install -y prometheus-alertmanager), or set FLEETGATE_ALERTMANAGER to "
            "the binary's path"
        )
    home = tmp_path_factory.mktemp("alertmanager")
    (home / "alertmanager.yml").write_text(CONFIG)
    url = f"http://127.0.0.1:{_free_port()}"
    log = (home / "alertmanager.log").open("wb")
    proc = subprocess.Popen(
        [
            BINARY, f"--config.file={home / 'alertmanager.yml'}", f"--storage.path={home / 'data'}",
            f"--web.listen-address={url.removeprefix('http://')}", "--cluster.listen-address=",
        ],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _wait_ready(url, proc, home / "alertmanager.log")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"Alertmanager exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            if requests.get(url + "/-/ready", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    pytest.fail(f"Alertmanager not ready within {READY_WITHIN_S}s:\n{log.read_text()[-2000:]}")


def alerts(base: str, **params: str) -> list[dict[str, Any]]:
    response = requests.get(
        base + "/api/v2/alerts",
        params={"filter": f'alertname="{ALERTNAME}"', **params},
        timeout=5,
    )
    response.raise_for_status()
    found: list[dict[str, Any]] = response.json()
    return found


def by_id(found: list[dict[str, Any]], esc_id: int) -> list[dict[str, Any]]:
    return [a for a in found if a["labels"].get("escalation_id") == str(esc_id)]


def test_an_escalation_is_an_active_alert_until_resolved(
    alertmanager: str, http: HttpClient, how: dict[str, Any]
) -> None:
    channel = AlertmanagerChannel(alertmanager, labels={"fleet": "test"}, http=http)
    first, other = sample_esc(id=101), sample_esc(id=102, subject="instance:20002")
    send(channel, first, how)
    send(channel, other, how)

    [alert] = by_id(alerts(alertmanager), 101)
    assert alert["status"]["state"] == "active"
    assert alert["labels"] == {
        "alertname": "FleetgateEscalation", "escalation_id": "101", "kind": "unmatched",
        "subject": "instance:10007", "severity": "warning", "fleet": "test",
        "fingerprint": first["fingerprint"], "journal": "journal-1",
    }  # fmt: skip
    notes = alert["annotations"]
    assert (
        notes["summary"]
        == "#101 unmatched instance:10007: Instance 10007 is frozen and no rule covers it."
    )
    assert notes["approve"].startswith("fleetgate escalations approve 12 | curl -X POST")
    assert notes["deny"].startswith("fleetgate escalations deny 12 | curl -X POST")
    assert notes["deadline"] == first["deadline_iso"]
    assert "Approve:  fleetgate escalations approve 12\n" in notes["description"]
    assert alert["generatorURL"] == VIEW_URL  # a GET page, not the POST-only answer
    assert _parse(alert["endsAt"]) == _parse(first["deadline_iso"])
    assert _parse(alert["startsAt"]) == _parse(first["created_at_iso"])

    channel.resolve(dict(first, status="denied"))
    assert by_id(alerts(alertmanager), 101) == []  # ended: Alertmanager lists it no more
    assert by_id(alerts(alertmanager, active="true"), 101) == []
    [still] = by_id(alerts(alertmanager, active="true"), 102)  # another one stays
    assert still["status"]["state"] == "active"


def test_alertmanager_refusing_the_alert_is_a_channel_error_at_once(
    alertmanager: str, http: HttpClient, sleeps: list[float], how: dict[str, Any]
) -> None:
    esc = sample_esc(id=103)
    esc["deadline_iso"] = "2000-01-01T00:00:00Z"  # ends before it starts
    with pytest.raises(
        ChannelError, match=r"escalation 103: POST http://127\.0\.0\.1:\d+/…: HTTP 400"
    ):
        send(AlertmanagerChannel(alertmanager, http=http), esc, how)
    assert sleeps == []


def test_label_values_are_sanitized_and_there_is_no_link_without_an_answer_url(
    rx: Receiver, http: HttpClient, how: dict[str, Any]
) -> None:
    del how["answer_url"], how["view_url"]
    esc = sample_esc(subject="instance:1\n\x07 evil\tlabel " + "x" * 300, kind="stuck")
    send(AlertmanagerChannel(rx.url + "/", severity="critical", http=http), esc, how)
    [request] = rx.requests
    assert request.path == "/api/v2/alerts"
    [alert] = request.json
    labels = alert["labels"]
    assert labels["subject"].startswith("instance:1 evil label xxx")
    assert len(labels["subject"]) == 128
    assert (labels["kind"], labels["severity"]) == ("stuck", "critical")
    assert "generatorURL" not in alert
    assert label_value("") == "-"


def test_503_503_200_is_delivered_and_400_is_not_retried(
    rx: Receiver, http: HttpClient, sleeps: list[float], esc: dict[str, Any], how: dict[str, Any]
) -> None:
    channel = AlertmanagerChannel(rx.url, http=http)
    rx.script([503, 503, 200])
    send(channel, esc, how)
    assert len(rx.requests) == 3
    rx.script([400])
    with pytest.raises(ChannelError, match="HTTP 400"):
        send(channel, esc, how)
    assert len(rx.requests) == 4 and len(sleeps) == 2


def test_a_closed_port_is_a_channel_error(
    closed_url: str, http: HttpClient, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    channel = AlertmanagerChannel(closed_url, http=http)
    with pytest.raises(ChannelError, match="refused"):
        send(channel, esc, how)
    with pytest.raises(ChannelError, match="escalation 12: resolve: .*refused"):
        channel.resolve(esc)


def test_bad_static_labels_are_refused() -> None:
    with pytest.raises(ValueError, match=r"labels \['1bad', 'severity'\]"):
        AlertmanagerChannel("http://127.0.0.1:1", labels={"1bad": "x", "severity": "y", "ok": "z"})
    with pytest.raises(ChannelError, match=r"lacks \['subject', 'fingerprint', 'journal_id'\]"):
        AlertmanagerChannel("http://127.0.0.1:1").resolve({"id": 1, "kind": "k"})


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).replace(microsecond=0)


def test_two_fleets_with_the_same_escalation_id_keep_their_own_alerts(
    alertmanager: str, http: HttpClient, how: dict[str, Any]
) -> None:
    prod = AlertmanagerChannel(alertmanager, fleet="prod", severity="critical", http=http)
    lab = AlertmanagerChannel(alertmanager, labels={"fleet": "lab"}, http=http)
    ours, theirs = sample_esc(id=301, journal_id="j-prod"), sample_esc(id=301, journal_id="j-lab")
    send(prod, ours, how)
    send(lab, theirs, how)
    found = by_id(alerts(alertmanager), 301)
    assert sorted((a["labels"]["fleet"], a["labels"]["journal"], a["labels"]["severity"])
                  for a in found) == [("lab", "j-lab", "warning"),
                                      ("prod", "j-prod", "critical")]  # fmt: skip
    assert all(a["labels"]["fingerprint"] == ours["fingerprint"] for a in found)
    lab.resolve(dict(theirs, status="denied"))  # the lab's answer ends the lab's alert only
    [left] = by_id(alerts(alertmanager, active="true"), 301)
    assert (left["labels"]["fleet"], left["status"]["state"]) == ("prod", "active")


def test_an_escalation_on_the_simulators_clock_arrives_active_in_real_time(
    alertmanager: str, http: HttpClient, how: dict[str, Any]
) -> None:
    virtual = 1_767_225_600.0  # the simulator's start: long before the real now
    esc = sample_esc(now=virtual, id=302, created_at=virtual)
    before = time.time()
    send(AlertmanagerChannel(alertmanager, http=http), esc, how)
    [alert] = by_id(alerts(alertmanager, active="true"), 302)
    assert alert["status"]["state"] == "active"
    starts, ends = _parse(alert["startsAt"]).timestamp(), _parse(alert["endsAt"]).timestamp()
    assert before - 1 <= starts <= time.time() + 1
    assert abs((ends - starts) - 1800) <= 1  # as long as people have to answer
    assert alert["annotations"]["deadline"] == esc["deadline_iso"]  # its own deadline, shown


def test_the_fleet_name_is_configured_once() -> None:
    from escalation.channels.alertmanager import AlertmanagerSettings

    url = "http://127.0.0.1:9093"
    assert AlertmanagerChannel(url).fleet == "fleetgate"
    assert AlertmanagerSettings(url=url, fleet="prod").fleet == "prod"
    with pytest.raises(ValueError, match="disagree: give the fleet's name once"):
        AlertmanagerSettings(url=url, fleet="prod", labels={"fleet": "lab"})
    with pytest.raises(ValueError, match="fleet"):
        AlertmanagerSettings(url=url, fleet="")

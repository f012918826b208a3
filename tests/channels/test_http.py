"""The HTTP seam every channel sends through: retries, refusals, and no leaked secrets."""

from __future__ import annotations

import logging
import time
from email.utils import formatdate

import pytest
import requests
from fakes.receiver import Receiver

from controller.fleet.retry import MAX_RETRY_AFTER_S, retry_after
from escalation.channels.base import ChannelError
from escalation.channels.http import (
    HttpClient,
    post_json,
    redact_url,
    rendered_object,
)

SECRET_PATH = "/services/T000/B000/XXXXsecretXXXX"


def test_a_2xx_answer_is_returned_and_the_body_is_json(rx: Receiver, http: HttpClient) -> None:
    response = http.post_json(rx.url + "/hook", {"a": 1, "text": "é"}, headers={"X-A": "b"})
    assert response.status_code == 200
    [request] = rx.requests
    assert (request.method, request.path, request.json) == ("POST", "/hook", {"a": 1, "text": "é"})
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["X-A"] == "b"


def test_503_503_200_is_delivered_after_two_backed_off_retries(
    rx: Receiver, http: HttpClient, sleeps: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    rx.script([503, 503, 200])
    with caplog.at_level(logging.DEBUG, logger="escalation"):
        http.post_json(rx.url + SECRET_PATH, {"n": 1}, what="channel 'x': escalation 12")
    assert len(rx.requests) == 3
    assert sleeps == [0.25, 0.5]
    assert "channel 'x': escalation 12: POST http://127.0.0.1:" in caplog.text
    assert "HTTP 503 Service Unavailable; retry 1 of 2 in 0.25s" in caplog.text
    assert "secret" not in caplog.text


def test_5xx_and_429_until_the_end_is_a_channel_error_after_the_retries(
    rx: Receiver, http: HttpClient, sleeps: list[float]
) -> None:
    rx.script([500, 429, 502])
    with pytest.raises(ChannelError, match=r"HTTP 502 Bad Gateway \(gave up after 3 attempts\)"):
        http.post_json(rx.url + "/x", {})
    assert len(rx.requests) == 3 and len(sleeps) == 2


def test_retry_after_is_honoured_up_to_a_cap(rx: Receiver, sleeps: list[float]) -> None:
    rx.script([429, 429])
    with requests.Session() as session:
        # the receiver sends no Retry-After; patch one in through a response hook
        def add_retry_after(response: requests.Response, *args: object, **kwargs: object) -> None:
            response.headers["Retry-After"] = "7" if len(rx.requests) == 1 else "3600"

        session.hooks["response"].append(add_retry_after)
        post_json(session, rx.url, {}, timeout_s=2, retries=2, backoff_s=0.1, sleep=sleeps.append)
    assert sleeps == [7.0, MAX_RETRY_AFTER_S]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 422])
def test_a_4xx_is_a_channel_error_at_once(
    rx: Receiver, http: HttpClient, sleeps: list[float], status: int
) -> None:
    rx.script([status])
    rx.body = b"invalid_payload"
    with pytest.raises(ChannelError, match=rf"POST http://127\.0\.0\.1:\d+/…: HTTP {status} "):
        http.post_json(rx.url + SECRET_PATH, {})
    assert len(rx.requests) == 1 and sleeps == []


def test_the_refusal_quotes_the_answer_without_secrets(rx: Receiver, http: HttpClient) -> None:
    rx.script([400])
    rx.body = b'{"message": "bad routing key R0UT1NGKEY for /services/T000/B000/XXXXsecretXXXX"}'
    with pytest.raises(ChannelError) as caught:
        http.post_json(
            rx.url + SECRET_PATH, {}, headers={"Authorization": "Bearer T0K3N"},
            secrets=["R0UT1NGKEY"],
        )  # fmt: skip
    message = str(caught.value)
    assert 'bad routing key *** for ***"}' in message
    assert "R0UT1NGKEY" not in message and "secret" not in message


def test_a_redirect_is_not_followed(rx: Receiver, http: HttpClient) -> None:
    rx.script([302])
    with pytest.raises(ChannelError, match="HTTP 302"):
        http.post_json(rx.url + "/moved", {})
    assert len(rx.requests) == 1


def test_a_closed_port_is_a_channel_error_after_the_retries(
    closed_url: str, http: HttpClient, sleeps: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    refused = r"ConnectionError: \[Errno 111\] Connection refused"
    with caplog.at_level(logging.INFO), pytest.raises(ChannelError, match=refused) as caught:
        http.post_json(closed_url + SECRET_PATH + "?token=QUERYSECRET", {})
    assert "gave up after 3 attempts" in str(caught.value)
    assert len(sleeps) == 2
    for text in (str(caught.value), caplog.text):
        assert "secret" not in text.lower() and "services" not in text
    assert caught.value.__cause__ is None  # requests' own error holds the full URL


@pytest.mark.parametrize("url", ["not a url", "ftp://127.0.0.1/x", "http://"])
def test_a_malformed_url_is_a_channel_error_at_once(
    http: HttpClient, sleeps: list[float], url: str
) -> None:
    with pytest.raises(ChannelError, match=r"^POST .*: (MissingSchema|InvalidSchema|InvalidURL)$"):
        http.post_json(url, {})
    assert sleeps == []


def test_a_slow_answer_times_out_and_is_retried(rx: Receiver, sleeps: list[float]) -> None:
    rx.delay_s = 1.0
    with requests.Session() as session, pytest.raises(ChannelError, match="timed out"):
        post_json(session, rx.url, {}, timeout_s=0.2, retries=1, backoff_s=0, sleep=sleeps.append)
    assert len(rx.requests) == 2


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://hooks.slack.com/services/T0/B0/secret", "https://hooks.slack.com/…"),
        ("https://user:pw@example.com:8443/x?k=v", "https://example.com:8443/…"),
        ("https://ntfy.sh", "https://ntfy.sh/"),
        ("https://ntfy.sh/", "https://ntfy.sh/"),
        ("http://example.com/?token=abc", "http://example.com/…"),
        ("http://[::1]:9093/api/v2/alerts", "http://[::1]:9093/…"),
        ("http://example.com:notaport/", "(unparseable URL)"),
    ],
)
def test_redact_url_keeps_scheme_host_and_port_only(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_bad_client_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        HttpClient(timeout_s=0)
    with pytest.raises(ValueError, match="retries=-1"):
        HttpClient(retries=-1)


def test_rendered_object_explains_bad_json() -> None:
    assert rendered_object('{"a": 1}', what="w", template="t.j2") == {"a": 1}
    with pytest.raises(ChannelError, match=r"w: template 't\.j2' did not produce JSON: .*line 1"):
        rendered_object('{"a": 1,}', what="w", template="t.j2")
    with pytest.raises(ChannelError, match=r"template 't\.j2' produced list, not a JSON object"):
        rendered_object("[1]", what="w", template="t.j2")


def _asking(value: str) -> requests.Response:
    response = requests.Response()
    response.status_code = 429
    response.headers["Retry-After"] = value
    return response


WALL = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("7", 7.0),
        (" 120 ", 120.0),
        ("Wed, 21 Oct 2015 07:29:30 GMT", 90.0),  # RFC 9110's IMF-fixdate
        ("Wednesday, 21-Oct-15 07:29:30 GMT", 90.0),  # the obsolete RFC 850 form
        ("Wed Oct 21 07:29:30 2015", 90.0),  # asctime's form, GMT as every HTTP date
        ("Wed, 21 Oct 2015 07:00:00 GMT", 0.0),  # a date gone by asks for no wait
        ("-1", None),
        ("nan", None),
        ("soon", None),
        ("", None),
    ],
)
def test_retry_after_is_seconds_or_an_http_date(value: str, seconds: float | None) -> None:
    """RFC 9110 gives Retry-After as seconds or as a date; a date was read as none, and a
    server asking for 90 s got a retry after the backoff's fraction of a second."""
    assert retry_after(_asking(value), wall=lambda: WALL) == seconds


def test_a_retry_after_date_is_waited_for(rx: Receiver, sleeps: list[float]) -> None:
    rx.script([503])
    with requests.Session() as session:

        def add_date(response: requests.Response, *args: object, **kwargs: object) -> None:
            response.headers["Retry-After"] = formatdate(time.time() + 20, usegmt=True)

        session.hooks["response"].append(add_date)
        post_json(session, rx.url, {}, timeout_s=2, retries=2, backoff_s=0.1, sleep=sleeps.append)
    assert len(sleeps) == 1 and 18.0 <= sleeps[0] <= 21.0

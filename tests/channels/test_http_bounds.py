"""A far end that trickles its answer or floods it holds no channel and no LLM call past its
bound, and what it echoes back of a secret is taken out, in whatever form it echoes it."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import requests

from escalation.channels.base import ChannelError
from escalation.channels.http import HttpClient

Reply = Callable[[socket.socket], None]


@contextmanager
def raw_server(reply: Reply) -> Iterator[str]:
    """A loopback server that reads a request and answers it with `reply`, as raw bytes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(65536)
                    reply(conn)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def trickle(status: str, body: bytes, every_s: float) -> Reply:
    def reply(conn: socket.socket) -> None:
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        for i in range(len(body)):
            conn.sendall(body[i : i + 1])
            time.sleep(every_s)

    return reply


def flood(status: str, size: int) -> Reply:
    def reply(conn: socket.socket) -> None:
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Length: {size}\r\n\r\n".encode())
        chunk = b"x" * 65536
        for _ in range(size // len(chunk)):
            conn.sendall(chunk)

    return reply


def echo(status: str, text: str) -> Reply:
    def reply(conn: socket.socket) -> None:
        body = text.encode()
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)

    return reply


def test_a_trickling_endpoint_is_a_failed_attempt_within_twice_the_timeout() -> None:
    """503 and a 100-byte body a byte every 0.2 s: each read is within the timeout, so the
    send took as long as the trickle (75 s for 100 kB at a byte a second)."""
    with raw_server(trickle("503 Service Unavailable", b"x" * 100, 0.2)) as url:
        http = HttpClient(timeout_s=0.5, retries=1, backoff_s=0, sleep=lambda s: None)
        started = time.monotonic()
        with pytest.raises(ChannelError, match=r"the response took over 1 s to arrive \(gave up"):
            http.post_json(url + "/hook", {"a": 1})
        assert time.monotonic() - started < 10  # two attempts of about 1 s, not 40 s


@pytest.mark.parametrize("reply", [
    lambda: trickle("200 OK", b"x" * 100, 0.2),
    lambda: cut_off("200 OK", b"ok", 100),
    lambda: cut_off("202 Accepted", b"{", 100, 3.0),
    lambda: flood("200 OK", 1024 * 1024),
])  # fmt: skip
def test_a_2xx_whose_body_goes_wrong_is_delivered_once(
    reply: Callable[[], Reply], caplog: pytest.LogCaptureFixture
) -> None:
    """The far end took the message (a 2xx) and the body after it trickled, broke off or
    flooded: it was sent again, and a webhook or a Slack channel got it twice or three times."""
    calls: list[int] = []
    inner = reply()

    def counted(conn: socket.socket) -> None:
        calls.append(1)
        inner(conn)

    with raw_server(counted) as url:
        http = HttpClient(timeout_s=0.5, retries=2, backoff_s=0, sleep=lambda s: None)
        response = http.post_json(url + "/hooks/s3cr3t", {"a": 1})
    assert response.status_code in (200, 202) and len(calls) == 1
    assert "taken as delivered, not sent again" in caplog.text and "s3cr3t" not in caplog.text


def cut_off(status: str, sent: bytes, promised: int, stall_s: float = 0.0) -> Reply:
    """Headers that promise `promised` bytes, `sent` of them, then a stall or a closed socket
    (what a proxy or load balancer in front of the far end does when it drops a connection)."""

    def reply(conn: socket.socket) -> None:
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Length: {promised}\r\n\r\n".encode() + sent)
        time.sleep(stall_s)

    return reply


@pytest.mark.parametrize(("stall_s", "why"), [
    (0.0, r"the response broke off \(ProtocolError\)"),
    (3.0, r"the response stopped arriving \(timed out\)"),
])  # fmt: skip
def test_a_body_cut_off_or_stalled_is_a_failed_attempt_tried_again(
    stall_s: float, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    """urllib3, not requests, raises while the body is read: it escaped the retries as an
    unexpected exception instead of a ChannelError."""
    sleeps: list[float] = []
    with raw_server(cut_off("503 Service Unavailable", b"busy", 100, stall_s)) as url:
        http = HttpClient(timeout_s=0.5, retries=1, backoff_s=0.25, sleep=sleeps.append)
        with pytest.raises(ChannelError, match=r"\(gave up after 2 attempts\)") as caught:
            http.post_json(url + "/hooks/s3cr3t", {"a": 1})
    assert sleeps == [0.25] and "s3cr3t" not in str(caught.value)
    assert re.search(why + "; retry 1 of 1", caplog.text), caplog.text


def test_a_flooding_endpoint_is_read_no_further_than_the_bound() -> None:
    with raw_server(flood("400 Bad Request", 64 * 1024 * 1024)) as url:
        http = HttpClient(timeout_s=5, retries=0, backoff_s=0, sleep=lambda s: None)
        with pytest.raises(ChannelError, match=r"the response is over 65536 bytes"):
            http.post_json(url + "/hook", {"a": 1})


@pytest.mark.parametrize("form", [
    lambda p: json.dumps({"path": p}).replace("/", "\\/"),  # PHP's json_encode
    lambda p: requests.utils.quote(p, safe=""),  # percent-encoded
    lambda p: "x" * 190 + p,  # echoed across the 200 characters quoted
])  # fmt: skip
def test_a_secret_echoed_in_a_refusal_is_taken_out_in_the_form_it_comes_back(
    form: Callable[[str], str],
) -> None:
    path = "/hooks/T0ABC/B0DEF/s3cr3tW3bh00kT0k3n"
    with raw_server(echo("400 Bad Request", form(path))) as url:
        http = HttpClient(timeout_s=5, retries=0, backoff_s=0, sleep=lambda s: None)
        with pytest.raises(ChannelError) as caught:
            http.post_json(url + path, {"a": 1})
    text = str(caught.value)
    assert "s3cr3t" not in text and "T0ABC" not in text and "***" in text, text

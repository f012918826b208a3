"""Shared pieces for the channel tests: a sample escalation, the ways to answer it, a recording
HTTP receiver, a closed port, an HTTP client that does not really sleep."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from fakes.receiver import Receiver

from escalation.channels.http import HttpClient

from .helpers import ANSWER_URL, VIEW_URL, sample_esc


@pytest.fixture
def esc() -> dict[str, Any]:
    return sample_esc()


@pytest.fixture
def make_esc() -> Callable[..., dict[str, Any]]:
    return sample_esc


@pytest.fixture
def how() -> dict[str, Any]:
    return {
        "approve_cli": "fleetgate escalations approve 12",
        "deny_cli": "fleetgate escalations deny 12",
        "approve_http": f'curl -X POST -d \'{{"decision":"approve"}}\' {ANSWER_URL}',
        "deny_http": f'curl -X POST -d \'{{"decision":"deny"}}\' {ANSWER_URL}',
        "answer_url": ANSWER_URL,
        "view_url": VIEW_URL,
    }


@pytest.fixture
def rx() -> Iterator[Receiver]:
    with Receiver() as receiver:
        yield receiver


@pytest.fixture
def sleeps() -> list[float]:
    """The waits the HTTP client asked for (it does not really sleep)."""
    return []


@pytest.fixture
def http(sleeps: list[float]) -> Iterator[HttpClient]:
    with requests.Session() as session:
        yield HttpClient(session=session, timeout_s=2.0, retries=2, backoff_s=0.25,
                         sleep=sleeps.append)  # fmt: skip


@pytest.fixture
def closed_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (a port just released)."""
    with Receiver() as receiver:
        url = receiver.url
    return url

"""Shared sample escalations for the escalation tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support import sample_esc


@pytest.fixture
def esc() -> dict[str, Any]:
    return sample_esc()


@pytest.fixture
def make_esc() -> Callable[..., dict[str, Any]]:
    """sample_esc, for tests that change some keys."""
    return sample_esc


@pytest.fixture
def how() -> dict[str, Any]:
    return {
        "approve_cli": "fleetgate escalations approve 12",
        "deny_cli": "fleetgate escalations deny 12",
    }

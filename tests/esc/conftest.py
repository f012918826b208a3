"""Shared sample escalations for the escalation tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def sample_esc(**changes: Any) -> dict[str, Any]:
    """A typical escalation dict, as the templates and channels receive it."""
    esc: dict[str, Any] = {
        "id": 12,
        "kind": "unmatched",
        "subject": "instance:10007",
        "summary": "Instance 10007 is frozen and no rule covers it.",
        "fingerprint": "1a2b3c4d5e6f7a8b",
        "created_at_iso": "2024-05-01T12:00:00Z",
        "deadline_iso": "2024-05-01T12:30:00Z",
        "default_action": {"action": "hold", "params": {"reason": "nobody answered"}},
        "proposals": [
            {
                "action": "replace_instance",
                "params": {"instance": "10007"},
                "proposer": "llm:qwen",
                "confidence": 0.42,
                "reason": "frozen for 20 min after a reboot",
            }
        ],
        "facts": [{"type": "instance", "id": "10007", "status": "frozen", "label": "fg a1"}],
        "recent_actions": [
            {
                "at": 1714564800.0,
                "action": "reboot",
                "params": {"instance": "10007"},
                "status": "ok",
                "proposer": "rule:frozen-reboot",
            }
        ],
        "fleet": {"running": 10, "frozen": 1, "spend_per_h": 4.5, "pending_tasks": 30},
        "budget": {"spend_left_per_h": 5.5, "launches_left_1h": 3},
        "allowed_actions": ["hold", "reboot", "replace_instance"],
    }
    esc.update(changes)
    return esc


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

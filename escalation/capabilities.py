"""Per-escalation answer capabilities: what a message button may carry instead of the token.

Kept apart from `controller.service.api` so the escalation side can mint them without importing the
web framework.
"""

from __future__ import annotations

import hashlib
import hmac

from pydantic import SecretStr


def answer_capability(token: SecretStr, esc_id: int) -> str:
    """A bearer value that can answer escalation `esc_id` and nothing else."""
    key = token.get_secret_value().encode()
    return hmac.new(key, f"fleetgate-answer:{esc_id}".encode(), hashlib.sha256).hexdigest()

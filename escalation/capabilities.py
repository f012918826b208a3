"""Per-escalation answer capabilities: what a message button may carry instead of the token.

A capability names one journal (its `journal_id`), one escalation of it, one choice (`approve`
runs the proposal the message showed, `deny` denies) and the escalation's deadline, after which
it no longer answers. It carries no action, parameters or overrides: those need the operator's
token. Written `<choice>.<expires>.<hmac>`, so a check needs only the key and the journal.

Kept apart from `controller.service.api` so the escalation side can mint them without importing the
web framework.
"""

from __future__ import annotations

import hashlib
import hmac

from pydantic import SecretStr

CHOICES = ("approve", "deny")


def _mac(token: SecretStr, journal_id: str, esc_id: int, choice: str, expires: int) -> str:
    key = token.get_secret_value().encode()
    msg = f"fleetgate-answer:v2:{journal_id}:{esc_id}:{choice}:{expires}".encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def answer_capability(
    token: SecretStr, esc_id: int, *, journal_id: str, choice: str, expires: float
) -> str:
    """A bearer value that can answer escalation `esc_id` of journal `journal_id` with `choice`
    until `expires` (epoch seconds), and nothing else."""
    if choice not in CHOICES:
        raise ValueError(f"a capability's choice is one of {', '.join(CHOICES)}, not {choice!r}")
    exp = int(expires)
    return f"{choice}.{exp}.{_mac(token, journal_id, esc_id, choice, exp)}"


def check_capability(token: SecretStr, given: str, *, journal_id: str, esc_id: int
                     ) -> tuple[str, int] | None:  # fmt: skip
    """(choice, expires) if `given` is a capability of this journal's escalation `esc_id`."""
    choice, _, rest = given.partition(".")
    exp, _, mac = rest.partition(".")
    if choice not in CHOICES or not exp.isdigit() or len(exp) > 12:
        return None
    expected = _mac(token, journal_id, esc_id, choice, int(exp))
    if not hmac.compare_digest(mac.encode(), expected.encode()):
        return None
    return choice, int(exp)

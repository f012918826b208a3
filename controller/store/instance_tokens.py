"""Each instance's own secret: issued at its launch, bound to its launch label (and, once vast
lists it, its vast id), and what the instance API authenticates every call with.

The secret is random (32 bytes), handed to the instance once, in its environment at create
(`FLEETGATE_INSTANCE_TOKEN`), and never stored: the journal keeps its SHA-256 only (a random
256-bit secret needs no slow hash). A row here is also the proof that fleetgate launched the
label: the instance API registers no label without one. The row goes with the instance's other
records (`LifecycleStore.forget`), and the token stops working then.

This module must NOT do HTTP, read the clock (every `now` is passed in) or log a secret.
"""

from __future__ import annotations

import hashlib
import secrets

from controller.store.aggregate import Aggregate
from controller.store.backend import Store, statements

TOKEN_ENV = "FLEETGATE_INSTANCE_TOKEN"  # how the instance's agent receives its own token

SCHEMA = """
CREATE TABLE IF NOT EXISTS instance_tokens (
  label TEXT PRIMARY KEY, token_hash TEXT NOT NULL UNIQUE, vast_id TEXT,
  issued_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS instance_tokens_vast ON instance_tokens(vast_id);
"""


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class InstanceTokens(Aggregate):
    """Launch label -> the hash of its instance's token (and its vast id once known)."""

    SCHEMA = SCHEMA

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        store.create(statements(SCHEMA))

    def issue(self, label: str, now: float) -> str:
        """A new token for the launch `label` (DuplicateKey if the label has one): the secret,
        returned once, for the instance's environment."""
        token = secrets.token_urlsafe(32)
        with self.tx() as db:
            db.execute(
                "INSERT INTO instance_tokens(label, token_hash, issued_at) VALUES (?, ?, ?)",
                (label, token_hash(token), now),
            )
        return token

    def label_for(self, token: str) -> str | None:
        """The one launch label whose token this is, or None."""
        if not token:
            return None
        row = self._one("SELECT label FROM instance_tokens WHERE token_hash = ?",
                        (token_hash(token),))  # fmt: skip
        return str(row["label"]) if row else None

    def launched(self, label: str) -> bool:
        """True when fleetgate issued a token for this launch label (and it is not forgotten)."""
        return self._one("SELECT 1 FROM instance_tokens WHERE label = ?", (label,)) is not None

    def vast_id(self, label: str) -> str | None:
        row = self._one("SELECT vast_id FROM instance_tokens WHERE label = ?", (label,))
        return str(row["vast_id"]) if row and row["vast_id"] is not None else None

    def bind(self, label: str, vast_id: str) -> None:
        """The vast id the launch got (from the create, or the first listing); set once."""
        with self.tx() as db:
            db.execute(
                "UPDATE instance_tokens SET vast_id = ? WHERE label = ? AND vast_id IS NULL",
                (vast_id, label),
            )

    def revoke(self, label: str) -> None:
        """The label's token stops working (its instance is gone, or was never created)."""
        with self.tx() as db:
            db.execute("DELETE FROM instance_tokens WHERE label = ?", (label,))

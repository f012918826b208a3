"""The leader lease: of several controllers sharing one journal, exactly one acts.

A row in the journal's `leases` table names the holder, a fencing token and when the lease
expires, by the store's own clock (PostgreSQL's when shared, so controllers on different hosts
never compare their clocks). The holder renews it well before it expires; when it stops
renewing (it died, or lost its database), another controller takes the lease over once it has
expired and gets the next token. While a process leads, the journal's `actions.fence` carries
its token and every action it records is checked against the lease in the same transaction
(`Actions.record`): a controller whose lease was taken over, or ran out, acts on nothing.
Once it has led, the fence stays set (on the lost term) until the lease is released, so a
tick still running when the loss is noticed is refused too.

A term runs `ttl_s` minus a takeover slack past each renewal, and a standby tries again just
after it ends, so a dead leader is replaced within `ttl_s` of its death, not `ttl_s` plus a poll.

A lease never runs longer than its holder's `ttl_s` (kept in the row) from now: a row whose
expiry lies further ahead (the clock it was written by has since stepped back, say by two hours
after a crash) is implausible and counts as expired, so a dead holder's lease cannot outlive
its TTL whatever the wall clock did; a live holder simply renews it at its next renewal.

The provider cannot check a token itself, so a leader also stops acting while its lease has
less than `margin_s` left: an action recorded then could still be running when a successor
takes over.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controller.store.actions import Fence
from controller.store.backend import DuplicateKey

if TYPE_CHECKING:
    from controller.store.journal import Journal

log = logging.getLogger(__name__)

LEADER = "leader"
TAKEOVER_SLACK_S = 0.25  # at most a tenth of the TTL: a standby's wake-up and transaction
PLAUSIBLE_SLACK_S = 1.0  # beyond now + ttl_s + this, an expiry is implausible (a clock step)

SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
  name TEXT PRIMARY KEY, holder TEXT NOT NULL, token INTEGER NOT NULL, acquired_at REAL NOT NULL,
  expires_at REAL NOT NULL, ttl_s REAL
);
"""
COLUMNS = (("leases", "ttl_s", "REAL"),)  # added since the table first shipped


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class LeaseState:
    """Who holds the lease, as the store sees it now."""

    holder: str | None
    token: int
    expires_in_s: float  # negative: expired that long ago
    implausible: bool = False  # its expiry lies beyond now + ttl: the clock stepped back
    expires_at: float = 0.0  # by the store's clock: a renewal moves it

    @property
    def live(self) -> bool:
        return self.holder is not None and self.expires_in_s > 0 and not self.implausible

    def as_dict(self) -> dict[str, Any]:
        shown = {"holder": self.holder, "token": self.token,
                 "expires_in_s": round(self.expires_in_s, 1), "live": self.live}  # fmt: skip
        if self.implausible:
            shown["implausible"] = True
        return shown


def plausible(expires_in_s: float, ttl_s: float | None) -> bool:
    """Whether a lease with `expires_in_s` left can be one granted for `ttl_s` at most."""
    return ttl_s is None or expires_in_s <= ttl_s + PLAUSIBLE_SLACK_S


class Lease:
    """One controller's side of the lease: acquire, renew, release."""

    def __init__(self, journal: Journal, holder: str | None = None, *, ttl_s: float = 15.0,
                 margin_s: float = 2.0, name: str = LEADER) -> None:  # fmt: skip
        if not 0 <= margin_s < ttl_s:
            raise ValueError(f"lease margin_s {margin_s} must be below ttl_s {ttl_s}")
        self.journal, self.name = journal, name
        self.holder = holder or default_holder()
        self.ttl_s, self.margin_s = ttl_s, margin_s
        self.token: int | None = None  # set while leading
        self.term_s = ttl_s - min(TAKEOVER_SLACK_S, ttl_s / 10)  # how long a renewal holds
        if not getattr(journal.store, "read_only", False):
            for table, column, decl in COLUMNS:
                journal.store.add_column(table, column, decl)

    @property
    def leading(self) -> bool:
        return self.token is not None

    def renew(self) -> bool:
        """Take the lease if free or expired, or extend ours. True if we lead now."""
        try:
            token = self._acquire()
        except DuplicateKey:  # another controller created the row in the same instant
            token = None
        was = self.token
        self.token = token
        if token is not None:
            self.journal.actions.fence = Fence(self.name, self.holder, token)
        elif was is not None:
            # a tick may still be under way (this thread learns of the loss first): it keeps
            # the lost term's fence, which the store refuses, never no fence, which it would
            # not check
            self.journal.actions.fence = Fence(self.name, self.holder, was)
        if token is not None and was != token:
            log.info("leading as %s (lease %r, token %d, ttl %.0f s)", self.holder,
                        self.name, token, self.ttl_s)  # fmt: skip
        elif token is None and was is not None:
            log.warning("lost the lease %r (token %d): standing by", self.name, was)
        return token is not None

    def _acquire(self) -> int | None:
        with self.journal.tx() as db:
            now = db.clock()
            row = db.execute("SELECT * FROM leases WHERE name = ?" + db.lock_rows,
                             (self.name,)).fetchone()  # fmt: skip
            if row is None:
                db.execute("INSERT INTO leases(name, holder, token, acquired_at, expires_at, "
                           "ttl_s) VALUES (?, ?, 1, ?, ?, ?)",
                           (self.name, self.holder, now, now + self.term_s,
                            self.ttl_s))  # fmt: skip
                return 1
            state = _state(row, now, self.ttl_s)
            if state.implausible:
                log.warning("lease %r: held by %s for %.0f s more, longer than its ttl: the "
                            "clock stepped back; treated as expired", self.name, state.holder,
                            state.expires_in_s)  # fmt: skip
            if state.live and state.holder == self.holder and state.token == self.token:
                db.execute("UPDATE leases SET expires_at = ?, ttl_s = ? WHERE name = ?",
                           (now + self.term_s, self.ttl_s, self.name))  # fmt: skip
                return self.token
            if state.live:
                return None  # someone else leads (or an earlier term of ours, not renewed)
            token = state.token + 1
            db.execute("UPDATE leases SET holder = ?, token = ?, acquired_at = ?, expires_at = ?, "
                       "ttl_s = ? WHERE name = ?", (self.holder, token, now, now + self.term_s,
                                                    self.ttl_s, self.name))  # fmt: skip
            return token

    def may_act(self) -> bool:
        """Leading, with more than `margin_s` of the lease left (by the store's clock)."""
        if self.token is None:
            return False
        state = read(self.journal, self.name, ttl_s=self.ttl_s)
        return (state.live and state.holder == self.holder and state.token == self.token
                and state.expires_in_s > self.margin_s)  # fmt: skip

    def release(self) -> None:
        """Give the lease up at once (a clean stop), so a standby need not wait out the TTL."""
        if self.token is None:
            return
        with self.journal.tx() as db:
            db.execute("UPDATE leases SET expires_at = ? WHERE name = ? AND holder = ? AND "
                       "token = ?", (db.clock(), self.name, self.holder, self.token))  # fmt: skip
        log.info("released the lease %r (token %d)", self.name, self.token)
        self.token = None
        self.journal.actions.fence = None


def read(journal: Journal, name: str = LEADER, *, ttl_s: float | None = None) -> LeaseState:
    """The lease as the store sees it now; one running longer than its holder's TTL (or, for
    a row written before the TTL was kept, than `ttl_s`) is implausible."""
    with journal.tx() as db:
        now = db.clock()
        row = db.execute("SELECT * FROM leases WHERE name = ?", (name,)).fetchone()
    if row is None:
        return LeaseState(None, 0, 0.0)
    return _state(row, now, ttl_s)


def _state(row: dict[str, Any], now: float, ttl_s: float | None) -> LeaseState:
    left = float(row["expires_at"]) - now
    kept = row.get("ttl_s")
    bound = float(kept) if kept is not None else ttl_s
    return LeaseState(str(row["holder"]), int(row["token"]), left, not plausible(left, bound),
                      float(row["expires_at"]))  # fmt: skip

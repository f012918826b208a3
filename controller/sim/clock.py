"""A virtual clock: the simulator's only notion of time.

No wall clock here: time moves only when `advance` is called.
"""

from __future__ import annotations


class VirtualClock:
    """Epoch seconds that move forward only on request."""

    def __init__(self, start: float) -> None:
        self._now = float(start)

    def now(self) -> float:
        """The current virtual time, epoch seconds."""
        return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by `seconds` (>= 0) and return the new time."""
        if seconds < 0:
            raise ValueError(f"cannot move the clock backwards by {seconds!r} s")
        self._now += seconds
        return self._now

    def set(self, when: float) -> None:
        """Jump forward to `when` (used by the simulation's sub-steps)."""
        if when < self._now:
            raise ValueError(f"cannot move the clock back from {self._now!r} to {when!r}")
        self._now = float(when)

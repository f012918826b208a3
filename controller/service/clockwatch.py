"""The controller's clock: the wall clock, kept continuous across steps of it.

Ages, cooldowns and deadlines are differences of wall-clock times the journal holds, so a
step of the wall clock (an NTP correction, a VM restored, an operator's `date -s`) would age
every instance at once (+2 h: every booting instance "stuck") or freeze them (-2 h). Between
two ticks of one process the wall clock should advance as the monotonic clock does; `check`
compares them at each tick's start:

- the wall clock went back by more than `BACK_TOLERANCE_S`, or ahead of the monotonic clock
  by more than `FORWARD_TOLERANCE_S`: a **jump**. The controller's time (`now()`) goes on from
  where it was by the monotonic clock (the step is absorbed into `offset`), and the jump is
  reported: the tick holds and people are told;
- on a process's first tick there is no monotonic reading to compare with; a wall clock behind
  the journal's last tick is a jump back, and the controller's time resumes at that tick.

The offset lasts for the life of the process: after restarting, the controller takes the wall
clock as it is (a forward step during downtime cannot be told from the downtime itself).

Pure apart from the two clocks it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

BACK_TOLERANCE_S = 1.0  # smaller steps back are NTP's ordinary corrections
FORWARD_TOLERANCE_S = 30.0  # the wall clock running ahead of the monotonic one by more: a step


@dataclass(frozen=True)
class Jump:
    """A step of the wall clock: `by_s` seconds (negative: back)."""

    by_s: float
    wall: float  # the wall clock when it was seen
    reference: str  # what it was measured against: "monotonic clock", "journal's last tick"

    def describe(self, offset_s: float) -> str:
        """What happened and what to do. A restart takes a wall clock that went forward as it
        is, but not one that went back: a restarted controller resumes from the journal's last
        tick (and holds its first tick again), so a step back is never told to restart."""
        seen = (f"the wall clock jumped {'back' if self.by_s < 0 else 'forward'} by "
                f"{abs(self.by_s):.0f} s (measured against the {self.reference}); this tick "
                "acted on nothing, and the controller keeps its own time continuous "
                f"({offset_s:+.0f} s from the wall clock)")  # fmt: skip
        if self.by_s < 0:
            return (f"{seen}, also after a restart, which resumes from the journal's last tick: "
                    "check the host's time synchronisation; ticks go on acting from the next "
                    "one")  # fmt: skip
        return (f"{seen} until it is restarted: check the host's time synchronisation, then "
                "restart it to take the wall clock as it is")  # fmt: skip


class ClockWatch:
    """`now()` (also its call) is the controller's time; `check()` at each tick's start."""

    def __init__(self, wall: Callable[[], float], monotonic: Callable[[], float]) -> None:
        self.wall, self.monotonic = wall, monotonic
        self.offset = 0.0  # wall minus the controller's time
        self._last: tuple[float, float] | None = None  # (controller time, monotonic) last tick

    @property
    def fresh(self) -> bool:
        """No tick was checked yet in this process (the journal's last tick is the reference)."""
        return self._last is None

    def __call__(self) -> float:
        return self.now()

    def now(self) -> float:
        return self.wall() - self.offset

    def check(self, last_tick: float | None) -> Jump | None:
        """Compare the clocks at a tick's start (`last_tick`: when the journal's last tick
        started); a jump, if one happened, already absorbed into `offset`."""
        wall, mono = self.wall(), self.monotonic()
        jump = None
        if self._last is None:
            if last_tick is not None and wall - self.offset < last_tick - BACK_TOLERANCE_S:
                jump = Jump(wall - self.offset - last_tick, wall, "journal's last tick")
        else:
            expected = self._last[0] + (mono - self._last[1])
            drift = wall - self.offset - expected
            if drift < -BACK_TOLERANCE_S or drift > FORWARD_TOLERANCE_S:
                jump = Jump(drift, wall, "monotonic clock")
        if jump is not None:
            self.offset += jump.by_s
        self._last = (wall - self.offset, mono)
        return jump

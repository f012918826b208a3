"""The garbage collector's settings for a process that ticks over a large fleet.

A tick builds and drops tens of thousands of small containers at 10,000 instances (a fact, a
track and an observed instance each, the engine's copies): with CPython's default young
threshold of 700 that is about 94 young collections a tick and a full one nearly every tick,
25-37 ms a tick in the collector (BENCHMARKS.md). Nearly all of it is freed by reference
counting, not by the collector, so it is collected less often (about 10 ms a tick), and what
was imported before the command runs is frozen out of every collection. Cycles are still
found: only later.
"""

from __future__ import annotations

import gc

YOUNG = 10_000  # allocations between young collections (CPython's default: 700)
OLDER = 10  # young collections per middle one, middle ones per full one (the defaults)


_done = False


def tune() -> None:
    """Set the thresholds and freeze what exists now; once a process (later calls do nothing)."""
    global _done
    if _done:
        return
    _done = True
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, OLDER, OLDER)

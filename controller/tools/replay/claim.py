"""One `simulate` at a time per report directory.

A run starts by deleting the journal and the trace in REPORT/state (a new world), so a second
run given the same directory deleted them under the first, which went on ticking a journal no
longer there and printed figures that were not its trace's (tens of thousands of misses, as if
no task had run). The run holds an exclusive `flock` on REPORT/.lock from before it deletes
anything until its report is written; the system drops it when the process ends, however it
ends, so a run that crashed leaves nothing to clean up.
"""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import IO

LOCK = ".lock"


class ReportInUse(Exception):
    """Another run holds the report directory."""


def claim_report(out: Path) -> IO[bytes]:
    """The open lock file of `out` (created if missing), locked; closing it lets the next run
    in. Raises `ReportInUse` while another run holds it, `OSError` where it cannot be made."""
    out.mkdir(parents=True, exist_ok=True)
    lock = (out / LOCK).open("ab")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ReportInUse(
            f"{out} is in use by another simulate run (its journal would be deleted under "
            "it): wait for it, or give this run its own --report DIR"
        ) from None
    return lock

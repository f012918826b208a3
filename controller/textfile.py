"""The operator's text files (config, rules, secret files), read with a bound.

A path is input like any other: `/dev/zero`, a FIFO or a multi-gigabyte file named as the
config or a secret would otherwise be read until memory runs out, or block for ever. Only a
regular file is read, and at most `limit` bytes of it; a larger one is an error that says so.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from pathlib import Path

MIB = 1024 * 1024


class TooLarge(OSError):
    """A file that is not a regular file, or is over the limit (`strerror` says which)."""


def read_text(path: str | Path, limit: int = MIB) -> str:
    """The UTF-8 text of the regular file at `path`, at most `limit` bytes. OSError (TooLarge
    among them, with a `strerror` for messages) or UnicodeDecodeError otherwise."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO opens at once
    with os.fdopen(fd, "rb") as f:
        kind = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(kind):
            raise TooLarge(0, "not a regular file", str(path))
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(0, f"over {limit // 1024} KiB", str(path))
    return data.decode("utf-8")


def unreadable(exc: OSError) -> str:
    """Why `exc` kept a file from being read, as a sentence's end: the system's reason, and for
    a permission refused, the user this process runs as (a root-only file read by a service
    user is the usual cause)."""
    reason = exc.strerror or type(exc).__name__
    if exc.errno in (errno.EACCES, errno.EPERM):
        uid = os.geteuid()
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
        reason += (f" (fleetgate runs as user {user}: make the file, and its folders, "
                   "readable by it)")  # fmt: skip
    return reason

"""systemd's readiness and watchdog protocol (sd_notify(3)): one datagram per message to the unix
socket named by `$NOTIFY_SOCKET`.

`fleetgate run` under `Type=notify` sends `READY=1` once it leads or stands by, `WATCHDOG=1`
after each tick and from the standby loop, and `STOPPING=1` when it begins to shut down (each
with a `STATUS=` line `systemctl status` shows). Without `$NOTIFY_SOCKET` (not started by
systemd, or `Type=simple`) every call is a no-op. A message that cannot be sent is logged once
and never raised: the controller keeps running, and systemd's own timeouts say what went wrong.

A send never blocks for longer than `send_timeout_s`: the socket's queue is short (the kernel's
`net.unix.max_dgram_qlen`, 10 by default), and a reader that falls behind (a busy systemd, or
none at all) would otherwise stall the tick, the standby loop and the shutdown that waits for
them. A message that does not fit in time is dropped; the next `WATCHDOG=1` follows a tick later.

`$WATCHDOG_USEC` (set by systemd with `WatchdogSec=`, for this process when `$WATCHDOG_PID` is
ours or unset) is read so that a watchdog shorter than the tick interval is reported at start.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Mapping

log = logging.getLogger(__name__)


class Notifier:
    """Sends sd_notify messages to `address` (a path, or `@name` for the abstract namespace);
    `address` None: does nothing."""

    def __init__(self, address: str | None, watchdog_s: float | None = None,
                 send_timeout_s: float = 1.0):  # fmt: skip
        self.address = address or None
        self.watchdog_s = watchdog_s
        self.send_timeout_s = send_timeout_s
        self._failed = False
        self.ready_sent = False
        # after STOPPING=1 nothing more is sent: the tick, the standby loop and the shutdown
        # are different threads, and a WATCHDOG=1 after it would tell systemd we are alive
        self._lock = threading.Lock()
        self._stopping = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        env = os.environ if environ is None else environ
        return cls(env.get("NOTIFY_SOCKET"), _watchdog_s(env))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> bool:
        """One message of `KEY=VALUE` fields; True when it was sent."""
        if self.address is None:
            return False
        target = self.address
        if target.startswith("@"):  # the abstract namespace: a leading NUL byte
            target = "\0" + target[1:]
        elif not target.startswith("/"):
            self._fail(f"unsupported NOTIFY_SOCKET {self.address!r} (expected a path or @name)")
            return False
        payload = "\n".join(f.replace("\n", " ") for f in fields).encode("utf-8")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.settimeout(self.send_timeout_s)  # a full queue: wait this long at most
                sock.connect(target)
                sock.sendall(payload)
        except TimeoutError:
            self._fail(f"cannot notify systemd at {self.address!r}: its socket's queue stayed "
                       f"full for {self.send_timeout_s:g} s (message dropped)")  # fmt: skip
            return False
        except OSError as exc:
            self._fail(f"cannot notify systemd at {self.address!r}: {exc.strerror or exc}")
            return False
        return True

    def ready(self, status: str) -> bool:
        """`READY=1` (the first call only; later ones update the status); nothing once
        stopping."""
        with self._lock:
            if self._stopping:
                return False
            if self.ready_sent:
                return self.send(f"STATUS={status}")
            self.ready_sent = self.send("READY=1", f"STATUS={status}")
            return self.ready_sent

    def watchdog(self) -> bool:
        """`WATCHDOG=1`, unless stopping."""
        with self._lock:
            return not self._stopping and self.send("WATCHDOG=1")

    def stopping(self, status: str = "stopping") -> bool:
        """`STOPPING=1`, once: the last message this notifier sends."""
        with self._lock:
            if self._stopping:
                return False
            self._stopping = True
            return self.send("STOPPING=1", f"STATUS={status}")

    def _fail(self, message: str) -> None:
        if not self._failed:
            self._failed = True
            log.warning("%s; systemd is not told of readiness or liveness", message)


def _watchdog_s(env: Mapping[str, str]) -> float | None:
    """`$WATCHDOG_USEC` in seconds when it is meant for this process, else None."""
    usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
    if not usec or (pid and pid.strip() != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1e6 if value > 0 else None

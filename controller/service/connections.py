"""The HTTP API's connections, bounded: how many, and how long each may take to send a request.

uvicorn holds a connection that never finishes its request for as long as the client keeps it
open, and takes as many as the kernel hands it. The instance API faces the internet: a client
holding a thousand such connections (no token needed: none is read before the request is)
used up the process's file descriptors (1,024 under systemd's default), and then nobody
reached the API, agents could not register or take their commands, and asyncio logged a
traceback for every refused accept, megabytes a second.

`BoundedH11` is uvicorn's h11 protocol with two bounds:

- a request must be received whole (headers and body) within `REQUEST_S` of the connection
  opening, or of the previous response; else the connection is closed (an idle keep-alive
  connection is closed by uvicorn sooner);
- past `MAX_CONNECTIONS` on one server, of the address holding the most connections still
  waiting for their requests, the one that has waited longest is closed. A request received
  whole is never closed for this: an agent or a person sends theirs at once, so a slow client
  can only push out another slow client, and one address holding many pushes out its own;
- the listening socket's backlog is `BACKLOG`, so the connections accepted at once before
  the ones over the limit are closed stay well under the descriptors left.

This module must NOT read request contents nor decide anything about a caller.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256  # per server: two servers stay well under systemd's 1,024 descriptors
# asyncio accepts up to `backlog` connections in one go before the loop closes any over the
# limit: uvicorn's 2,048 would take that many descriptors at once
BACKLOG = 128
REQUEST_S = 30.0  # to send a whole request (a 1 MiB log push over a slow link is seconds)


class BoundedH11(H11Protocol):
    """uvicorn's h11 protocol, bounded in connections and in time to send a request."""

    max_connections = MAX_CONNECTIONS
    request_s = REQUEST_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting_since: float = time.monotonic()
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._wait()
        if len(self.connections) > self.max_connections:
            waiting = [c for c in self.connections if isinstance(c, BoundedH11) and c.receiving]
            most = Counter(c.address for c in waiting).most_common(1)
            among = [c for c in waiting if most and c.address == most[0][0]]
            oldest = min(among, key=lambda c: c._waiting_since, default=None)
            (oldest or self).close_slow("over the connection limit")

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._wait()

    @property
    def address(self) -> str:
        """The client's address, without its port."""
        return str(self.client[0]) if self.client else ""

    @property
    def receiving(self) -> bool:
        """Whether its request has not arrived whole yet (none started, or its body is still
        coming): what may be closed without cutting an answer short."""
        cycle = self.cycle
        return cycle is None or cycle.response_complete or cycle.more_body

    def close_slow(self, why: str) -> None:
        self._stop_waiting()
        self.connections.discard(self)
        if not self.transport.is_closing():
            log.debug("HTTP connection from %s closed: %s", self.client, why)
            self.transport.abort()

    def _wait(self) -> None:
        self._stop_waiting()
        self._waiting_since = time.monotonic()
        self._deadline = self.loop.call_later(self.request_s, self._expired)

    def _stop_waiting(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.receiving:
            self.close_slow(f"no whole request within {self.request_s:g} s")

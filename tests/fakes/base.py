"""What the fake HTTP servers share: a server that waits for its handlers and keeps their
errors for the test to look at, and a handler that keeps quiet."""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class RecordingServer(ThreadingHTTPServer):
    """server_close() joins the handler threads; errors raised in them go to `fake.errors`."""

    daemon_threads = False
    block_on_close = True
    fake: Any

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if error is not None:
            self.fake.errors.append(error)


class QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass

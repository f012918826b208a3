"""A real local HTTP server that records what it is sent and answers as scripted.

    with Receiver() as rx:                      # 127.0.0.1, a free port, its own thread
        rx.script([503, 503, 200])             # the next answers, in order; then `default`
        rx.delay_s = 0.5                        # wait before answering (to provoke timeouts)
        ...POST to rx.url + "/any/path"...
        rx.requests[0].path, .headers, .json    # what arrived, in order

Every request (any method) is recorded before it is answered. Responses are `body` with the
scripted status. HTTP/1.0, one request per connection, so no client socket is left open.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    default: int = 200
    body: bytes = b'{"status": "success"}'
    content_type: str = "application/json"
    delay_s: float = 0.0
    requests: list[Request] = field(default_factory=list)
    _statuses: list[int] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, statuses: Iterable[int]) -> None:
        """Answer the next requests with these statuses, then with `default`."""
        with self._lock:
            self._statuses = list(statuses)

    def _next_status(self, request: Request) -> int:
        with self._lock:
            self.requests.append(request)
            return self._statuses.pop(0) if self._statuses else self.default

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # wakes delayed handlers
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _handler(rx: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            request = Request(self.command, self.path, dict(self.headers.items()), body)
            status = rx._next_status(request)
            if rx.delay_s and rx._stop.wait(rx.delay_s):
                return  # the receiver is closing
            try:
                self.send_response(status)
                self.send_header("Content-Type", rx.content_type)
                self.send_header("Content-Length", str(len(rx.body)))
                self.end_headers()
                self.wfile.write(rx.body)
            except OSError:
                pass  # the client gave up (timed out) before the answer

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: tests assert on rx.requests

    return Handler

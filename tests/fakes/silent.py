"""A TCP server on 127.0.0.1 that accepts every connection and says nothing, until told whom to
answer with: an LLM endpoint or a mail server that hangs, and then recovers.

    with Silent() as llm:                     # a free port, its own thread
        ...connect to llm.port: accepted, never answered (what a client sent is kept)...
        llm.answer_with(fake.port)            # from now on every connection, the held ones
                                              # included, is joined to the server at that port
        llm.accepted                          # connections accepted so far

Nothing is read from the far end while silent, so a server that speaks first (SMTP's greeting)
is silent too. Closing it drops every connection.
"""

from __future__ import annotations

import selectors
import socket
import threading


class Silent:
    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.05)
        self.port: int = self._server.getsockname()[1]
        self.accepted = 0
        self._target: int | None = None
        self._open, self._stop = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []

    def __enter__(self) -> Silent:
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in list(self._threads):
            t.join(timeout=5)
        self._server.close()
        with self._lock:
            for s in self._sockets:
                s.close()

    def answer_with(self, port: int) -> None:
        self._target = port
        self._open.set()

    def _spawn(self, target: object, *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads.append(t)
        t.start()

    def _keep(self, s: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.append(s)
        return s

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self._spawn(self._hold, self._keep(conn))

    def _hold(self, conn: socket.socket) -> None:
        """Keep what the client sends until open (or until it hangs up); then join the two."""
        held = b""
        conn.settimeout(0.05)
        while not self._open.is_set():
            if self._stop.is_set():
                return
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return  # the client gave up
            held += data
        assert self._target is not None
        try:
            far = self._keep(socket.create_connection(("127.0.0.1", self._target), timeout=5))
            far.sendall(held)
        except OSError:
            return
        self._pipe(conn, far)

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        try:
            self._copy(a, b)
        finally:  # one side hung up: so does the other
            a.close()
            b.close()

    def _copy(self, a: socket.socket, b: socket.socket) -> None:
        a.setblocking(False)
        b.setblocking(False)
        with selectors.DefaultSelector() as sel:
            sel.register(a, selectors.EVENT_READ, b)
            sel.register(b, selectors.EVENT_READ, a)
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.05):
                    src, dst = key.fileobj, key.data
                    assert isinstance(src, socket.socket)
                    try:
                        data = src.recv(65536)
                        if not data:
                            return
                        dst.setblocking(True)
                        dst.sendall(data)
                        dst.setblocking(False)
                    except OSError:
                        return

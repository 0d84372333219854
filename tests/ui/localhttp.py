"""Small real HTTP servers on loopback ports, for what the page may and may not reach."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Reply = Callable[[BaseHTTPRequestHandler], None]


class LocalServer:
    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        self.requests: list[tuple[str, str, dict[str, str]]] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"


@contextmanager
def local_server(reply: Reply) -> Iterator[LocalServer]:
    holder: list[LocalServer] = []

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            holder[0].requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
            length = int(self.headers.get("content-length") or 0)
            if length:
                self.rfile.read(length)
            reply(self)

        do_GET = do_POST = _any

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    holder.append(LocalServer(server))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()


def answer(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> Reply:
    def reply(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return reply


def drip(interval_s: float = 0.2) -> Reply:
    """HTTP 200 whose body never ends: one byte per ``interval_s`` (a hostile endpoint)."""

    def reply(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        try:
            for _ in range(10_000):
                handler.wfile.write(b":")
                handler.wfile.flush()
                time.sleep(interval_s)  # the hostile server's pace, not a wait in the test
        except OSError:
            return

    return reply


def drip_headers(interval_s: float = 0.2) -> Reply:
    """A status line, then header lines one at a time, forever (the response never gets going)."""

    def reply(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(401)
        handler.flush_headers()
        try:
            for _ in range(10_000):
                handler.wfile.write(b"X-Pad: 1\r\n")
                handler.wfile.flush()
                time.sleep(interval_s)  # the hostile server's pace, not a wait in the test
        except OSError:
            return

    return reply

"""Helpers shared by the mcp tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


class Bearer(httpx.Auth):
    """The minimal auth this room needs: a fixed bearer token (the OAuth classes live in auth/)."""

    def __init__(self, token: str) -> None:
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._token}"
        yield request


def serve(handle: Callable[[BaseHTTPRequestHandler], None]) -> tuple[ThreadingHTTPServer, str]:
    """A local HTTP/1.1 server whose every POST, GET and DELETE is ``handle``d (a client hanging up
    is not an error): the running server (shut it down) and its MCP URL."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            try:
                handle(self)
            except (BrokenPipeError, ConnectionResetError):
                pass

        do_GET = do_DELETE = do_POST

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/mcp"

"""No client of ours follows a redirect: the token endpoint, discovery, and the MCP session.

A token request sent on to wherever a 3xx points would hand the code or refresh token to that
place; a followed metadata or MCP redirect would let another origin answer for BOS. Each client is
given a server that answers 3xx to a target that would accept anything, and must stop at the 3xx.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from authfakes import ORIGIN, PRM_URL, RESOURCE, FakeBos

from airflow_provider_bos.auth.discovery import discover
from airflow_provider_bos.auth.grants import ApiKeyAuth, request_token
from airflow_provider_bos.exceptions import BosError

ELSEWHERE = "https://elsewhere.example/landing"
INITIALIZE_RESULT = {
    "jsonrpc": "2.0",
    "id": 1,
    "result": {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
               "serverInfo": {"name": "elsewhere", "version": "1"}},
}


class RedirectingServer:
    """Loopback HTTP: every request to /mcp gets a 307 to /elsewhere, which answers 200 to anything."""

    def __init__(self, status: int = 307) -> None:
        self.landed: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                if self.path.startswith("/elsewhere"):
                    outer.landed.append(f"{self.command} {self.path}")
                    body = json.dumps(INITIALIZE_RESULT).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Mcp-Session-Id", "s-1")
                else:
                    body = b""
                    self.send_response(status)
                    self.send_header("Location", "/elsewhere" + self.path)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _any

            def log_message(self, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/mcp"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(params=[301, 302, 307, 308])
def redirecting(request: pytest.FixtureRequest) -> Iterator[RedirectingServer]:
    server = RedirectingServer(request.param)
    yield server
    server.close()


def following_client(handler) -> httpx.Client:
    """A client whose default IS to follow: only a per-request refusal keeps the rule."""
    return httpx.Client(transport=httpx.MockTransport(handler), follow_redirects=True)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_the_token_client_does_not_follow_a_redirect(status: int) -> None:
    landed: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if str(request.url) == ELSEWHERE:
            landed.append(request)
            return httpx.Response(200, json={"access_token": "at-elsewhere", "token_type": "Bearer"})
        return httpx.Response(status, headers={"Location": ELSEWHERE})

    with following_client(handler) as client, pytest.raises(BosError, match=f"HTTP {status}"):
        request_token(client, f"{ORIGIN}/token", {"grant_type": "refresh_token", "refresh_token": "rt-x"})
    assert landed == []


@pytest.mark.parametrize("redirected", [RESOURCE, PRM_URL, f"{ORIGIN}/.well-known/oauth-authorization-server"])
@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_discovery_does_not_follow_a_redirect(redirected: str, status: int) -> None:
    fake = FakeBos()
    fake.overrides[redirected] = httpx.Response(status, headers={"Location": ELSEWHERE})
    with httpx.Client(transport=httpx.MockTransport(fake.handler), follow_redirects=True) as client:
        with pytest.raises(BosError):
            discover(RESOURCE, http_client=client)
    assert ELSEWHERE not in [str(r.url) for r in fake.requests]


def test_the_mcp_session_does_not_follow_a_redirect(redirecting: RedirectingServer) -> None:
    from airflow_provider_bos.mcp import McpSession

    session = McpSession(redirecting.url, auth=ApiKeyAuth("bos_key_redirect_test"), era="2025-11-25")
    try:
        with pytest.raises(BosError):
            session.connect()
    finally:
        session.close()
    assert redirecting.landed == []


def test_the_hook_does_not_follow_a_redirect(redirecting: RedirectingServer, monkeypatch) -> None:
    from airflow_provider_bos.hooks.bos import BosHook

    monkeypatch.setenv("AIRFLOW_CONN_BOS_REDIRECTED", json.dumps({
        "conn_type": "bos", "host": redirecting.url, "password": "bos_key_redirect_test",
        "extra": {"auth_type": "api_key", "protocol": "2025-11-25"},
    }))
    hook = BosHook("bos_redirected")
    try:
        with pytest.raises(BosError):
            hook.get_conn()
    finally:
        hook.close()
    assert redirecting.landed == []

"""A hostile endpoint cannot hold a call forever: every operation ends by its deadline.

The server here is a small ``http.server`` on loopback that never finishes anything: it keeps an
event stream open with keepalive comments, trickles a JSON body a byte at a time, or sends one
event id with ``retry: 0`` and closes, on every resuming GET, forever. Each public operation of
:class:`McpSession` must still end, with :class:`BosDeadlineExceeded` or a bounded
:class:`BosIncompleteStreamError`, and resumption must wait at least its floor between GETs.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from mcphelpers import serve

from airflow_provider_bos.exceptions import BosDeadlineExceeded, BosError, BosIncompleteStreamError
from airflow_provider_bos.mcp import McpSession, RetryPolicy
from airflow_provider_bos.mcp.event_stream import MAX_RESUMPTIONS_PER_CALL, MIN_RETRY_MS, Reconnect
from airflow_provider_bos.mcp.session import DEFAULT_OPERATION_DEADLINE, DEFAULT_READ_DEADLINE

FAST = RetryPolicy(attempts=1)
CAPS = {"tools": {}, "experimental": {"bos/source-results/v1": {"pageSize": 10}}}


class Hostile:
    """What the server does with each request: ``behaviour(handler, method, rid)``."""

    def __init__(self, hostile: str) -> None:
        self.hostile = hostile  # the JSON-RPC method (or "GET") it never finishes
        self.gets = 0
        self.stop = threading.Event()

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        if handler.command == "GET":
            self.gets += 1
            self._one_id_and_close(handler, f"g.{self.gets}")
            return
        if handler.command == "DELETE":
            handler.send_response(200)
            handler.send_header("content-length", "0")
            handler.end_headers()
            return
        body = json.loads(handler.rfile.read(int(handler.headers["content-length"])))
        method, rid = body.get("method"), body.get("id")
        if method == "notifications/initialized":
            handler.send_response(202)
            handler.send_header("content-length", "0")
            handler.end_headers()
        elif method == self.hostile and self.hostile == "tools/list":
            self._trickle_json(handler, rid)
        elif method == self.hostile and method == "tools/call" and body["params"]["name"] == "search_people":
            self._one_id_and_close(handler, "p.0")
        elif method == self.hostile:
            self._keepalive_forever(handler)
        elif method == "initialize":
            self._json(handler, {"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": "2025-11-25", "capabilities": CAPS}}, session="s-1")
        else:
            self._json(handler, {"jsonrpc": "2.0", "id": rid, "result": {
                "content": [], "structuredContent": {"contexts": []}, "tools": []}})

    def _json(self, handler: BaseHTTPRequestHandler, message: dict[str, Any], session: str | None = None) -> None:
        data = json.dumps(message).encode()
        handler.send_response(200)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(data)))
        if session:
            handler.send_header("mcp-session-id", session)
        handler.end_headers()
        handler.wfile.write(data)

    def _sse_headers(self, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("connection", "close")
        handler.end_headers()
        handler.close_connection = True

    def _keepalive_forever(self, handler: BaseHTTPRequestHandler) -> None:
        self._sse_headers(handler)
        while not self.stop.wait(0.05):
            handler.wfile.write(b": keepalive\n\n")
            handler.wfile.flush()

    def _one_id_and_close(self, handler: BaseHTTPRequestHandler, event_id: str) -> None:
        self._sse_headers(handler)
        handler.wfile.write(f"id: {event_id}\nretry: 0\ndata:\n\n".encode())
        handler.wfile.flush()

    def _trickle_json(self, handler: BaseHTTPRequestHandler, rid: Any) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", "1000000")
        handler.end_headers()
        handler.wfile.write(b'{"jsonrpc": "2.0", "id": ' + json.dumps(rid).encode() + b', "result": {"tools": [')
        while not self.stop.wait(0.05):
            handler.wfile.write(b" ")
            handler.wfile.flush()


@pytest.fixture()
def hostile_server() -> Iterator[Callable[[str], tuple[str, Hostile]]]:
    servers: list[tuple[ThreadingHTTPServer, Hostile]] = []

    def start(hostile: str) -> tuple[str, Hostile]:
        behaviour = Hostile(hostile)
        server, url = serve(behaviour.handle)
        servers.append((server, behaviour))
        return url, behaviour

    yield start
    for server, behaviour in servers:
        behaviour.stop.set()
        server.shutdown()
        server.server_close()


OPERATIONS: dict[str, tuple[str, Callable[[McpSession], Any]]] = {
    "connect": ("initialize", lambda s: s.connect()),
    "call_tool": ("tools/call", lambda s: s.call_tool("anything", {})),
    "get_contexts": ("tools/call", lambda s: s.get_contexts()),
    "list_context_tools": ("tools/call", lambda s: s.list_context_tools("ctx")),
    "list_tools (a trickled body)": ("tools/list", lambda s: s.list_tools()),
    "read_resource": ("resources/read", lambda s: s.read_resource("bos://x")),
}


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_every_operation_ends_by_its_deadline_whatever_the_server_does(hostile_server: Any, name: str) -> None:
    hostile, operation = OPERATIONS[name]
    url, _ = hostile_server(hostile)
    started = time.monotonic()
    with McpSession(url, era="2025-11-25", retry=FAST, timeout=5.0, operation_deadline_s=1.0) as session, \
            pytest.raises(BosDeadlineExceeded, match="operation_deadline") as caught:
        operation(session)
    # The keepalives and the trickle each come far within the HTTP timeout: only the deadline ends it.
    assert time.monotonic() - started < 4.0, caught.value


def test_a_read_without_a_deadline_gets_the_documented_default() -> None:
    assert DEFAULT_READ_DEADLINE == 1800.0 and DEFAULT_OPERATION_DEADLINE == 300.0
    seen: list[float] = []

    def fake(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(request.extensions["timeout"]["read"])
        if body["method"] == "initialize":
            return httpx.Response(200, json={"jsonrpc": "2.0", "id": body["id"], "result": {
                "protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}})
        if body["method"] == "notifications/initialized":
            return httpx.Response(202)
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": body["id"], "result": {"isError": True}})

    client = httpx.Client(transport=httpx.MockTransport(fake))
    with McpSession("http://127.0.0.1:9/mcp", era="2025-11-25", http_client=client, retry=FAST,
                    timeout=5000.0) as session, pytest.raises(BosError):
        session.federated_read("t", {}, via="direct", stream=False)  # an isError result
    # Every request of the read, its handshake included, waits at most what is left of 1800 s.
    assert seen and all(DEFAULT_READ_DEADLINE - 5 < limit <= DEFAULT_READ_DEADLINE for limit in seen)


def test_a_server_that_sends_an_id_and_closes_forever_is_given_up_within_the_read_deadline(
        hostile_server: Any) -> None:
    url, behaviour = hostile_server("tools/call")
    started = time.monotonic()
    with McpSession(url, era="2025-11-25", retry=FAST, timeout=2.0) as session, \
            pytest.raises(BosDeadlineExceeded, match="read_deadline"):
        session.federated_read("search_people", {}, via="direct", deadline_s=2.0)
    assert time.monotonic() - started < 5.0
    # retry: 0 is raised to the floor: at most one GET per floor interval, however often it closes.
    assert 1 <= behaviour.gets <= 2.0 / (MIN_RETRY_MS / 1000) + 1


def test_resumptions_per_call_are_bounded_even_when_every_connection_brings_a_new_event_id() -> None:
    """New event ids reset the count of failed attempts in a row, never the bound per call."""
    gets: list[httpx.Request] = []

    def fake(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            gets.append(request)
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  content=f"id: g.{len(gets)}\nretry: 0\ndata:\n\n".encode())
        if request.method == "DELETE":
            return httpx.Response(200)
        body = json.loads(request.content)
        if body["method"] == "initialize":
            return httpx.Response(200, json={"jsonrpc": "2.0", "id": body["id"], "result": {
                "protocolVersion": "2025-11-25", "capabilities": CAPS}})
        if body["method"] == "notifications/initialized":
            return httpx.Response(202)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b"id: p.0\ndata:\n\n")

    session = McpSession("http://127.0.0.1:9/mcp", era="2025-11-25", retry=FAST,
                         http_client=httpx.Client(transport=httpx.MockTransport(fake)))
    sleeps: list[float] = []  # recorded, not waited
    http = session._exchange
    http.reconnect = Reconnect(reopen=http.reopen_stream, release=http.release,
                               sleep=lambda s: (sleeps.append(s), http.sleep(0)))
    with session, pytest.raises(BosIncompleteStreamError, match=f"resumed {MAX_RESUMPTIONS_PER_CALL} times"):
        session.federated_read("search_people", {}, via="direct", deadline_s=3600.0)
    assert len(gets) == MAX_RESUMPTIONS_PER_CALL
    assert min(sleeps) == MIN_RETRY_MS / 1000


def test_a_connections_operation_deadline_bounds_the_hooks_calls(hostile_server: Any, monkeypatch: Any) -> None:
    from airflow_provider_bos.hooks.bos import BosHook

    url, _ = hostile_server("tools/call")  # bos_get_context never finishes
    monkeypatch.setenv("AIRFLOW_CONN_BOS_HOSTILE", json.dumps({
        "conn_type": "bos", "host": url, "password": "bos_key_0123456789",
        "extra": {"auth_type": "api_key", "protocol": "2025-11-25", "operation_deadline": 1.5}}))
    started = time.monotonic()
    ok, message = BosHook("bos_hostile").test_connection()
    assert not ok and "1.5s deadline (operation_deadline)" in message
    # Without the deadline the call never ends (the server keeps it alive). The bound leaves room for
    # the hook's set-up on a busy machine (two test workers on two cores).
    assert time.monotonic() - started < 10.0

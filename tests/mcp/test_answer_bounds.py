"""A hostile server cannot make the client buffer and decode a huge answer outside a read's result.

A JSON answer of tiny objects (``[{},{},...]``) decodes to about 34 times its size, so every
answer held whole has a small bound (:data:`DEFAULT_MAX_ANSWER_BYTES`): the handshake
(``initialize``, ``server/discover``), ``tools/list``, context discovery and every plain call,
as a JSON body (declared or not) or as an SSE event. Only a federated read's final result may be
larger (up to ``max_event_bytes``): it is scanned record by record. The server here is a small
``http.server`` on loopback that answers one method with a body of many small objects; the client
must stop reading at the bound, with :class:`BosAnswerTooLarge`, before anything is decoded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from mcphelpers import serve

from airflow_provider_bos.exceptions import BosAnswerTooLarge, BosResultError
from airflow_provider_bos.mcp import (
    McpSession,
    RetryPolicy,
    event_stream,
    exchange,
    final_frame,
    final_result,
)
from airflow_provider_bos.mcp.session import DEFAULT_MAX_ANSWER_BYTES, DEFAULT_STREAM_THRESHOLD

FAST = RetryPolicy(attempts=1)
MIB = 1024 * 1024
BOMB_BYTES = DEFAULT_MAX_ANSWER_BYTES + 2 * MIB
CAPS = {"tools": {}, "experimental": {"bos/source-results/v1": {"pageSize": 10}}}
# The most the client may read past the bound: one network chunk.
CHUNK_SLACK = 256 * 1024


def bomb(rid: Any, key: str) -> bytes:
    """A JSON-RPC response whose ``result[key]`` is BOMB_BYTES of empty objects."""
    head = b'{"jsonrpc":"2.0","id":' + json.dumps(rid).encode() + b',"result":{"' + key.encode() + b'":['
    items = b"{}," * ((BOMB_BYTES - len(head)) // 3)
    return head + items + b"{}]}}"


def read_bomb(rid: Any) -> bytes:
    """A direct read's final response whose record array is BOMB_BYTES of empty objects."""
    head = (b'{"jsonrpc":"2.0","id":' + json.dumps(rid).encode()
            + b',"result":{"content":[],"isError":false,"structuredContent":{"result":[')
    items = b"{}," * ((BOMB_BYTES - len(head)) // 3)
    return head + items + b'{}],"metadata":{"completeness":"complete"}}}}'


class Bomber:
    """Answers ``target`` (a JSON-RPC method, or ``tools/call:<tool>``) with a bomb, as ``form``."""

    def __init__(self, target: str, form: str) -> None:
        self.target = target
        self.form = form  # "json" (declared length), "json-unsized" (read to EOF) or "sse"

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        if handler.command != "POST":
            handler.send_response(405)
            handler.send_header("content-length", "0")
            handler.end_headers()
            return
        body = json.loads(handler.rfile.read(int(handler.headers["content-length"])))
        method, rid = body.get("method"), body.get("id")
        name = method if method != "tools/call" else f"tools/call:{body['params']['name']}"
        if method == "notifications/initialized":
            handler.send_response(202)
            handler.send_header("content-length", "0")
            handler.end_headers()
        elif name == self.target == "tools/call:search_people":
            self._send(handler, read_bomb(rid))
        elif name == self.target:
            self._send(handler, bomb(rid, "tools"))
        elif method == "initialize":
            self._send(handler, json.dumps({"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": "2025-11-25", "capabilities": CAPS}}).encode(), form="json")
        elif method == "server/discover":
            self._send(handler, json.dumps({"jsonrpc": "2.0", "id": rid, "result": {
                "supportedVersions": ["2026-07-28"], "capabilities": CAPS,
                "serverInfo": {"name": "bomber", "version": "1"}}}).encode(), form="json")
        else:
            self._send(handler, json.dumps({"jsonrpc": "2.0", "id": rid, "result": {
                "content": [], "structuredContent": {"contexts": []}, "tools": []}}).encode(), form="json")

    def _send(self, handler: BaseHTTPRequestHandler, data: bytes, form: str | None = None) -> None:
        form = form or self.form
        handler.send_response(200)
        if form == "sse":
            data = b"event: message\ndata: " + data + b"\n\n"
            handler.send_header("content-type", "text/event-stream")
        else:
            handler.send_header("content-type", "application/json")
        if form == "json":
            handler.send_header("content-length", str(len(data)))
        else:
            handler.send_header("connection", "close")  # the body ends at EOF
            handler.close_connection = True
        if form == "json":
            handler.send_header("mcp-session-id", "s-1")
        handler.end_headers()
        handler.wfile.write(data)


@pytest.fixture()
def bomber() -> Iterator[Callable[[str, str], str]]:
    servers: list[ThreadingHTTPServer] = []

    def start(target: str, form: str) -> str:
        server, url = serve(Bomber(target, form).handle)
        servers.append(server)
        return url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


class CountingTransport(httpx.BaseTransport):
    """Counts the response body bytes the client pulled off the wire."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.body_bytes = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        return httpx.Response(response.status_code, headers=response.headers,
                              stream=_Counted(response.stream, self), extensions=response.extensions)

    def close(self) -> None:
        self.inner.close()


class _Counted(httpx.SyncByteStream):
    def __init__(self, inner: Any, owner: CountingTransport) -> None:
        self._inner = inner
        self._owner = owner

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            self._owner.body_bytes += len(chunk)
            yield chunk

    def close(self) -> None:
        self._inner.close()


OPERATIONS: dict[str, tuple[str, str, Callable[[McpSession], Any]]] = {
    "initialize": ("2025-11-25", "initialize", lambda s: s.connect()),
    "server/discover": ("2026-07-28", "server/discover", lambda s: s.connect()),
    "tools/list": ("2025-11-25", "tools/list", lambda s: s.list_tools()),
    "bos_get_context": ("2025-11-25", "tools/call:bos_get_context", lambda s: s.get_contexts()),
    "bos_list_context_tools": ("2025-11-25", "tools/call:bos_list_context_tools",
                               lambda s: s.list_context_tools("ctx")),
    "call_tool": ("2025-11-25", "tools/call:anything", lambda s: s.call_tool("anything", {})),
    "read_resource": ("2025-11-25", "resources/read", lambda s: s.read_resource("bos://x")),
    # The context a bos_execute read resolves before the read: discovery, not the read's result.
    "a read's context discovery": ("2025-11-25", "tools/call:bos_get_context",
                                   lambda s: s.federated_read("search_people", {}, via="execute",
                                                              stream_records=True)),
}


@pytest.mark.parametrize("form", ["json", "json-unsized", "sse"])
@pytest.mark.parametrize("name", list(OPERATIONS))
def test_an_answer_over_the_small_bound_is_refused_before_it_is_decoded(bomber: Any, name: str, form: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    era, target, operation = OPERATIONS[name]
    url = bomber(target, form)
    transport = CountingTransport()
    decoded: list[int] = []

    def watched_loads(data: Any) -> Any:
        decoded.append(len(data))
        return json.loads(data)

    monkeypatch.setattr(exchange, "loads", watched_loads)
    monkeypatch.setattr(event_stream, "loads", watched_loads)
    client = httpx.Client(transport=transport, timeout=30.0)
    # A large max_event_bytes (a Connection's 'Largest event') does not raise the bound of these answers.
    with McpSession(url, era=era, retry=FAST, http_client=client, max_event_bytes=512 * MIB) as session, \
            pytest.raises(BosAnswerTooLarge, match="MiB") as caught:
        operation(session)
    client.close()
    assert caught.value.limit == DEFAULT_MAX_ANSWER_BYTES
    assert "federated read" in str(caught.value)  # what may be larger, so the user knows what to use
    assert transport.body_bytes <= DEFAULT_MAX_ANSWER_BYTES + CHUNK_SLACK
    assert all(size <= DEFAULT_MAX_ANSWER_BYTES for size in decoded)


def test_the_answer_bound_is_a_few_mib_and_may_be_lowered() -> None:
    assert DEFAULT_MAX_ANSWER_BYTES == 4 * MIB
    with McpSession("http://127.0.0.1:9/mcp", max_answer_bytes=MIB) as session:
        assert session.max_answer_bytes == MIB
    # Never above the event bound: a session with a small max_event_bytes keeps it for everything.
    with McpSession("http://127.0.0.1:9/mcp", max_event_bytes=MIB) as session:
        assert session.max_answer_bytes == MIB


@pytest.mark.parametrize("form", ["json", "json-unsized", "sse"])
@pytest.mark.parametrize("stream_records", [True, False], ids=["streamed", "held-whole"])
def test_a_read_result_of_tiny_objects_is_never_decoded_whole(bomber: Any, form: str, stream_records: bool,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A read's result may be large, so it is scanned record by record, also when the caller holds
    it whole (stream_records=False): its first bad record fails it, long before its end arrives."""
    url = bomber("tools/call:search_people", form)
    transport = CountingTransport()
    decoded: list[int] = []
    for module in (exchange, event_stream, final_result, final_frame):
        original = module.loads

        def watched_loads(data: Any, original: Any = original) -> Any:
            decoded.append(len(data))
            return original(data)

        monkeypatch.setattr(module, "loads", watched_loads)
    client = httpx.Client(transport=transport, timeout=30.0)
    with McpSession(url, era="2025-11-25", retry=FAST, http_client=client, max_event_bytes=512 * MIB) as session, \
            pytest.raises(BosResultError, match=r"Record 0 .*has no record_ref"):
        result = session.federated_read("search_people", {}, via="direct", stream=False,
                                        stream_records=stream_records)
        for _ in result.records:
            pass
    client.close()
    assert max(decoded, default=0) <= DEFAULT_STREAM_THRESHOLD
    assert transport.body_bytes < BOMB_BYTES // 2  # refused at its first record, not after reading it all

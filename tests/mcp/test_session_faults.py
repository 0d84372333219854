"""McpSession against byte-level faults (httpx.MockTransport): statuses, bodies, framing, eras."""

from __future__ import annotations

import base64
import gzip
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from airflow_provider_bos.exceptions import (
    BosAnswerTooLarge,
    BosAuthError,
    BosConfigurationError,
    BosDeadlineExceeded,
    BosHttpError,
    BosIncompleteStreamError,
    BosJsonRpcError,
    BosProtocolError,
    BosResultError,
    BosRetryableHttpError,
    BosStreamValidationError,
)
from airflow_provider_bos.mcp import BosReadCancelled, McpSession, RetryPolicy
from airflow_provider_bos.mcp.retry import parse_retry_after, run_with_retries
from airflow_provider_bos.warehouse.run.claims import WireHashSet

URL = "https://bos.example/mcp/apps/bos/platform"
EXT = "bos/source-results/v1"
CAPS = {"tools": {}, "experimental": {EXT: {"pageSize": 100, "maxConcurrentSources": 8, "contractUri": "x"}}}
CRM = {"source_type": "crm", "source_identity": "crm-eu"}
FAST = RetryPolicy(attempts=3, max_total_s=5, backoff_base_s=0.0, backoff_max_s=0.0)
Reply = httpx.Response | Callable[[dict], httpx.Response]


def record(ref: str) -> dict[str, Any]:
    return {"record_ref": ref, "display_name": "N", "attributes": {},
            "sources": [{**CRM, "external_id": ref, "record_type": "person",
                         "observed_at": "2026-10-08T12:00:00Z", "capabilities": ["read"]}]}


def final_result(records: list[dict], *, completeness: str = "complete") -> dict[str, Any]:
    structured = {"result": records, "metadata": {"completeness": completeness, "result_count": len(records)}}
    return {"content": [{"type": "text", "text": json.dumps(structured)}], "structuredContent": structured,
            "isError": completeness != "complete"}


def sse(*messages: dict | str) -> bytes:
    out = b""
    for message in messages:
        out += message.encode() if isinstance(message, str) else (
            b"event: message\ndata: " + json.dumps(message).encode() + b"\n\n")
    return out


def notification(request_id: str, seq: int, page: int, status: str = "page", records: list | None = None) -> dict:
    return {"jsonrpc": "2.0", "method": "notifications/bos/source_result",
            "params": {"requestId": request_id, "sequence": seq, "pageIndex": page, "source": CRM,
                       "records": records if records is not None else [], "status": status}}


def sse_response(body: bytes | Iterator[bytes]) -> httpx.Response:
    stream = body if isinstance(body, bytes) else _IterStream(body)
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, **(
        {"content": stream} if isinstance(stream, bytes) else {"stream": stream}))


class _IterStream(httpx.SyncByteStream):
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self._chunks


class FakeBos:
    """A scripted MCP server: per-method queues of replies, plus a default per method."""

    def __init__(self, *, stateless: bool = False) -> None:
        self.requests: list[httpx.Request] = []
        self.bodies: list[dict] = []
        self.queued: dict[str, list[Reply]] = {}
        self.session = "sess-1"
        self.deleted: list[str] = []
        self.stateless = stateless
        self.initializes = 0

    def queue(self, method: str, *replies: Reply) -> None:
        self.queued.setdefault(method, []).extend(replies)

    def calls(self, method: str) -> list[dict]:
        return [b for b in self.bodies if b.get("method") == method]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.method == "DELETE":
            self.deleted.append(request.headers.get("mcp-session-id", ""))
            return httpx.Response(200)
        body = json.loads(request.content)
        self.bodies.append(body)
        method = body.get("method")
        if self.queued.get(method):
            reply = self.queued[method].pop(0)
            return reply(body) if callable(reply) else reply
        return self.default(method, body)

    def default(self, method: str, body: dict) -> httpx.Response:
        rid = body.get("id")
        if method == "server/discover":
            if not self.stateless:
                return httpx.Response(404, text="Not Found")
            return ok(rid, {"supportedVersions": ["2026-07-28"], "capabilities": CAPS, "resultType": "complete"})
        if method == "initialize":
            self.initializes += 1
            self.session = f"sess-{self.initializes}"
            return ok(rid, {"protocolVersion": "2025-11-25", "capabilities": CAPS,
                            "serverInfo": {"name": "fake", "version": "1"}}, {"mcp-session-id": self.session})
        if method == "notifications/initialized":
            return httpx.Response(202)
        if method == "tools/list":
            return ok(rid, {"tools": [{"name": "search_people", "inputSchema": {"type": "object"}}]})
        if method == "tools/call":
            return ok(rid, final_result([record("bos:person:1")]))
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "nope"}})


def ok(rid: Any, result: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.Response(200, json={"jsonrpc": "2.0", "id": rid, "result": result}, headers=headers)


def make(fake: FakeBos, **kwargs: Any) -> McpSession:
    kwargs.setdefault("retry", FAST)
    kwargs.setdefault("era", "2025-11-25")
    return McpSession(URL, http_client=httpx.Client(transport=httpx.MockTransport(fake)), **kwargs)


def read(session: McpSession, **kwargs: Any) -> Any:
    return session.federated_read("search_people", {"query": "a"}, via="direct", **kwargs)


# --- HTTP status and content type -------------------------------------------------------------------

HTML = "<html><body><h1>502 Bad Gateway</h1><p>nginx</p></body></html>"


def test_html_502_is_retried_then_reported_with_status_and_excerpt() -> None:
    fake = FakeBos()
    fake.queue("tools/call", *[httpx.Response(502, text=HTML, headers={"content-type": "text/html"})] * 3)
    with make(fake) as session, pytest.raises(BosRetryableHttpError) as excinfo:
        read(session)
    assert len(fake.calls("tools/call")) == 3
    err = excinfo.value
    assert err.status_code == 502 and "Gave up after 3 attempts" in str(err)
    assert "502 Bad Gateway" in str(err) and len(err.body_excerpt or "") <= 200


def test_html_500_is_not_retried() -> None:
    fake = FakeBos()
    fake.queue("tools/call", httpx.Response(500, text=HTML * 50, headers={"content-type": "text/html"}))
    with make(fake) as session, pytest.raises(BosHttpError) as excinfo:
        read(session)
    assert not isinstance(excinfo.value, BosRetryableHttpError)
    assert excinfo.value.status_code == 500 and len(excinfo.value.body_excerpt or "") <= 200
    assert len(fake.calls("tools/call")) == 1


def test_200_with_html_content_type_is_rejected_before_parsing() -> None:
    fake = FakeBos()
    fake.queue("tools/call", httpx.Response(200, text=HTML, headers={"content-type": "text/html"}))
    with make(fake) as session, pytest.raises(BosHttpError, match="unexpected content type") as excinfo:
        read(session)
    assert excinfo.value.content_type == "text/html"


def test_json_content_type_with_garbage_body() -> None:
    fake = FakeBos()
    fake.queue("tools/call", httpx.Response(200, text="<html>", headers={"content-type": "application/json"}))
    with make(fake) as session, pytest.raises(BosProtocolError, match="not valid JSON"):
        read(session)


def test_429_with_retry_after_then_success() -> None:
    fake = FakeBos()
    fake.queue("tools/call", httpx.Response(429, headers={"retry-after": "0"}, text="slow down"))
    with make(fake) as session:
        result = read(session)
    assert [r.record_ref for r in result.records] == ["bos:person:1"]
    assert len(fake.calls("tools/call")) == 2
    ids = [b["id"] for b in fake.calls("tools/call")]
    assert ids[0] != ids[1]  # each attempt is a new JSON-RPC request


def test_503_and_504_then_success() -> None:
    fake = FakeBos()
    fake.queue("tools/call", httpx.Response(503), httpx.Response(504))
    with make(fake) as session:
        assert read(session).completeness == "complete"


def test_retry_after_is_honoured_and_total_time_bounds_retries() -> None:
    slept: list[float] = []
    attempts = 0

    def flaky() -> str:
        nonlocal attempts
        attempts += 1
        raise BosRetryableHttpError("busy", retry_after=2.5, status_code=429)

    with pytest.raises(BosRetryableHttpError, match="Gave up after 3 attempts"):
        run_with_retries(flaky, RetryPolicy(attempts=3, max_total_s=60), sleep=slept.append)
    assert slept == [2.5, 2.5] and attempts == 3
    slept.clear()
    attempts = 0
    with pytest.raises(BosRetryableHttpError, match="Gave up after 1 attempt"):
        run_with_retries(flaky, RetryPolicy(attempts=10, max_total_s=2), sleep=slept.append)
    assert slept == []  # a 2.5 s Retry-After does not fit a 2 s budget


@pytest.mark.parametrize(
    ("value", "expected"),
    [("3", 3.0), ("0.5", 0.5), ("-4", 0.0), ("soon", None), (None, None), ("Wed, 21 Oct 2015 07:28:10 GMT", 10.0)],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    now = 1445412480.0  # 2015-10-21 07:28:00 UTC
    assert parse_retry_after(value, now=now) == expected


def test_connect_errors_are_retried() -> None:
    fake = FakeBos()
    failures = iter([httpx.ConnectError("refused")])

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and json.loads(request.content).get("method") == "tools/call":
            for exc in failures:
                raise exc
        return fake(request)

    with McpSession(URL, era="2025-11-25", retry=FAST,
                    http_client=httpx.Client(transport=httpx.MockTransport(handler))) as session:
        assert read(session).completeness == "complete"


def test_401_is_an_auth_error_naming_the_challenge() -> None:
    fake = FakeBos()
    fake.queue("tools/call", httpx.Response(
        401, headers={"www-authenticate": 'Bearer error="invalid_token", resource_metadata="https://x"'}))
    with make(fake) as session, pytest.raises(BosAuthError, match="invalid_token"):
        read(session)


def test_json_rpc_error_in_an_http_400_body() -> None:
    fake = FakeBos()
    fake.queue("tools/call", httpx.Response(400, json={"jsonrpc": "2.0", "id": None,
                                                        "error": {"code": -32602, "message": "bad arguments"}}))
    with make(fake) as session, pytest.raises(BosJsonRpcError) as excinfo:
        read(session)
    assert excinfo.value.code == -32602 and "bad arguments" in str(excinfo.value)


# --- 2025 session lifecycle ------------------------------------------------------------------------


def test_handshake_headers_session_id_and_delete_on_close() -> None:
    fake = FakeBos()
    with make(fake) as session:
        session.list_tools()
        assert session.protocol_version == "2025-11-25" and session.session_id == "sess-1"
    init, initialized, tools = fake.requests[:3]
    assert "mcp-session-id" not in init.headers
    init_body = json.loads(init.content)
    assert init_body["params"]["clientInfo"]["name"] == "airflow-provider-bos"
    assert json.loads(initialized.content) == {"jsonrpc": "2.0", "method": "notifications/initialized"}
    for request in (initialized, tools):
        assert request.headers["mcp-session-id"] == "sess-1"
        assert request.headers["mcp-protocol-version"] == "2025-11-25"
        assert request.headers["accept"] == "application/json, text/event-stream"
    assert fake.deleted == ["sess-1"]


def test_stale_session_404_reinitialises_once_and_retries() -> None:
    fake = FakeBos()
    fake.queue("tools/call", httpx.Response(404, text="session gone"))
    with make(fake) as session:
        result = read(session)
        assert session.session_id == "sess-2"
    assert result.completeness == "complete" and fake.initializes == 2
    assert fake.calls("tools/call")[-1] and fake.requests[-2].headers["mcp-session-id"] == "sess-2"


def test_repeated_404_is_not_an_endless_loop() -> None:
    fake = FakeBos()
    fake.queue("tools/call", httpx.Response(404), httpx.Response(404))
    with make(fake) as session, pytest.raises(Exception) as excinfo:
        read(session)
    assert "HTTP 404" in str(excinfo.value) and fake.initializes == 2


def test_unsupported_negotiated_version_is_refused() -> None:
    fake = FakeBos()
    fake.queue("initialize", lambda b: ok(b["id"], {"protocolVersion": "2024-11-05", "capabilities": {}}))
    with make(fake) as session, pytest.raises(BosProtocolError, match="2024-11-05"):
        session.connect()


def test_tools_list_follows_cursors() -> None:
    fake = FakeBos()
    fake.queue("tools/list", lambda b: ok(b["id"], {"tools": [{"name": "a"}], "nextCursor": "c1"}),
               lambda b: ok(b["id"], {"tools": [{"name": "b"}], "nextCursor": "c2"}),
               lambda b: ok(b["id"], {"tools": [{"name": "c"}]}))
    with make(fake) as session:
        assert [t["name"] for t in session.list_tools()] == ["a", "b", "c"]
    assert [b.get("params", {}).get("cursor") for b in fake.calls("tools/list")] == [None, "c1", "c2"]


def test_request_ids_are_unique_and_non_null() -> None:
    fake = FakeBos()
    with make(fake) as session:
        for _ in range(3):
            session.list_tools()
    ids = [b["id"] for b in fake.bodies if "id" in b]
    assert all(isinstance(i, str) and i for i in ids) and len(set(ids)) == len(ids)


# --- 2026 stateless and era negotiation ------------------------------------------------------------


def test_stateless_headers_and_meta_envelope_with_streaming_opt_in() -> None:
    fake = FakeBos(stateless=True)
    with make(fake, era="2026-07-28") as session:
        read(session)
        assert session.stateless and session.session_id is None
    call = next(r for r in fake.requests if json.loads(r.content).get("method") == "tools/call")
    assert call.headers["mcp-protocol-version"] == "2026-07-28"
    assert call.headers["mcp-method"] == "tools/call" and call.headers["mcp-name"] == "search_people"
    assert "mcp-session-id" not in call.headers
    meta = json.loads(call.content)["params"]["_meta"]
    assert meta["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
    assert meta["io.modelcontextprotocol/clientInfo"]["name"] == "airflow-provider-bos"
    assert meta["io.modelcontextprotocol/clientCapabilities"] == {"experimental": {EXT: {}}}
    discover = json.loads(fake.requests[0].content)
    assert discover["method"] == "server/discover"
    assert discover["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] == {}
    assert fake.deleted == []  # no session to delete


def test_unsafe_tool_name_is_sent_base64_in_mcp_name() -> None:
    fake = FakeBos(stateless=True)
    with make(fake, era="2026-07-28") as session:
        session.call_tool("personnes.recherché", {})
    call = next(r for r in fake.requests if json.loads(r.content).get("method") == "tools/call")
    value = call.headers["mcp-name"]
    assert value.startswith("=?base64?") and value.endswith("?=")
    assert base64.b64decode(value[9:-2]).decode() == "personnes.recherché"


@pytest.mark.parametrize(
    "discover_reply",
    [
        httpx.Response(404, text="Not Found"),
        httpx.Response(405),
        httpx.Response(400, text="Bad Request: missing session"),
        httpx.Response(200, json={"jsonrpc": "2.0", "id": None, "error": {"code": -32601, "message": "no"}}),
        httpx.Response(400, json={"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "init first"}}),
        lambda b: ok(b["id"], {"supportedVersions": ["2025-11-25"], "capabilities": {}}),
        lambda b: httpx.Response(400, json={"jsonrpc": "2.0", "id": b["id"], "error": {
            "code": -32022, "message": "Unsupported", "data": {"supported": ["2025-11-25"], "requested": "x"}}}),
    ],
)
def test_auto_falls_back_to_initialize_when_discover_is_not_supported(discover_reply: Reply) -> None:
    fake = FakeBos()
    fake.queue("server/discover", discover_reply)
    with make(fake, era="auto") as session:
        session.connect()
        assert session.protocol_version == "2025-11-25" and session.session_id == "sess-1"
        assert session.source_results is not None


def test_auto_uses_stateless_when_discover_succeeds() -> None:
    fake = FakeBos(stateless=True)
    with make(fake, era="auto") as session:
        session.connect()
        assert session.stateless and session.source_results == CAPS["experimental"][EXT]
    assert fake.initializes == 0


def test_auto_refuses_a_stateless_only_server_with_no_common_version() -> None:
    fake = FakeBos()
    fake.queue("server/discover", lambda b: httpx.Response(400, json={"jsonrpc": "2.0", "id": b["id"], "error": {
        "code": -32022, "message": "Unsupported", "data": {"supported": ["2027-01-01"], "requested": "2026-07-28"}}}))
    with make(fake, era="auto") as session, pytest.raises(BosJsonRpcError) as excinfo:
        session.connect()
    assert excinfo.value.code == -32022 and "2027-01-01" in str(excinfo.value)


def test_auth_failure_during_the_probe_is_not_an_era_verdict() -> None:
    fake = FakeBos()
    fake.queue("server/discover", httpx.Response(401))
    with make(fake, era="auto") as session, pytest.raises(BosAuthError):
        session.connect()
    assert fake.initializes == 0


@pytest.mark.parametrize(
    ("code", "words"),
    [(-32020, "routing headers"), (-32021, "client capability"), (-32022, "protocol version")],
)
def test_stateless_errors_have_clear_messages(code: int, words: str) -> None:
    fake = FakeBos(stateless=True)
    fake.queue("tools/call", lambda b: httpx.Response(400, json={"jsonrpc": "2.0", "id": b["id"], "error": {
        "code": code, "message": "rejected"}}))
    with make(fake, era="2026-07-28") as session, pytest.raises(BosJsonRpcError, match=words) as excinfo:
        read(session)
    assert excinfo.value.code == code


# --- the stream -------------------------------------------------------------------------------------


def streamed(body_for_id: Callable[[str], bytes | Iterator[bytes]]) -> Callable[[dict], httpx.Response]:
    return lambda body: sse_response(body_for_id(body["id"]))


def test_stream_hands_notifications_to_on_progress_in_wire_order() -> None:
    fake = FakeBos()
    fake.queue("tools/call", streamed(lambda rid: sse(
        ": bos/source-results/v1\n\n",
        notification(rid, 1, 1, records=[record("bos:person:crm-eu:1")]),
        {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info"}},
        {"jsonrpc": "2.0", "id": 99, "method": "ping"},
        ": keepalive\n\n",
        notification(rid, 2, 2, records=[record("bos:person:crm-eu:2")]),
        notification(rid, 3, 2, "complete"),
        {"jsonrpc": "2.0", "id": rid, "result": final_result([record("bos:person:9")])},
    )))
    seen: list[Any] = []
    with make(fake) as session:
        result = read(session, on_progress=seen.append)
    assert [p.sequence for p in seen] == [1, 2, 3]
    assert [p.stats.status for p in seen] == ["running", "running", "complete"]
    assert result.streamed and result.observations.provisional_records == 2
    assert [r.record_ref for r in result.records] == ["bos:person:9"]
    params = json.loads(fake.requests[-2].content)["params"]  # -1 is the DELETE
    assert params["_meta"] == {"io.modelcontextprotocol/clientCapabilities": {"experimental": {EXT: {}}}}


def test_json_answer_to_a_streaming_request_is_the_final_result() -> None:
    fake = FakeBos()
    with make(fake) as session:
        result = read(session)
    assert not result.streamed and result.observations.notifications == 0


# --- a large JSON answer is scanned as its body arrives (not read whole) ---------------------------

def json_body(rid: Any, records: list[dict], *, cut_after: int | None = None,
              pulled: list[int] | None = None) -> httpx.Response:
    """The final result as an application/json body sent in 4 KiB chunks, with no Content-Length.

    ``pulled`` counts the chunks the client has taken; ``cut_after``: the connection fails then.
    """
    data = json.dumps({"jsonrpc": "2.0", "id": rid, "result": final_result(records)}).encode()
    chunks = [data[i:i + 4096] for i in range(0, len(data), 4096)]

    def produce() -> Iterator[bytes]:
        for n, chunk in enumerate(chunks):
            if cut_after is not None and n == cut_after:
                raise httpx.ReadError("connection reset")
            if pulled is not None:
                pulled.append(n)
            yield chunk

    return httpx.Response(200, headers={"content-type": "application/json"}, stream=_IterStream(produce()))


def test_a_large_json_answer_hands_out_records_before_its_body_ends() -> None:
    # Read whole, a 1M-record body (over 1 GB) and its decoded tree were in memory at once.
    records = [record(f"bos:person:{i}") for i in range(600)]
    pulled: list[int] = []
    fake = FakeBos()
    fake.queue("tools/call", lambda b: json_body(b["id"], records, pulled=pulled))
    with make(fake, stream_threshold_bytes=64 * 1024) as session:
        result = read(session, stream_records=True)
        with result:
            assert result.use_known_wire_hashes(WireHashSet([]))  # a scanned frame: re-runs skip known records
            stream = result.records
            got = [next(stream)["record_ref"]]
            total = len(json.dumps(final_result(records))) // 4096
            # The content text (half the body) comes first: the first record came with the next chunks,
            # while the rest of the records were still unread.
            assert len(pulled) < total * 0.6
            got += [r["record_ref"] for r in stream]
            assert got == [r["record_ref"] for r in records]
            assert result.completeness == "complete" and result.result_count == 600 and not result.streamed
        assert session._exchange._inflight is None


def test_a_json_answer_cut_mid_body_raises_from_the_records() -> None:
    fake = FakeBos()
    fake.queue("tools/call", lambda b: json_body(b["id"], [record(f"r{i}") for i in range(600)], cut_after=40))
    with make(fake, stream_threshold_bytes=0) as session:
        result = read(session, stream_records=True)
        with pytest.raises(BosIncompleteStreamError, match="while reading the response to tools/call"):
            list(result.records)
        with pytest.raises(BosResultError, match="record stream failed"):
            _ = result.completeness
        assert session._exchange._inflight is None


def test_a_json_answer_that_is_no_result_is_decoded_whole_and_says_what_it_is() -> None:
    # Scanned or not, a JSON-RPC error and a body that is not JSON fail as they always did.
    for threshold in (0, 1024 * 1024):
        fake = FakeBos()
        fake.queue("tools/call", lambda b: httpx.Response(
            200, json={"jsonrpc": "2.0", "id": b["id"], "error": {"code": -32000, "message": "boom"}}))
        fake.queue("tools/call", httpx.Response(200, text="<html>", headers={"content-type": "application/json"}))
        with make(fake, stream_threshold_bytes=threshold) as session:
            with pytest.raises(BosJsonRpcError, match="boom"):
                read(session, stream_records=True)
            with pytest.raises(BosProtocolError, match="not valid JSON"):
                read(session, stream_records=True)


def test_a_json_answer_is_scanned_unless_its_content_length_is_under_the_threshold() -> None:
    fake = FakeBos()
    fake.queue("tools/call", lambda b: json_body(b["id"], [record("bos:person:1")]))
    with make(fake) as session:  # no Content-Length: scanned as it arrives, whatever its size
        result = read(session, stream_records=True)
        assert result.use_known_wire_hashes(WireHashSet([]))
        assert [r["record_ref"] for r in result.records] == ["bos:person:1"]
    fake = FakeBos()  # FakeBos's default answer has a Content-Length under the threshold
    with make(fake) as session:
        result = read(session, stream_records=True)
        assert not result.use_known_wire_hashes(WireHashSet([]))  # read whole: nothing left to skip
        assert [r["record_ref"] for r in result.records] == ["bos:person:1"]


def test_a_json_reply_read_whole_is_bounded_like_an_event() -> None:
    # An SSE event over max_event_bytes always failed (BosEventTooLarge); a JSON body read whole
    # was read to its end, whatever its size. Now both stop at the same bound, before reading on.
    big = {"tools": [{"name": f"tool_{i}", "description": "x" * 200, "inputSchema": {"type": "object"}}
                     for i in range(100)]}
    for sized in (True, False):  # with a Content-Length (refused unread) and without (stopped midway)
        fake = FakeBos()

        def answer(b: dict, sized: bool = sized) -> httpx.Response:
            d = json.dumps({"jsonrpc": "2.0", "id": b["id"], "result": big}).encode()
            pieces = [d[i:i + 1024] for i in range(0, len(d), 1024)]
            body = {"content": d} if sized else {"stream": _IterStream(iter(pieces))}
            return httpx.Response(200, headers={"content-type": "application/json"}, **body)

        fake.queue("tools/list", answer)
        fake.queue("tools/call", lambda b: ok(b["id"], final_result([record(f"bos:person:{i}") for i in range(100)])))
        with make(fake, max_event_bytes=10_000) as session:
            # Not a read's result: the answer bound, never above max_event_bytes.
            with pytest.raises(BosAnswerTooLarge, match=r"tools/list with more than 10000 bytes"):
                session.list_tools()
            # A read's result held whole (stream_records=False) is built from its scanned records:
            # no body is held whole, so it passes under a bound below its size.
            assert len(read(session).records) == 100
    fake = FakeBos()
    fake.queue("tools/call", lambda b: httpx.Response(
        200, headers={"content-type": "application/json"}, stream=_IterStream(
            iter([json.dumps({"jsonrpc": "2.0", "id": b["id"],
                              "error": {"code": -1, "message": "x" * 20_000}}).encode()]))))
    with make(fake, max_event_bytes=10_000) as session:
        # Scanned, then read whole (not a response): decoded whole, so it has the answer bound.
        with pytest.raises(BosAnswerTooLarge, match="more than 10000 bytes"):
            read(session, stream_records=True)
        assert [t["name"] for t in session.list_tools()] == ["search_people"]  # under the bound: as before


def test_a_small_event_bound_still_lets_a_large_read_stream() -> None:
    # The stream threshold stays under max_event_bytes: at 1 MiB each (the defaults' ratio broken),
    # a streamed final result would have hit the bound before it could switch to streaming.
    fake = FakeBos()
    records = [record(f"bos:person:{i}") for i in range(400)]
    fake.queue("tools/call", lambda b: json_body(b["id"], records))
    with make(fake, max_event_bytes=20_000) as session:
        assert session.stream_threshold_bytes <= 10_000
        result = read(session, stream_records=True)
        assert [r["record_ref"] for r in result.records] == [r["record_ref"] for r in records]
    with pytest.raises(BosConfigurationError, match="max_event_bytes must be a positive number"):
        McpSession("http://127.0.0.1:9/mcp", max_event_bytes=0)


def test_a_compressed_event_stream_streams_under_a_small_event_bound() -> None:
    # One 64 KiB gzip chunk decodes to megabytes of one event's data line: fed whole, the event's
    # buffer passed max_event_bytes before it could switch to streaming (BosEventTooLarge).
    records = [record(f"bos:person:{i}") for i in range(40_000)]

    def answer(b: dict) -> httpx.Response:
        data = gzip.compress(sse({"jsonrpc": "2.0", "id": b["id"], "result": final_result(records)}))
        return httpx.Response(200, headers={"content-type": "text/event-stream", "content-encoding": "gzip"},
                              stream=_IterStream(iter([data[i:i + 65536] for i in range(0, len(data), 65536)])))

    fake = FakeBos()
    fake.queue("tools/call", answer)
    with make(fake, max_event_bytes=1024 * 1024) as session:
        result = read(session, stream_records=True)
        assert sum(1 for _ in result.records) == len(records) and result.completeness == "complete"


@pytest.mark.parametrize("stream_records", [True, False])
def test_a_page_over_the_event_bound_fails_naming_the_connection_field(stream_records: bool) -> None:
    page = [record(f"bos:person:{i}") | {"attributes": {"blob": "x" * 12_000}} for i in range(100)]  # ~1.2 MB

    def answer(b: dict) -> httpx.Response:
        body = sse(notification(b["id"], 1, 0, records=page),
                   {"jsonrpc": "2.0", "id": b["id"], "result": final_result([record("bos:person:a")])})
        return sse_response(iter([body[i:i + 65536] for i in range(0, len(body), 65536)]))

    fake = FakeBos()
    fake.queue("tools/call", answer)
    with make(fake, max_event_bytes=1024 * 1024) as session, pytest.raises(BosProtocolError) as failed:
        result = read(session, stream_records=stream_records)
        list(result.records)
    assert "max_event_mib" in str(failed.value)


def gzipped_json(payload: dict, *, sized: bool) -> httpx.Response:
    data = gzip.compress(json.dumps(payload).encode())
    pieces = [data[i:i + 512] for i in range(0, len(data), 512)]
    body = {"content": data} if sized else {"stream": _IterStream(iter(pieces))}
    return httpx.Response(200, headers={"content-type": "application/json", "content-encoding": "gzip"}, **body)


def test_a_compressed_json_answer_is_measured_decoded() -> None:
    # Content-Length counts the compressed bytes: it can neither waive the bound nor send a large
    # result down the read-whole path.
    big = {"tools": [{"name": f"tool_{i}", "description": "x" * 2000, "inputSchema": {"type": "object"}}
                     for i in range(50)]}  # ~100 kB decoded, ~2 kB compressed
    records = [record(f"bos:person:{i}") for i in range(300)]
    for sized in (True, False):
        fake = FakeBos()
        fake.queue("tools/list", lambda b, sized=sized: gzipped_json(
            {"jsonrpc": "2.0", "id": b["id"], "result": big}, sized=sized))
        fake.queue("tools/call", lambda b, sized=sized: gzipped_json(
            {"jsonrpc": "2.0", "id": b["id"], "result": final_result(records)}, sized=sized))
        with make(fake, max_event_bytes=50_000, stream_threshold_bytes=20_000) as session:
            with pytest.raises(BosAnswerTooLarge, match="more than 50000 bytes"):
                session.list_tools()
            result = read(session, stream_records=True)
            assert result.use_known_wire_hashes(WireHashSet([]))  # scanned: its decoded size is over the threshold
            assert [r["record_ref"] for r in result.records] == [r["record_ref"] for r in records]


def test_a_corrupt_compressed_json_answer_is_an_incomplete_read() -> None:
    fake = FakeBos()
    fake.queue("tools/call", lambda b: httpx.Response(200, headers={
        "content-type": "application/json", "content-encoding": "gzip"},
        stream=_IterStream(iter([b"not gzip at all"]))))
    with make(fake, stream_threshold_bytes=0) as session, pytest.raises(BosIncompleteStreamError):
        read(session, stream_records=True)


def test_a_json_answer_for_another_request_is_refused_before_any_record() -> None:
    fake = FakeBos()
    fake.queue("tools/call", lambda b: json_body("someone-else", [record(f"r{i}") for i in range(600)]))
    with make(fake) as session, pytest.raises(BosResultError, match="does not match the request id"):
        read(session, stream_records=True)


def test_a_json_body_that_never_says_what_it_is_is_bounded() -> None:
    pulled: list[int] = []

    def whitespace() -> Iterator[bytes]:
        yield b'{"jsonrpc"'
        for n in range(10_000):  # 40 MB of nothing, unless the reader stops at its bound
            pulled.append(n)
            yield b" " * 4096

    fake = FakeBos()
    fake.queue("tools/call", lambda b: httpx.Response(200, headers={"content-type": "application/json"},
                                                      stream=_IterStream(whitespace())))
    with make(fake, max_event_bytes=10_000, stream_threshold_bytes=0) as session:
        with pytest.raises(BosAnswerTooLarge, match="more than 10000 bytes"):  # not a result: the answer bound
            read(session, stream_records=True)
    assert len(pulled) <= 3


def test_no_opt_in_when_not_streaming_or_not_advertised() -> None:
    fake = FakeBos()
    with make(fake) as session:
        read(session, stream=False)
    assert "_meta" not in fake.calls("tools/call")[-1]["params"]
    fake = FakeBos()
    fake.queue("initialize", lambda b: ok(b["id"], {"protocolVersion": "2025-11-25", "capabilities": {}},
                                          {"mcp-session-id": "s"}))
    with make(fake) as session:
        read(session)
    assert "_meta" not in fake.calls("tools/call")[-1]["params"]


def test_eof_before_final_is_incomplete_with_observations() -> None:
    fake = FakeBos()
    fake.queue("tools/call", streamed(lambda rid: sse(
        notification(rid, 1, 1, records=[record("a")]), notification(rid, 2, 1, "complete"))))
    with make(fake) as session, pytest.raises(BosIncompleteStreamError) as excinfo:
        read(session)
    assert excinfo.value.observations.notifications == 2
    assert excinfo.value.observations.summary()[0]["status"] == "complete"
    assert len(fake.calls("tools/call")) == 1  # never retried once the stream started


def test_connection_reset_mid_final_frame_is_incomplete() -> None:
    def chunks(rid: str) -> Iterator[bytes]:
        yield sse(notification(rid, 1, 0, "complete"))
        yield b'event: message\ndata: {"jsonrpc": "2.0", "id": "' + rid.encode() + b'", "res'
        raise httpx.ReadError("connection reset by peer")

    fake = FakeBos()
    fake.queue("tools/call", streamed(chunks))
    with make(fake) as session, pytest.raises(BosIncompleteStreamError) as excinfo:
        read(session)
    assert "ReadError" in str(excinfo.value) and excinfo.value.observations.notifications == 1


def test_wrong_final_id_in_the_stream() -> None:
    fake = FakeBos()
    fake.queue("tools/call", streamed(lambda rid: sse(
        {"jsonrpc": "2.0", "id": "someone-else", "result": final_result([])})))
    with make(fake) as session, pytest.raises(BosResultError, match="does not match the request id"):
        read(session)


def test_wrong_final_id_in_a_json_answer() -> None:
    fake = FakeBos()
    fake.queue("tools/call", lambda b: ok("someone-else", final_result([])))
    with make(fake) as session, pytest.raises(BosResultError, match="does not match"):
        read(session)


def test_json_rpc_error_as_final_frame() -> None:
    fake = FakeBos()
    fake.queue("tools/call", streamed(lambda rid: sse(
        {"jsonrpc": "2.0", "id": rid, "error": {"code": -32603, "message": "source execution failed"}})))
    with make(fake) as session, pytest.raises(BosJsonRpcError) as excinfo:
        read(session)
    assert excinfo.value.code == -32603 and excinfo.value.method == "tools/call"


def test_malformed_final_result() -> None:
    fake = FakeBos()
    fake.queue("tools/call", streamed(lambda rid: sse(
        {"jsonrpc": "2.0", "id": rid, "result": {"content": [], "structuredContent": {"metadata": {}}}})))
    with make(fake) as session, pytest.raises(BosResultError, match="no record array"):
        read(session)


def test_final_records_without_record_ref() -> None:
    bad = record("x")
    del bad["record_ref"]
    fake = FakeBos()
    fake.queue("tools/call", streamed(lambda rid: sse(
        {"jsonrpc": "2.0", "id": rid, "result": final_result([record("a"), bad])})))
    with make(fake) as session, pytest.raises(BosResultError, match=r"Record 1 .* no record_ref"):
        read(session)


def test_invalid_notification_ends_the_read() -> None:
    fake = FakeBos()
    fake.queue("tools/call", streamed(lambda rid: sse(notification("other", 1, 1))))
    with make(fake) as session, pytest.raises(BosStreamValidationError) as excinfo:
        read(session)
    assert excinfo.value.rule == "request-id"  # type: ignore[attr-defined]


def test_on_progress_exception_propagates_and_stops_reading() -> None:
    delivered: list[int] = []

    def chunks(rid: str) -> Iterator[bytes]:
        for seq in (1, 2, 3):
            delivered.append(seq)
            yield sse(notification(rid, seq, seq))

    class Boom(Exception):
        pass

    def on_progress(progress: Any) -> None:
        raise Boom(progress.sequence)

    fake = FakeBos()
    fake.queue("tools/call", streamed(chunks))
    with make(fake) as session, pytest.raises(Boom):
        read(session, on_progress=on_progress)
    assert delivered == [1]


def test_oversized_event_is_a_typed_error() -> None:
    # A read's final event larger than max_event_bytes is scanned record by record (held whole or
    # not); an event that cannot be scanned (not a message event) is held, and bounded.
    final = {"jsonrpc": "2.0", "id": None, "result": final_result([record("a")] * 50)}
    fake = FakeBos()
    fake.queue("tools/call", streamed(lambda rid: sse({**final, "id": rid})))
    fake.queue("tools/call", streamed(lambda rid: sse("event: other\ndata: " + "x" * 2000 + "\n\n",
                                                     {**final, "id": rid})))
    with make(fake, max_event_bytes=1000) as session:
        assert len(read(session).records) == 50
        with pytest.raises(Exception) as excinfo:
            read(session)
    assert type(excinfo.value).__name__ == "BosEventTooLarge"


def test_keepalive_stall_ends_at_the_deadline() -> None:
    def keepalives(rid: str) -> Iterator[bytes]:
        while True:
            time.sleep(0.01)  # the simulated server's keepalive interval
            yield b": keepalive\n\n"

    fake = FakeBos()
    fake.queue("tools/call", streamed(keepalives))
    with make(fake) as session, pytest.raises(BosDeadlineExceeded):
        read(session, deadline_s=0.3)


def test_cancel_from_another_thread() -> None:
    started = threading.Event()

    def endless(rid: str) -> Iterator[bytes]:
        yield sse(notification(rid, 1, 1))
        started.set()
        while True:
            time.sleep(0.01)
            yield b": keepalive\n\n"

    fake = FakeBos()
    fake.queue("tools/call", streamed(endless))
    with make(fake) as session:
        timer = threading.Thread(target=lambda: (started.wait(5), session.cancel()))
        timer.start()
        with pytest.raises(BosReadCancelled) as excinfo:
            read(session)
        timer.join()
    assert excinfo.value.observations.notifications == 1


def test_cancel_while_idle_does_not_poison_the_next_read() -> None:
    fake = FakeBos()
    with make(fake) as session:
        session.cancel()
        assert read(session).completeness == "complete"


def test_execute_uses_the_default_context() -> None:
    fake = FakeBos()
    contexts = {"contract_version": "bos-identity-mcp/v2", "contexts": [
        {"context_handle": "ctx-a", "is_default": False}, {"context_handle": "ctx-b", "is_default": True}]}

    def get_context(body: dict) -> httpx.Response:
        return ok(body["id"], {"content": [], "structuredContent": contexts, "isError": False})

    def execute(body: dict) -> httpx.Response:
        sc = {"contract_version": "v2", "context": {"context_handle": "ctx-b"},
              "result": {"result": [record("a")], "metadata": {"completeness": "complete", "result_count": 1}}}
        return ok(body["id"], {"content": [], "structuredContent": sc, "isError": False,
                               "_meta": {"bos/context": {"context_handle": "ctx-b"}}})

    fake.queue("tools/call", get_context, execute)
    with make(fake) as session:
        result = session.federated_read("people.search", {"q": 1}, via="auto")
    call = fake.calls("tools/call")[-1]["params"]
    assert call["name"] == "bos_execute"
    assert call["arguments"] == {"context_handle": "ctx-b", "tool_name": "people.search", "arguments": {"q": 1}}
    assert result.tool_style == "execute" and result.context is not None and result.context.context_handle == "ctx-b"


def test_ten_thousand_notifications_arrive_complete_and_in_order() -> None:
    def chunks(rid: str) -> Iterator[bytes]:
        body = b"".join(sse(notification(rid, seq, seq, records=[record(f"r{seq}")])) for seq in range(1, 10_001))
        body += sse(notification(rid, 10_001, 10_000, "complete"),
                    {"jsonrpc": "2.0", "id": rid, "result": final_result([record("a")])})
        for i in range(0, len(body), 7919):  # odd-sized chunks split events and lines anywhere
            yield body[i : i + 7919]

    fake = FakeBos()
    fake.queue("tools/call", streamed(chunks))
    seen: list[int] = []
    with make(fake) as session:
        result = read(session, on_progress=lambda p: seen.append(p.sequence))
    assert seen == list(range(1, 10_002))
    assert result.observations.pages == 10_000 and result.observations.provisional_records == 10_000

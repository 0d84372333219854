"""Stream resumption (MCP 2025-11-25): a dropped response stream is reopened with GET + Last-Event-ID.

Byte-level cases run over ``httpx.MockTransport`` (exact headers, replays, refusals, bounds); the
end-to-end cases run against the reference server, whose scenario knobs close or reset the POST
response and then serve the rest of the stream from its event store.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from mcphelpers import Bearer

from airflow_provider_bos.exceptions import (
    BosDeadlineExceeded,
    BosFinalFrameRestarted,
    BosIncompleteStreamError,
    BosReadCancelled,
    BosStreamIdleTimeout,
)
from airflow_provider_bos.mcp import McpSession, RetryPolicy
from airflow_provider_bos.mcp.event_stream import MAX_RESUME_ATTEMPTS, MIN_RETRY_MS, Reconnect
from airflow_provider_bos.testing.scenario import FaultSpec, load_scenario

URL = "https://bos.example/mcp/apps/bos/platform"
EXT = "bos/source-results/v1"
CAPS = {"tools": {}, "experimental": {EXT: {"pageSize": 100, "maxConcurrentSources": 8, "contractUri": "x"}}}
CRM = {"source_type": "crm", "source_identity": "crm-eu"}
FAST = RetryPolicy(attempts=1)
SESSION_ID = "sess-9"


def record(ref: str) -> dict[str, Any]:
    return {"record_ref": ref, "display_name": "N", "attributes": {},
            "sources": [{**CRM, "external_id": ref, "record_type": "person",
                         "observed_at": "2026-10-08T12:00:00Z", "capabilities": ["read"]}]}


RECORDS = [record(f"bos:person:{i}") for i in range(40)]


def final_message(rid: str, records: list[dict[str, Any]] = RECORDS) -> dict[str, Any]:
    structured = {"result": records, "metadata": {"completeness": "complete", "result_count": len(records)}}
    return {"jsonrpc": "2.0", "id": rid, "result": {
        "content": [{"type": "text", "text": "x"}], "structuredContent": structured, "isError": False}}


def notification(rid: str, seq: int, page: int, status: str = "page") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/bos/source_result",
            "params": {"requestId": rid, "sequence": seq, "pageIndex": page, "source": CRM,
                       "records": [RECORDS[seq]] if status == "page" else [], "status": status}}


def event(event_id: str | None, message: dict[str, Any] | None = None, *, retry: int | None = None) -> bytes:
    out = b""
    if event_id is not None:
        out += f"id: {event_id}\n".encode()
    if retry is not None:
        out += f"retry: {retry}\n".encode()
    out += (b"data: " + json.dumps(message).encode() + b"\n" if message is not None else b"data:\n")
    return out + b"\n"


class _Chunks(httpx.SyncByteStream):
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self._chunks


def sse(chunks: Iterator[bytes] | list[bytes]) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Chunks(iter(chunks)))


class ResumingBos:
    """A 2025-era server whose tools/call stream is ``post(rid)`` and whose GETs are ``gets`` in turn."""

    def __init__(self, post: Callable[[str], Iterator[bytes]], *gets: Callable[[str], httpx.Response]) -> None:
        self.post = post
        self.gets = list(gets)
        self.get_requests: list[httpx.Request] = []
        self.rid = ""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            self.get_requests.append(request)
            reply = self.gets.pop(0) if len(self.gets) > 1 else self.gets[0]
            return reply(self.rid)
        if request.method == "DELETE":
            return httpx.Response(200)
        body = json.loads(request.content)
        method, rid = body.get("method"), body.get("id")
        if method == "initialize":
            return httpx.Response(200, headers={"mcp-session-id": SESSION_ID}, json={
                "jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": "2025-11-25", "capabilities": CAPS}})
        if method == "notifications/initialized":
            return httpx.Response(202)
        if method == "tools/call":
            self.rid = rid
            return sse(self.post(rid))
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}})


def make(fake: ResumingBos, sleeps: list[float] | None = None, **kwargs: Any) -> McpSession:
    session = McpSession(URL, http_client=httpx.Client(transport=httpx.MockTransport(fake)), era="2025-11-25",
                         retry=FAST, **kwargs)
    if sleeps is not None:  # record the waits instead of waiting (the cancel check still applies)
        http = session._exchange
        http.reconnect = Reconnect(reopen=http.reopen_stream, release=http.release,
                                   sleep=lambda s: (sleeps.append(s), http.sleep(0)))
    return session


def read(session: McpSession, **kwargs: Any) -> Any:
    return session.federated_read("search_people", {"query": "a"}, via="direct", **kwargs)


def two_pages_then(ending: str) -> Callable[[str], Iterator[bytes]]:
    """Priming (retry 7 ms), two notifications, then the stream ends ("eof") or breaks ("reset")."""

    def post(rid: str) -> Iterator[bytes]:
        yield event("a.0", retry=7)
        yield event("a.1", notification(rid, 1, 1)) + event("a.2", notification(rid, 2, 2))
        if ending == "reset":
            raise httpx.ReadError("connection reset by peer")

    return post


def replay_then_final(rid: str) -> httpx.Response:
    # A server may send again what it is unsure was delivered: the notification of a.2 again.
    return sse([event("a.2", notification(rid, 2, 2)), event("a.3", notification(rid, 3, 2, "complete")),
                event("a.4", final_message(rid))])


# --- byte level -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ending", ["eof", "reset"])
def test_a_stream_that_drops_before_the_final_is_resumed_after_its_last_event_id(ending: str) -> None:
    fake = ResumingBos(two_pages_then(ending), replay_then_final)
    sleeps: list[float] = []
    with make(fake, sleeps) as session:
        result = read(session)
    assert [r.record_ref for r in result.records] == [r["record_ref"] for r in RECORDS]
    assert result.completeness == "complete"
    [get] = fake.get_requests
    assert get.headers["last-event-id"] == "a.2"
    assert get.headers["accept"] == "text/event-stream"
    assert get.headers["mcp-session-id"] == SESSION_ID and get.headers["mcp-protocol-version"] == "2025-11-25"
    assert sleeps == [MIN_RETRY_MS / 1000]  # the server's retry of 7 ms, raised to the floor
    observations = result.observations
    # The replayed notification is not counted twice.
    assert observations.notifications == 3 and observations.replays_skipped == 1
    assert observations.stream_resumptions == 1


def test_a_refused_get_leaves_the_read_without_a_result_and_says_why() -> None:
    fake = ResumingBos(two_pages_then("eof"), lambda rid: httpx.Response(405, text="Method Not Allowed"))
    with make(fake, []) as session, pytest.raises(BosIncompleteStreamError, match="refused to resume it: HTTP 405"):
        read(session)
    assert len(fake.get_requests) == 1


def test_reconnects_that_keep_failing_are_bounded() -> None:
    fake = ResumingBos(two_pages_then("reset"), lambda rid: httpx.Response(503))
    sleeps: list[float] = []
    with make(fake, sleeps) as session, pytest.raises(
            BosIncompleteStreamError, match=f"resuming the stream failed {MAX_RESUME_ATTEMPTS} times"):
        read(session)
    assert len(fake.get_requests) == len(sleeps) == MAX_RESUME_ATTEMPTS


def test_a_server_that_keeps_closing_without_progress_is_given_up() -> None:
    # Every GET answers with nothing new and ends: no new event id, so each counts as a failed attempt.
    fake = ResumingBos(two_pages_then("eof"), lambda rid: sse([b": keepalive\n\n"]))
    with make(fake, []) as session, pytest.raises(BosIncompleteStreamError, match="failed 5 times"):
        read(session)
    assert len(fake.get_requests) == MAX_RESUME_ATTEMPTS


def test_a_stream_without_event_ids_is_not_resumed() -> None:
    def post(rid: str) -> Iterator[bytes]:
        yield event(None, notification(rid, 1, 1))

    fake = ResumingBos(post, replay_then_final)
    with make(fake, []) as session, pytest.raises(BosIncompleteStreamError, match="carried no event ids"):
        read(session)
    assert fake.get_requests == []


def test_resumption_waits_only_within_the_read_deadline() -> None:
    def post(rid: str) -> Iterator[bytes]:
        yield event("a.0", retry=20_000)  # 20 s before a reconnect: longer than the deadline
        yield event("a.1", notification(rid, 1, 1))

    fake = ResumingBos(post, replay_then_final)
    with make(fake, []) as session, pytest.raises(BosDeadlineExceeded):
        read(session, deadline_s=2.0)
    assert fake.get_requests == []


def test_the_stream_idle_timeout_is_not_resumed() -> None:
    def post(rid: str) -> Iterator[bytes]:
        yield event("a.0") + event("a.1", notification(rid, 1, 1))
        raise httpx.ReadTimeout("timed out")

    fake = ResumingBos(post, replay_then_final)
    with make(fake, []) as session, pytest.raises(BosStreamIdleTimeout):
        read(session)
    assert fake.get_requests == []


def test_a_cancel_while_waiting_to_resume_ends_the_read() -> None:
    fake = ResumingBos(two_pages_then("reset"), replay_then_final)
    session = make(fake)
    http = session._exchange
    http.reconnect = Reconnect(reopen=http.reopen_stream, release=http.release,
                               sleep=lambda s: (session.cancel(), http.sleep(s)))
    with session, pytest.raises(BosReadCancelled):
        read(session)
    assert fake.get_requests == []


def _frame_bytes(rid: str) -> bytes:
    return b"id: a.2\ndata: " + json.dumps(final_message(rid)).encode() + b"\n\n"


def test_a_final_frame_cut_among_its_records_restarts_them() -> None:
    def post(rid: str) -> Iterator[bytes]:
        yield event("a.0") + event("a.1", notification(rid, 1, 0, "complete"))
        frame = _frame_bytes(rid)
        yield frame[: frame.index(b"bos:person:30")]  # 30 records are whole
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    fake = ResumingBos(post, lambda rid: sse([_frame_bytes(rid)]))
    with make(fake, [], stream_threshold_bytes=0) as session:  # every event streams
        result = read(session, stream_records=True)
        taken = []
        with pytest.raises(BosFinalFrameRestarted) as excinfo:
            for r in result.records:
                taken.append(r["record_ref"])
        assert 0 < len(taken) < len(RECORDS)
        again = [r["record_ref"] for r in excinfo.value.records]
    assert again == [r["record_ref"] for r in RECORDS]  # the whole frame, from its first record
    assert result.completeness == "complete" and result.result_count == len(RECORDS)
    assert result.records_consumed == len(RECORDS)
    assert fake.get_requests[0].headers["last-event-id"] == "a.1"


def test_a_final_frame_cut_before_any_record_was_handed_out_goes_on_without_a_restart() -> None:
    def post(rid: str) -> Iterator[bytes]:
        yield event("a.0") + event("a.1", notification(rid, 1, 0, "complete"))
        frame = _frame_bytes(rid)
        yield frame[: frame.index(b"structuredContent")]  # the records have not started
        raise httpx.ReadError("connection reset by peer")

    fake = ResumingBos(post, lambda rid: sse([_frame_bytes(rid)]))
    with make(fake, [], stream_threshold_bytes=0) as session:
        result = read(session, stream_records=True)
        refs = [r["record_ref"] for r in result.records]
    assert refs == [r["record_ref"] for r in RECORDS] and result.completeness == "complete"


# --- against the reference server ----------------------------------------------------------------------


def server_read(factory: Any, *, stream_records: bool = False, scenario: str = "identity_merge",
                **faults: Any) -> tuple[Any, Any, list[str]]:
    """(server, result, record_refs) of one 2025-era streamed read through bos_execute."""
    plan = load_scenario(scenario)
    plan.faults = FaultSpec(sse_retry_ms=10, **faults)
    server = factory(scenario=plan)
    with McpSession(server.mcp_url, auth=Bearer(server.mint_grant()["access_token"]), era="2025-11-25",
                    retry=FAST, timeout=20.0, stream_threshold_bytes=0 if stream_records else 1 << 20) as session:
        result = session.federated_read("people.search", {}, via="execute", stream_records=stream_records)
        refs: list[str] = []
        records: Any = result.records
        while True:
            try:
                refs += [r["record_ref"] if isinstance(r, dict) else r.record_ref for r in records]
                break
            except BosFinalFrameRestarted as restart:
                refs, records = [], restart.records
                server.restarts = getattr(server, "restarts", 0) + 1
    return server, result, refs


@pytest.mark.parametrize("faults", [{"close_after_events": 3}, {"drop_before_final": True},
                                    {"drop_mid_final": True}, {"close_mid_final_bytes": 2000}],
                         ids=["closed-after-3-events", "reset-before-final", "reset-mid-final", "closed-mid-final"])
def test_the_reference_server_resumes_and_the_read_equals_an_uninterrupted_one(
        bos_server_factory: Any, faults: dict[str, Any]) -> None:
    _, clean, clean_refs = server_read(bos_server_factory)
    server, result, refs = server_read(bos_server_factory, **faults)
    assert refs == clean_refs and result.completeness == clean.completeness == "complete"
    assert server.counters.streamed_calls == 1 and server.counters.resumed_streams == 1  # one call, resumed once
    assert result.observations.notifications == clean.observations.notifications
    assert result.observations.provisional_records == clean.observations.provisional_records
    assert result.observations.stream_resumptions == 1


def test_records_handed_out_before_a_cut_are_restarted_and_come_once(bos_server_factory: Any) -> None:
    _, _, clean_refs = server_read(bos_server_factory, stream_records=True)
    server, result, refs = server_read(bos_server_factory, stream_records=True, close_mid_records_bytes=3000)
    assert refs == clean_refs and len(set(refs)) == len(refs) == result.result_count
    assert server.counters.resumed_streams == 1 and server.restarts == 1  # records had been handed out


def test_a_server_that_cannot_resume_leaves_the_read_incomplete(bos_server_factory: Any) -> None:
    with pytest.raises(BosIncompleteStreamError, match="no event ids"):
        server_read(bos_server_factory, close_after_events=3, resumable=False)


def test_a_hostile_event_id_is_logged_escaped_and_cut(caplog: pytest.LogCaptureFixture) -> None:
    """The event id is server text: the resumption warning shows it with control characters escaped
    and cut short (no terminal escapes or forged log lines), while the Last-Event-ID sent stays exact."""
    hostile = "a.2\x1b[2J\x1b]0;owned\x07" + "z" * 500

    def post(rid: str) -> Iterator[bytes]:
        yield event("a.0", retry=7)
        yield event("a.1", notification(rid, 1, 1)) + event(hostile, notification(rid, 2, 2))

    fake = ResumingBos(post, replay_then_final)
    with caplog.at_level("WARNING", logger="airflow_provider_bos.mcp.event_stream"), make(fake, []) as session:
        result = read(session)
    assert result.completeness == "complete"
    assert fake.get_requests[0].headers["last-event-id"] == hostile
    [warning] = [r.getMessage() for r in caplog.records if "resuming after event" in r.getMessage()]
    assert "\x1b" not in warning and "\\x1b[2J" in warning
    assert "z" * 100 not in warning

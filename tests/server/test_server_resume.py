"""Reference server: SSE priming events, event ids, GET + Last-Event-ID resumption and the stream knobs.

Plain httpx over loopback in the 2025-11-25 session era (the era with resumption), with a
test-local SSE reader that keeps what resumption is about: ids, retry, comments and the bytes
of an event cut off before its blank line.
"""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
from pydantic import ValidationError

from airflow_provider_bos.testing.scenario import FaultSpec, load_scenario

P2025, P2026 = "2025-11-25", "2026-07-28"
EXT = "bos/source-results/v1"
ACCEPT_BOTH = "application/json, text/event-stream"
CLIENT_INFO = {"name": "resume-tests", "version": "1"}


def read_sse(raw: bytes) -> tuple[list[dict], list[str]]:
    """(events, comments): each event has ``id`` (in effect at its blank line), ``retry`` (its own), ``data``."""
    events: list[dict] = []
    comments: list[str] = []
    data: list[str] | None = None
    last_id = retry = None
    for line in re.split(r"\r\n|\r|\n", raw.decode("utf-8").removeprefix("\ufeff"))[:-1]:
        if line == "":
            if data is not None:
                events.append({"id": last_id, "retry": retry, "data": "\n".join(data)})
            data, retry = None, None
        elif line.startswith(":"):
            comments.append(line[1:].strip())
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                data = [*(data or []), value]
            elif name == "id":
                last_id = value
            elif name == "retry":
                retry = int(value)
    return events, comments


def messages(events: list[dict]) -> list[tuple[str, dict]]:
    """(id, JSON-RPC message) of each non-empty event."""
    return [(e["id"], json.loads(e["data"])) for e in events if e["data"]]


class Session:
    """A 2025-11-25 session: POST a streamed people.search, GET to resume."""

    def __init__(self, server, era: str = P2025) -> None:
        self.server = server
        self.era = era
        token = server.mint_grant()["access_token"]
        self.http = httpx.Client(timeout=20, headers={"Authorization": f"Bearer {token}"})
        self.session_id: str | None = None
        if era == P2025:
            init = self.http.post(server.mcp_url, headers=self.headers(), json={
                "jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": P2025, "capabilities": {}, "clientInfo": CLIENT_INFO}})
            self.session_id = init.headers["mcp-session-id"]
            self.capabilities = init.json()["result"]["capabilities"]
            self.http.post(server.mcp_url, headers=self.headers(),
                           json={"jsonrpc": "2.0", "method": "notifications/initialized"})

    def headers(self, **extra: str) -> dict[str, str]:
        headers = {"Accept": ACCEPT_BOTH, "Content-Type": "application/json", **extra}
        if self.era == P2026:
            headers |= {"MCP-Protocol-Version": P2026, "Mcp-Method": "tools/call",
                        "Mcp-Name": "search_people"}
        elif self.session_id is not None:
            headers |= {"Mcp-Session-Id": self.session_id, "MCP-Protocol-Version": P2025}
        return headers

    def read(self) -> bytes:
        """POST a streamed search_people; every byte until the server ends the response."""
        meta: dict = {"io.modelcontextprotocol/clientCapabilities": {"experimental": {EXT: {}}}}
        if self.era == P2026:
            meta |= {"io.modelcontextprotocol/protocolVersion": P2026,
                     "io.modelcontextprotocol/clientInfo": CLIENT_INFO}
        body = {"jsonrpc": "2.0", "id": "r-1", "method": "tools/call",
                "params": {"name": "search_people", "arguments": {}, "_meta": meta}}
        with self.http.stream("POST", self.server.mcp_url, headers=self.headers(), json=body) as response:
            assert response.status_code == 200
            return b"".join(response.iter_raw())

    def resume(self, last_event_id: str | None) -> httpx.Response:
        extra = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
        return self.http.get(self.server.mcp_url, headers=self.headers(**extra))

    def close(self) -> None:
        self.http.close()


@pytest.fixture()
def open_session():
    made: list[Session] = []

    def make(server, era: str = P2025) -> Session:
        made.append(Session(server, era))
        return made[-1]

    yield make
    for session in made:
        session.close()


def server_with(factory, name: str = "complete", **faults):
    scenario = load_scenario(name)
    scenario.faults = FaultSpec(**faults)
    return factory(scenario=scenario)


def uninterrupted(factory, open_session, name: str = "complete") -> list[dict]:
    """The messages of the same read when nothing interrupts it."""
    return [m for _, m in messages(read_sse(open_session(server_with(factory, name)).read())[0])]


# -- priming and ids ------------------------------------------------------------------------------------

def test_stream_opens_with_a_priming_event_and_every_message_has_the_next_id(bos_server, open_session):
    events, comments = read_sse(open_session(bos_server).read())
    priming = events[0]
    key, _, zero = priming["id"].rpartition(".")
    assert priming["data"] == "" and priming["retry"] == 500 and zero == "0" and key
    assert comments[0] == EXT
    ids = [event_id for event_id, _ in messages(events)]
    assert ids == [f"{key}.{k}" for k in range(1, len(ids) + 1)]
    assert "method" not in messages(events)[-1][1]  # the last id is the final response's


def test_sse_retry_ms_sets_the_priming_retry(bos_server_factory, open_session):
    events, _ = read_sse(open_session(server_with(bos_server_factory, sse_retry_ms=1234)).read())
    assert events[0]["retry"] == 1234


def test_stateless_era_has_no_priming_no_ids_and_no_get(bos_server, open_session):
    session = open_session(bos_server, P2026)
    raw = session.read()
    events, _ = read_sse(raw)
    assert all(e["data"] for e in events) and b"\nid:" not in raw and not raw.startswith(b"id:")
    assert session.resume("anything.1").status_code == 405


# -- resumption ------------------------------------------------------------------------------------------

def test_get_with_last_event_id_replays_exactly_the_events_after_it_then_the_final(bos_server, open_session):
    session = open_session(bos_server)
    original = messages(read_sse(session.read())[0])
    after_id = original[2][0]
    response = session.resume(after_id)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events, _ = read_sse(response.content)
    assert events[0]["data"] == "" and events[0]["id"] == after_id  # re-priming at the resume position
    assert messages(events) == original[3:]
    assert bos_server.counters.resumed_streams == 1 and bos_server.counters.completed_streams == 2
    after_final = read_sse(session.resume(original[-1][0]).content)[0]
    assert [(e["id"], e["data"]) for e in after_final] == [(original[-1][0], "")]  # nothing is left


def test_close_after_events_ends_the_post_cleanly_and_get_delivers_the_rest(bos_server_factory, open_session):
    server = server_with(bos_server_factory, close_after_events=2)
    session = open_session(server)
    first = messages(read_sse(session.read())[0])  # no transport error: a clean EOF
    assert [m.get("method") for _, m in first] == ["notifications/bos/source_result"] * 2
    assert server.counters.completed_streams == 0
    rest = messages(read_sse(session.resume(first[-1][0]).content)[0])
    assert [m for _, m in first + rest] == uninterrupted(bos_server_factory, open_session)
    assert server.counters.completed_streams == 1


def test_close_mid_final_frame_then_resume_sends_the_final_again_from_its_start(bos_server_factory,
                                                                                 open_session):
    server = server_with(bos_server_factory, close_mid_final_bytes=300)
    session = open_session(server)
    raw = session.read()
    first = messages(read_sse(raw)[0])
    assert all("method" in m for _, m in first)  # the final event never completed
    key, _, last = first[-1][0].rpartition(".")
    final_start = raw.index(f"id: {key}.{int(last) + 1}\n".encode())
    assert len(raw) - final_start == 300  # cut after exactly K bytes of the final event
    rest = messages(read_sse(session.resume(first[-1][0]).content)[0])
    assert [event_id for event_id, _ in rest] == [f"{key}.{int(last) + 1}"]
    assert [m for _, m in first + rest] == uninterrupted(bos_server_factory, open_session)


def test_close_mid_records_cuts_k_bytes_into_structured_content_then_resume_sends_the_whole_final(
        bos_server_factory, open_session):
    server = server_with(bos_server_factory, close_mid_records_bytes=500)
    session = open_session(server)
    raw = session.read()
    first = messages(read_sse(raw)[0])
    assert all("method" in m for _, m in first)  # the final event never completed
    assert len(raw) - raw.index(b'"structuredContent":') == 500  # K bytes among the records
    assert b'"record_ref"' in raw[raw.index(b'"structuredContent":'):]
    rest = messages(read_sse(session.resume(first[-1][0]).content)[0])
    assert [m for _, m in first + rest] == uninterrupted(bos_server_factory, open_session)


def test_resumption_disabled_sends_no_ids_and_answers_get_with_405(bos_server_factory, open_session):
    server = server_with(bos_server_factory, resumable=False, close_after_events=1)
    session = open_session(server)
    raw = session.read()
    events, _ = read_sse(raw)
    assert [e["id"] for e in events] == [None] and events[0]["data"]  # one notification, no priming
    for last_event_id in ("whatever.1", None):
        refused = session.resume(last_event_id)
        assert refused.status_code == 405 and "POST" in refused.headers["allow"]
    assert server.counters.resumed_streams == 0 and server.counters.completed_streams == 0


def test_unknown_or_foreign_last_event_id_is_refused(bos_server, open_session):
    owner, other = open_session(bos_server), open_session(bos_server)
    last_id = messages(read_sse(owner.read())[0])[0][0]
    assert other.resume(last_id).status_code == 400  # another session's stream
    assert owner.resume("0123456789abcdef.1").status_code == 400
    assert owner.resume(last_id.rpartition(".")[0] + ".x").status_code == 400
    assert bos_server.counters.resumed_streams == 0


# -- silence and keepalives ------------------------------------------------------------------------------

def timed_chunks(session: Session) -> list[tuple[float, bytes]]:
    """(arrival time, chunk) of a streamed read."""
    out = []
    meta = {"io.modelcontextprotocol/clientCapabilities": {"experimental": {EXT: {}}}}
    body = {"jsonrpc": "2.0", "id": "r-1", "method": "tools/call",
            "params": {"name": "search_people", "arguments": {}, "_meta": meta}}
    with session.http.stream("POST", session.server.mcp_url, headers=session.headers(),
                             json=body) as response:
        for chunk in response.iter_raw():
            out.append((time.monotonic(), chunk))
    return out


def test_keepalive_comments_arrive_while_the_server_assembles_the_final(bos_server_factory, open_session):
    server = server_with(bos_server_factory, "empty", final_delay_ms=800, keepalive_interval_ms=100)
    raw = b"".join(chunk for _, chunk in timed_chunks(open_session(server)))
    before_final = raw[: raw.index(b'"result"')]
    assert before_final.count(b": keepalive") >= 3


def test_a_silent_server_sends_nothing_between_the_last_notification_and_the_final(bos_server_factory,
                                                                                    open_session):
    server = server_with(bos_server_factory, final_delay_ms=1500, keepalive_interval_ms=None)
    chunks = timed_chunks(open_session(server))
    raw = b"".join(chunk for _, chunk in chunks)
    assert b"keepalive" not in raw
    final_at = next(t for t, chunk in chunks if b'"result"' in chunk)
    last_note_at = max(t for t, chunk in chunks if b"notifications/bos/source_result" in chunk)
    # The final is due 1.5 s after the last notification was due; however late that one went out,
    # a long gap remains, and nothing at all was sent in it.
    assert final_at - last_note_at >= 0.5
    assert not [chunk for t, chunk in chunks if last_note_at < t < final_at]


def test_a_silent_server_outlasts_a_short_read_timeout(bos_server_factory, open_session):
    # A client whose read timeout is shorter than the server's silence fails.
    server = server_with(bos_server_factory, "empty", final_delay_ms=3000, keepalive_interval_ms=None)
    session = open_session(server)
    session.http.timeout = httpx.Timeout(20, read=0.5)
    with pytest.raises(httpx.ReadTimeout):
        session.read()


# -- scenario validation, resources ------------------------------------------------------------------------

@pytest.mark.parametrize("faults", [{"close_after_events": 1, "drop_mid_final": True},
                                    {"close_mid_final_bytes": 10, "close_after_events": 2},
                                    {"close_mid_final_bytes": 10, "stall": True},
                                    {"close_mid_records_bytes": 10, "close_mid_final_bytes": 10}])
def test_one_stream_ending_fault_at_a_time(faults):
    with pytest.raises(ValidationError, match="choose one stream-ending fault"):
        FaultSpec(**faults)


def test_resources_capability_is_declared_and_listed(bos_server, open_session):
    session = open_session(bos_server)
    assert "resources" in session.capabilities
    listed = session.http.post(bos_server.mcp_url, headers=session.headers(),
                               json={"jsonrpc": "2.0", "id": 5, "method": "resources/list"}).json()["result"]
    uris = {r["uri"] for r in listed["resources"]}
    contexts = bos_server.scenario.resolved_contexts()
    assert {f"bos://contexts/{c['context_handle']}/schema/person" for c in contexts} == uris


def test_unknown_resource_error_carries_the_uri(bos_server, open_session):
    session = open_session(bos_server)
    uri = "bos://contexts/ctx_nope/schema/person"
    error = session.http.post(bos_server.mcp_url, headers=session.headers(), json={
        "jsonrpc": "2.0", "id": 6, "method": "resources/read", "params": {"uri": uri}}).json()["error"]
    assert error["code"] == -32602 and error["data"] == {"uri": uri}

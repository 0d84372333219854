"""Fault injection of the reference server, observed from a raw httpx client.

Uses the stateless 2026-07-28 era with an API key: one POST per call, no session to set up.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from airflow_provider_bos.testing.scenario import FaultSpec, large_scenario, load_scenario

P2026 = "2026-07-28"
EXT = "bos/source-results/v1"


def parse_sse(raw: bytes) -> list[dict]:
    """JSON payloads of the complete events of a stream (test-local WHATWG-style parser)."""
    text = raw.decode("utf-8").removeprefix("\ufeff")
    events, data = [], []
    for line in re.split(r"\r\n|\r|\n", text)[:-1]:
        if line == "":
            if data:
                events.append(json.loads("\n".join(data)))
            data = []
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            if name == "data":
                data.append(value.removeprefix(" "))
    return events


def request(tool: str = "search_people", *, opt_in: object = None, request_id: object = "f-1") -> dict:
    meta = {"io.modelcontextprotocol/protocolVersion": P2026,
            "io.modelcontextprotocol/clientInfo": {"name": "fault-tests", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {} if opt_in is None else {"experimental": {EXT: opt_in}}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": tool, "arguments": {}, "_meta": meta}}


def headers(key: str, tool: str = "search_people") -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": P2026, "Mcp-Method": "tools/call", "Mcp-Name": tool}


def call(server, *, opt_in: object = {}, request_id: object = "f-1") -> tuple[httpx.Response, bytes, Exception | None]:
    """POST a federated read; return the response, every byte received, and the read error if any."""
    received = bytearray()
    error: Exception | None = None
    with httpx.Client(timeout=20) as http:
        with http.stream("POST", server.mcp_url, headers=headers(server.create_api_key()),
                         json=request(opt_in=opt_in, request_id=request_id)) as response:
            try:
                for chunk in response.iter_raw():
                    received += chunk
            except httpx.HTTPError as exc:
                error = exc
    return response, bytes(received), error


def server_with(factory, name: str = "complete", **faults):
    scenario = load_scenario(name)
    scenario.faults = FaultSpec(**faults)
    return factory(scenario=scenario)


def notifications_and_finals(raw: bytes) -> tuple[list[dict], list[dict]]:
    events = parse_sse(raw)
    return [e for e in events if "method" in e], [e for e in events if "method" not in e]


def test_drop_after_notifications(bos_server_factory):
    server = server_with(bos_server_factory, drop_after_notifications=2)
    response, raw, error = call(server)
    assert response.status_code == 200 and isinstance(error, httpx.RemoteProtocolError)
    notes, finals = notifications_and_finals(raw)
    assert len(notes) == 2 and finals == []
    assert server.counters.completed_streams == 0 and server.counters.cancelled_calls == 0


def test_drop_before_final(bos_server_factory):
    server = server_with(bos_server_factory, drop_before_final=True)
    _, raw, error = call(server)
    notes, finals = notifications_and_finals(raw)
    assert isinstance(error, httpx.RemoteProtocolError)
    assert notes and {n["params"]["status"] for n in notes} >= {"complete"} and finals == []


@pytest.mark.parametrize("opt_in", [{}, None])
def test_drop_mid_final(bos_server_factory, opt_in):
    server = server_with(bos_server_factory, drop_mid_final=True)
    _response, raw, error = call(server, opt_in=opt_in)
    assert isinstance(error, httpx.RemoteProtocolError)
    assert b'"id":"f-1"' in raw and b'"content":[{"type":"text"' in raw
    assert b'"structuredContent"' not in raw  # cut inside the final frame
    body = raw.split(b"\n")[-1] if opt_in is not None else raw
    with pytest.raises(ValueError):
        json.loads(body.removeprefix(b"data: "))


def test_stall_sends_keepalives_until_the_client_leaves(bos_server_factory):
    server = server_with(bos_server_factory, stall=True, keepalive_interval_ms=20)
    seen = bytearray()
    with httpx.Client(timeout=20) as http:
        with http.stream("POST", server.mcp_url, headers=headers(server.create_api_key()),
                         json=request(opt_in={})) as response:
            for chunk in response.iter_raw():
                seen += chunk
                if seen.count(b": keepalive") >= 3:
                    break
    assert seen.startswith(b": bos/source-results/v1") and b"data:" not in seen
    assert server.wait_for_cancelled_calls(1, timeout=10)
    assert server.counters.completed_streams == 0


def test_client_disconnect_cancels_a_running_read(bos_server_factory):
    scenario = load_scenario("complete")
    server = bos_server_factory(scenario=scenario, time_scale=50)  # ~seconds between pages
    with httpx.Client(timeout=20) as http:
        with http.stream("POST", server.mcp_url, headers=headers(server.create_api_key()),
                         json=request(opt_in={})) as response:
            for chunk in response.iter_raw():
                if b"notifications/bos/source_result" in chunk:
                    break
    assert server.wait_for_cancelled_calls(1, timeout=10)


def test_429_then_503_then_success(bos_server_factory):
    server = server_with(bos_server_factory, http_429=1, retry_after_s=2, http_503=1)
    first, _, _ = call(server)
    assert first.status_code == 429 and first.headers["retry-after"] == "2"
    second, raw, _ = call(server)
    assert second.status_code == 503 and second.headers["content-type"].startswith("text/html")
    third, raw, error = call(server)
    assert third.status_code == 200 and error is None
    assert len(notifications_and_finals(raw)[1]) == 1
    assert server.counters.tool_calls == 1


def test_final_error(bos_server_factory):
    server = server_with(bos_server_factory, final_error={"code": -32603, "message": "boom"})
    _, raw, error = call(server)
    _, finals = notifications_and_finals(raw)
    assert error is None and finals == [{"jsonrpc": "2.0", "id": "f-1", "error": {"code": -32603, "message": "boom"}}]


def test_final_id_override(bos_server_factory):
    server = server_with(bos_server_factory, final_id_override="someone-else")
    _, raw, _ = call(server)
    notes, finals = notifications_and_finals(raw)
    assert notes[0]["params"]["requestId"] == "f-1" and finals[0]["id"] == "someone-else"


@pytest.mark.parametrize("opt_in", [{}, None])
def test_malformed_final_lacks_result(bos_server_factory, opt_in):
    server = server_with(bos_server_factory, malformed_final=True)
    _, raw, _ = call(server, opt_in=opt_in)
    final = notifications_and_finals(raw)[1][0] if opt_in is not None else json.loads(raw)
    assert "result" not in final["result"]["structuredContent"]
    assert "metadata" in final["result"]["structuredContent"]


def test_wire_mode_is_the_same_stream_in_every_framing(bos_server_factory):
    plain = server_with(bos_server_factory, "partial")
    wire = server_with(bos_server_factory, "partial", wire_mode=True)
    _, plain_raw, _ = call(plain)
    response, wire_raw, error = call(wire)
    assert error is None
    assert parse_sse(wire_raw) == parse_sse(plain_raw)
    assert wire_raw.startswith(b"\xef\xbb\xbf")
    assert b"\r\n" in wire_raw and b"\n\n" in wire_raw and b"\r\r" in wire_raw
    assert re.search(rb"(^|[\r\n])data:[^ ]", wire_raw) and re.search(rb"(^|[\r\n])data: ", wire_raw)
    assert re.search(rb"[\r\n]retry: \d+", wire_raw)
    assert not re.search(rb"[\r\n]id:", wire_raw)  # the stateless era has no event ids (no resumption)
    assert re.search(rb"[\r\n]: keepalive|[\r\n]: interleaved comment", wire_raw)
    # JSON split over several data lines, in the notifications and in the final frame
    assert re.search(rb"data: ?\{[\r\n]+data:", wire_raw)
    assert response.headers["content-type"].startswith("text/event-stream")


def test_wire_mode_uses_tiny_chunks(bos_server_factory):
    server = server_with(bos_server_factory, "empty", wire_mode=True)
    sizes = []
    with httpx.Client(timeout=20) as http:
        with http.stream("POST", server.mcp_url, headers=headers(server.create_api_key()),
                         json=request(opt_in={})) as response:
            sizes = [len(chunk) for chunk in response.iter_raw()]
    # the socket may coalesce writes, but not into one read for the whole stream
    assert len(sizes) > 1


@pytest.mark.parametrize("wire", [False, True])
def test_large_result_is_complete(bos_server_factory, wire):
    scenario = large_scenario(5_000)
    scenario.faults = FaultSpec(wire_mode=wire)
    server = bos_server_factory(scenario=scenario)
    _, raw, error = call(server)
    assert error is None
    notes, finals = notifications_and_finals(raw)
    assert len(notes) == 5_000 // 100 + 2
    structured = finals[0]["result"]["structuredContent"]
    assert len(structured["result"]) == structured["metadata"]["result_count"] == 5_000
    assert json.loads(finals[0]["result"]["content"][0]["text"]) == structured


def test_admin_endpoints(bos_server):
    with httpx.Client(timeout=10) as http:
        assert http.post(bos_server.base_url + "/_bos/admin/scenario", json={"name": "empty"}).status_code == 200
        assert bos_server.scenario.name == "empty"
        custom = load_scenario("partial").model_dump()
        assert http.post(bos_server.base_url + "/_bos/admin/scenario", json=custom).json() == {"scenario": "partial"}
        assert http.post(bos_server.base_url + "/_bos/admin/scenario", json={"name": "nope"}).status_code == 400
        call(bos_server)
        counters = http.get(bos_server.base_url + "/_bos/admin/counters").json()
    assert counters["tool_calls"] == 1 and counters["streamed_calls"] == 1 and "refresh_reuse_detected" in counters


def test_keepalive_comments_fill_slow_gaps(bos_server_factory):
    scenario = load_scenario("identity_merge")  # pages 20 ms apart (simulated)
    scenario.faults = FaultSpec(keepalive_interval_ms=10)
    # -> 500 ms real gaps between a source's pages: the schedule is wall-clock, so a server held up
    # longer than the whole read (here 1.5 s) would send every event overdue, with no idle gap to fill.
    server = bos_server_factory(scenario=scenario, time_scale=25)
    _, raw, error = call(server)
    assert error is None
    first_note = raw.index(b"notifications/bos/source_result")
    assert raw.count(b": keepalive", first_note) >= 2  # between notifications, not only before them
    notes, finals = notifications_and_finals(raw)
    assert notes and len(finals) == 1

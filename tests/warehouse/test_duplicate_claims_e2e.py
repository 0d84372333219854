"""End to end, HTTP bytes to tables: duplicate ``record_ref``s where a copy arrives as a claim.

docs/warehouse.md: duplicates of one result are resolved "latest observed_at, then last occurrence".
A copy byte-identical to the stored row but for its provenance stamps comes through the scanner
undecoded (a :class:`~airflow_provider_bos.wire.KnownRecord` claim; the wire hash leaves stamps
out), so the stored row's stamps are older than its own. The dedupe must judge it by its own: on
every dialect, through each staging path (PostgreSQL's kept claims, DuckDB's staged file, MariaDB's
and SQLite's rows).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import sqlalchemy as sa

from airflow_provider_bos.mcp import McpSession, RetryPolicy
from airflow_provider_bos.sync import run_sync
from airflow_provider_bos.warehouse import SyncRunInfo, WarehouseWriter
from airflow_provider_bos.wire import ReconcileOptions

URL = "https://bos.example/mcp/apps/bos/platform"
EXT = "bos/source-results/v1"
CAPS = {"tools": {}, "experimental": {EXT: {"pageSize": 100, "maxConcurrentSources": 8, "contractUri": "x"}}}
CRM = {"source_type": "crm", "source_identity": "crm-eu"}
DAY1, DAY2, DAY2_LATER = "2026-10-01T12:00:00Z", "2026-10-02T12:00:00Z", "2026-10-02T13:00:00Z"


def person(n: int, *, name: str | None = None, observed_at: str) -> dict[str, Any]:
    return {"record_ref": f"bos:person:{n}", "display_name": name or f"p{n}", "email": None, "phone": None,
            "lifecycle": None, "identity_match": None, "attributes": {"n": n},
            "sources": [{**CRM, "external_id": str(n), "record_type": "person", "observed_at": observed_at,
                         "capabilities": ["read"], "version": None}]}


class FakeBos:
    """A 2025-era BOS whose read streams one page notification, then the given final records."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(200)
        body = json.loads(request.content)
        method, rid = body.get("method"), body.get("id")
        if method == "initialize":
            return httpx.Response(200, headers={"mcp-session-id": "s1"}, json={"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": "2025-11-25", "capabilities": CAPS, "serverInfo": {"name": "fake", "version": "1"}}})
        if method == "notifications/initialized":
            return httpx.Response(202)
        if method == "tools/list":
            return httpx.Response(200, json={"jsonrpc": "2.0", "id": rid, "result": {
                "tools": [{"name": "search_people", "inputSchema": {"type": "object"}}]}})
        structured = {"result": self.records, "metadata": {"completeness": "complete",
                                                           "result_count": len(self.records), "observed_at": DAY2}}
        final = {"jsonrpc": "2.0", "id": rid, "result": {
            "content": [{"type": "text", "text": json.dumps(structured)}], "structuredContent": structured,
            "isError": False}}
        page = {"jsonrpc": "2.0", "method": "notifications/bos/source_result",
                "params": {"requestId": rid, "sequence": 1, "pageIndex": 0, "source": CRM, "records": [],
                           "status": "complete"}}
        # Compact, as BOS sends it: the form whose records the scanner can claim undecoded.
        payload = b"".join(b"event: message\ndata: " + json.dumps(m, separators=(",", ":")).encode() + b"\n\n"
                           for m in (page, final))
        # In small chunks, as a network delivers a frame: the records are cut as they arrive.
        chunks = [payload[i:i + 64] for i in range(0, len(payload), 64)]
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=iter(chunks))


def sync(writer: WarehouseWriter, records: list[dict[str, Any]]) -> Any:
    client = httpx.Client(transport=httpx.MockTransport(FakeBos(records)))
    retry = RetryPolicy(attempts=1, max_total_s=5, backoff_base_s=0, backoff_max_s=0)
    with client, McpSession(URL, http_client=client, era="2025-11-25", retry=retry,
                            stream_threshold_bytes=256) as session:
        run = SyncRunInfo(run_id=str(uuid.uuid4()), conn_id="e2e", tool_name="search_people")
        return run_sync(session.federated_read, writer, run, tool_name="search_people", arguments={},
                        via="direct", stream=True, reconcile=ReconcileOptions(history=True))


def names(engine: sa.Engine, table: str) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.text(f"SELECT record_ref, display_name FROM {table}")).all())


def test_a_copy_arriving_as_a_claim_is_judged_by_its_own_stamps(make_writer: Any, engine: sa.Engine) -> None:
    writer = make_writer()
    sync(writer, [person(n, observed_at=DAY1) for n in range(5)])

    again = sync(writer, [
        # p0: changed, then exactly as stored with the same stamps: the last occurrence wins.
        person(0, name="p0-new", observed_at=DAY2), person(0, observed_at=DAY2),
        # p1: as stored, observed later than the changed copy after it: the latest observation wins.
        person(1, observed_at=DAY2_LATER), person(1, name="p1-new", observed_at=DAY2),
        # p2: as stored, then changed and observed later: the change wins.
        person(2, observed_at=DAY2), person(2, name="p2-new", observed_at=DAY2_LATER),
        person(3, observed_at=DAY2), person(4, observed_at=DAY2),
    ])

    assert again.result.known_records == 5  # the copies as stored came through as claims
    counts = again.counts
    assert (counts.inserted, counts.updated, counts.unchanged, counts.duplicates) == (0, 1, 4, 3)
    assert names(engine, writer.table) == {"bos:person:0": "p0", "bos:person:1": "p1", "bos:person:2": "p2-new",
                                           "bos:person:3": "p3", "bos:person:4": "p4"}


def test_of_two_claims_of_one_stored_row_the_later_observation_is_kept(make_writer: Any, engine: sa.Engine) -> None:
    """Two claims of the same stored row and a changed copy between them in time: the changed copy
    is older than the latest claim, so the stored content stays, whatever order the copies come in."""
    writer = make_writer()
    sync(writer, [person(n, observed_at=DAY1) for n in range(3)])

    again = sync(writer, [
        person(0, observed_at=DAY2_LATER), person(0, name="p0-new", observed_at=DAY2), person(0, observed_at=DAY1),
        person(1, observed_at=DAY2), person(2, observed_at=DAY2),
    ])

    counts = again.counts
    assert (counts.updated, counts.unchanged, counts.duplicates) == (0, 3, 2)
    assert names(engine, writer.table)["bos:person:0"] == "p0"

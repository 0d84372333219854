"""A 2025-era BOS behind ``httpx.MockTransport`` whose one federated read returns the records given.

For tests of what the client and the writer make of a final result the reference server does not
send (records without a ``record_ref``, duplicate refs): the read streams one page notification, then
the final records, compact as BOS sends them and in small chunks as a network delivers a frame.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx

from airflow_provider_bos.mcp import McpSession, RetryPolicy
from airflow_provider_bos.sync import run_sync
from airflow_provider_bos.warehouse import SyncRunInfo

URL = "https://bos.example/mcp/apps/bos/platform"
EXT = "bos/source-results/v1"
CAPS = {"tools": {}, "experimental": {EXT: {"pageSize": 100, "maxConcurrentSources": 8, "contractUri": "x"}}}
CRM = {"source_type": "crm", "source_identity": "crm-eu"}


class FakeBos:
    """``MockTransport`` handler: a session on ``search_people`` whose read returns ``records``."""

    def __init__(self, records: list[dict[str, Any]], *, observed_at: str = "2026-10-08T12:00:00Z",
                 raw: dict[str, str] | None = None) -> None:
        self.records = records
        self.observed_at = observed_at
        #: JSON text Python cannot write (a number such as ``1e400``) for the string values standing in for it.
        self.raw = raw or {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(200)
        body = json.loads(request.content)
        method, rid = body.get("method"), body.get("id")
        if method == "initialize":
            return _ok(rid, {"protocolVersion": "2025-11-25", "capabilities": CAPS,
                             "serverInfo": {"name": "fake", "version": "1"}}, {"mcp-session-id": "s1"})
        if method == "notifications/initialized":
            return httpx.Response(202)
        if method == "tools/list":
            return _ok(rid, {"tools": [{"name": "search_people", "inputSchema": {"type": "object"}}]})
        assert method == "tools/call", method
        structured = {"result": self.records, "metadata": {"completeness": "complete",
                                                           "result_count": len(self.records),
                                                           "observed_at": self.observed_at}}
        final = {"jsonrpc": "2.0", "id": rid, "result": {
            "content": [{"type": "text", "text": json.dumps(structured)}], "structuredContent": structured,
            "isError": False}}
        page = {"jsonrpc": "2.0", "method": "notifications/bos/source_result",
                "params": {"requestId": rid, "sequence": 1, "pageIndex": 0, "source": CRM, "records": [],
                           "status": "complete"}}
        payload = b"".join(b"event: message\ndata: " + json.dumps(m, separators=(",", ":")).encode() + b"\n\n"
                           for m in (page, final))
        for stand_in, text in self.raw.items():  # in the records and in their text copy
            payload = payload.replace(json.dumps(stand_in).encode(), text.encode())
            payload = payload.replace(json.dumps(json.dumps(stand_in))[1:-1].encode(), text.encode())
        chunks = [payload[i:i + 64] for i in range(0, len(payload), 64)]
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=iter(chunks))


def _ok(rid: Any, result: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(200, json={"jsonrpc": "2.0", "id": rid, "result": result}, headers=headers)


def sync_from(bos: FakeBos, writer: Any, *, stream_threshold_bytes: int = 256, **options: Any) -> Any:
    """One ``run_sync`` of ``bos``'s read into ``writer`` (a small stream threshold: the final frame is
    scanned record by record, as a large one is); ``options`` go to ``run_sync``."""
    client = httpx.Client(transport=httpx.MockTransport(bos))
    retry = RetryPolicy(attempts=1, max_total_s=5, backoff_base_s=0, backoff_max_s=0)
    with client, McpSession(URL, http_client=client, era="2025-11-25", retry=retry,
                            stream_threshold_bytes=stream_threshold_bytes) as session:
        run = SyncRunInfo(run_id=str(uuid.uuid4()), conn_id="e2e", tool_name="search_people")
        return run_sync(session.federated_read, writer, run, tool_name="search_people", arguments={},
                        via="direct", stream=True, **options)

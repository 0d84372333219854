"""How we talk to BOS: MCP over Streamable HTTP (both eras). The modules, top-down:

- ``session``: :class:`McpSession`, era negotiation, retries, cancellation, the public calls; owns an exchange
- ``exchange``: :class:`HttpExchange`, the HTTP transport: send a request, classify its answer into a typed reply
- ``eras``: the two protocol eras, how ``era="auto"`` decides, what each puts on the wire
- ``http_status``: an answer's status to a typed error, its content type, bounded error bodies
- ``retry``: bounded retries of requests (connect errors, 429, 502/503/504)
- ``calls``: what one call carries: its deadline, options and failures
- ``jsonrpc``: JSON-RPC 2.0 request ids, envelopes, error mapping, routing-header values
- ``interactive``: what a server may ask that an unattended client cannot answer, as a typed error
- ``reads``: how a federated read is addressed (``via``, the context)
- ``event_stream``: one call's event-stream answer: routing its events, resuming a dropped stream
- ``sse``: the incremental ``text/event-stream`` parser
- ``source_results``: the ``bos/source-results/v1`` page notifications: validation, per-source progress
- ``page_records``: a page's records shape-checked and counted without being built
- ``final_stream``: a read's final frame handed over from the open response, record by record
- ``final_frame``: the incremental scanner of that frame (an enum state machine over the bytes)
- ``json_bytes``: the byte-level JSON delimiting the scanner uses
- ``final_result``: the read's authoritative outcome, :class:`FinalResult`, and its parsing
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_bos.mcp.final_frame import FinalFrameScanner, KnownRecord, WireRecord
from airflow_provider_bos.mcp.final_result import (
    FinalResult,
    FinalResultParser,
    StreamingFinalResult,
    parse_final_response,
)
from airflow_provider_bos.mcp.retry import RetryPolicy, parse_retry_after
from airflow_provider_bos.mcp.session import HANDSHAKE_VERSIONS, BosReadCancelled, McpSession
from airflow_provider_bos.mcp.source_results import SourceProgress, SourceResultsTracker, SourceStats
from airflow_provider_bos.mcp.sse import DEFAULT_MAX_EVENT_BYTES, SseEvent, SseParser, iter_sse

__all__ = [
    "McpSession", "RetryPolicy", "BosReadCancelled", "HANDSHAKE_VERSIONS", "SseEvent", "SseParser", "iter_sse",
    "DEFAULT_MAX_EVENT_BYTES", "SourceStats", "SourceProgress", "SourceResultsTracker", "FinalResult",
    "FinalResultParser", "FinalFrameScanner", "StreamingFinalResult", "KnownRecord", "WireRecord",
    "parse_final_response", "parse_retry_after",
]


if TYPE_CHECKING:
    from airflow_provider_bos.wire import FederatedRead

    # Checked by mypy, never run: the session's read is the FederatedRead that run_sync is typed against.
    def _read_for_run_sync(session: McpSession) -> FederatedRead:
        return session.federated_read

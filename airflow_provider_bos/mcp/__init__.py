"""How we talk to BOS: MCP sessions (both eras), the SSE parser and the source-results stream."""

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
    "McpSession",
    "RetryPolicy",
    "BosReadCancelled",
    "HANDSHAKE_VERSIONS",
    "SseEvent",
    "SseParser",
    "iter_sse",
    "DEFAULT_MAX_EVENT_BYTES",
    "SourceStats",
    "SourceProgress",
    "SourceResultsTracker",
    "FinalResult",
    "FinalResultParser",
    "FinalFrameScanner",
    "StreamingFinalResult",
    "KnownRecord",
    "WireRecord",
    "parse_final_response",
    "parse_retry_after",
]


if TYPE_CHECKING:
    from airflow_provider_bos.wire import FederatedRead

    # Checked by mypy, never run: the session's read is the FederatedRead that run_sync is typed against.
    def _read_for_run_sync(session: McpSession) -> FederatedRead:
        return session.federated_read

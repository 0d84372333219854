"""McpSession against a reference server that opens each response stream with an MCP priming event.

MCP 2025-11-25 (SEP-1699): a server may open an SSE stream with an event carrying an ``id``,
empty ``data`` and ``retry``. It is not a JSON-RPC message, and the session must not fail on it
("An SSE message event is not valid JSON (0 characters)").
"""

from __future__ import annotations

from typing import Any

import pytest
from mcphelpers import Bearer

from airflow_provider_bos.mcp import McpSession, RetryPolicy
from airflow_provider_bos.testing.scenario import FaultSpec, load_scenario


@pytest.mark.parametrize("wire_mode", [False, True], ids=["plain", "wire"])
@pytest.mark.parametrize("via", ["direct", "execute"])
def test_a_priming_event_does_not_break_a_streamed_read(bos_server_factory: Any, wire_mode: bool,
                                                        via: str) -> None:
    scenario = load_scenario("complete")
    scenario.faults = FaultSpec(wire_mode=wire_mode, sse_retry_ms=250)
    server = bos_server_factory(scenario=scenario)
    tool = "search_people" if via == "direct" else "people.search"
    with McpSession(server.mcp_url, auth=Bearer(server.mint_grant()["access_token"]), era="2025-11-25",
                    retry=RetryPolicy(attempts=1), timeout=20.0) as session:
        result = session.federated_read(tool, {}, via=via, stream=True)
        records = list(result.records)
    assert server.counters.primed_streams == 1  # the stream did open with a priming event
    assert result.streamed and result.completeness == "complete" and len(records) == result.result_count > 0

"""Two timeouts, as the MCP SDK has them, through the loopback reference server.

The HTTP timeout bounds connecting and waiting for an answer; an open ``tools/call`` event stream
has its own idle limit between bytes, the stream idle timeout (default 300 s), which any bytes
reset (``: keepalive`` comments too) and which never outlives the read's deadline. The server's
silence before the final is ``final_delay_ms`` (simulated) times the server's ``time_scale``.
"""

from __future__ import annotations

from typing import Any

import pytest
from mcphelpers import Bearer

from airflow_provider_bos.exceptions import BosDeadlineExceeded, BosStreamIdleTimeout
from airflow_provider_bos.mcp import McpSession, RetryPolicy
from airflow_provider_bos.testing.scenario import FaultSpec, large_scenario, load_scenario

SCALE = 0.05  # 1 simulated second = 50 ms


def silent_server(factory: Any, *, silent_s: float, keepalive_ms: float | None = None, scenario: Any = None) -> Any:
    """A server silent for ``silent_s`` real seconds before the final (keepalive comments if asked)."""
    sc = scenario if scenario is not None else load_scenario("complete")
    sc.faults = FaultSpec(final_delay_ms=silent_s * 1000 / SCALE,
                          keepalive_interval_ms=keepalive_ms)  # keepalive intervals are real time
    return factory(scenario=sc, time_scale=SCALE)


def session(server: Any, **kwargs: Any) -> McpSession:
    return McpSession(server.mcp_url, auth=Bearer(server.mint_grant()["access_token"]),
                      retry=RetryPolicy(attempts=1), **kwargs)


@pytest.mark.parametrize("stream_records", [False, True], ids=["whole", "records"])
def test_silence_longer_than_the_http_timeout_but_within_the_stream_idle_timeout_passes(
        bos_server_factory: Any, stream_records: bool) -> None:
    # The HTTP timeout also bounds the handshake's answers: 1 s leaves a loaded machine room for them,
    # and the silence stays three times as long.
    server = silent_server(bos_server_factory, silent_s=3.0)
    with session(server, timeout=1.0, stream_idle_timeout=10.0) as s:
        result = s.federated_read("search_people", {}, via="direct", stream_records=stream_records)
        records = list(result.records)
    assert result.completeness == "complete" and len(records) == result.result_count > 0
    assert server.counters.completed_streams == 1


def test_silence_longer_than_the_stream_idle_timeout_fails_naming_it(bos_server_factory: Any) -> None:
    server = silent_server(bos_server_factory, silent_s=3.0)
    with session(server, stream_idle_timeout=1.0) as s:
        with pytest.raises(BosStreamIdleTimeout) as caught:
            s.federated_read("search_people", {}, via="direct")
    message = str(caught.value)
    assert "stream idle timeout" in message.lower() and "1.0" in message, message
    assert "Stream idle timeout" in message  # the connection field that raises it
    assert caught.value.observations is not None and caught.value.observations.notifications > 0


def test_keepalive_comments_keep_a_stream_alive_past_the_stream_idle_timeout(bos_server_factory: Any) -> None:
    server = silent_server(bos_server_factory, silent_s=2.5, keepalive_ms=200)
    with session(server, stream_idle_timeout=0.8) as s:
        result = s.federated_read("search_people", {}, via="direct")
    assert result.completeness == "complete" and result.result_count > 0


def test_a_deadline_shorter_than_the_silence_fails_by_the_deadline(bos_server_factory: Any) -> None:
    server = silent_server(bos_server_factory, silent_s=6.0)
    with session(server, stream_idle_timeout=30.0) as s:
        with pytest.raises(BosDeadlineExceeded) as caught:
            s.federated_read("search_people", {}, via="direct", deadline_s=1.5)
    assert "deadline" in str(caught.value) and "read_deadline" in str(caught.value)
    assert not isinstance(caught.value, BosStreamIdleTimeout)
    assert server.counters.completed_streams == 0


@pytest.mark.slow
def test_a_200k_read_behind_a_60s_silence_passes_with_default_settings(bos_server_factory: Any) -> None:
    # The server is silent 60 simulated seconds before the final; time_scale shrinks that to 3 s, so
    # the HTTP timeout is shrunk by the same factor (30 s -> 1.5 s): the silence stays twice the
    # default HTTP timeout, and the stream idle timeout keeps its default (300 s).
    sc = large_scenario(200_000, sources=2)
    sc.faults = FaultSpec(final_delay_ms=60_000, keepalive_interval_ms=None)
    server = bos_server_factory(scenario=sc, time_scale=SCALE)
    with session(server, timeout=30.0 * SCALE) as s:
        assert s.stream_idle_timeout == 300.0
        result = s.federated_read("search_people", {}, via="direct", stream_records=True)
        count = sum(1 for _ in result.records)
    assert count == result.result_count == 200_000 and result.completeness == "complete"

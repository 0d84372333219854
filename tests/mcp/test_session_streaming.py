"""federated_read(stream_records=True) end to end against the reference server (both eras).

The records of the final frame are pulled from the still-open response; what depends on the end of
the frame is available once they are consumed. ``stream_threshold_bytes=0`` forces EVERY event
(notifications included) through the incremental scanner, so small scenarios exercise it too.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from mcphelpers import Bearer

from airflow_provider_bos.exceptions import BosIncompleteStreamError, BosJsonRpcError, BosResultError
from airflow_provider_bos.mcp import BosReadCancelled, McpSession, RetryPolicy
from airflow_provider_bos.testing.scenario import FaultSpec, large_scenario, load_scenario

ERAS = ["2025-11-25", "2026-07-28"]
FAST = RetryPolicy(attempts=3, max_total_s=20, backoff_base_s=0.05, backoff_max_s=0.2)


def session_for(server: Any, era: str, **kwargs: Any) -> McpSession:
    return McpSession(server.mcp_url, auth=Bearer(server.mint_grant()["access_token"]), era=era, retry=FAST,
                      timeout=20.0, **kwargs)


def server_with(factory: Any, name: str, **faults: Any) -> Any:
    scenario = load_scenario(name)
    scenario.faults = FaultSpec(**faults)
    return factory(scenario=scenario)

THRESHOLDS = [0, 1024 * 1024]  # stream every event / only big ones (the default)


def _read(server: Any, era: str, via: str, *, stream_records: bool, threshold: int = 0, stream: bool = True) -> Any:
    tool = "search_people" if via == "direct" else "people.search"
    session = session_for(server, era, stream_threshold_bytes=threshold)
    result = session.federated_read(tool, {}, via=via, stream=stream, stream_records=stream_records)
    return session, result


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize("scenario", ["identity_merge", "partial"])
@pytest.mark.parametrize("threshold", THRESHOLDS, ids=["scan-all", "scan-large"])
def test_streamed_records_equal_the_materialised_ones(bos_server: Any, era: str, scenario: str, threshold: int) -> None:
    # Two reads compared record for record: stamped on last change, so both reads send the same bytes
    # (by default each read re-stamps every provenance entry, as BOS does).
    bos_server.set_scenario(load_scenario(scenario).model_copy(update={"provenance_stamps": "last_change"}))
    for via in ("direct", "execute"):
        session, plain = _read(bos_server, era, via, stream_records=False)
        with session:
            expected = [r.model_dump(mode="json") for r in plain.records]
        session, streamed = _read(bos_server, era, via, stream_records=True, threshold=threshold)
        with session, streamed:
            assert streamed.observations.notifications == plain.observations.notifications
            got = list(streamed.records)
        assert got == expected
        assert (streamed.completeness, streamed.is_error, streamed.result_count) == (
            plain.completeness, plain.is_error, plain.result_count)
        assert streamed.source_errors == plain.source_errors
        assert streamed.warnings == plain.warnings
        assert streamed.metadata == plain.metadata
        assert streamed.context == plain.context and streamed.result_type == plain.result_type
        assert streamed.streamed and streamed.complete


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
def test_end_of_frame_attributes_wait_for_the_records(bos_server: Any, stream: bool) -> None:
    session, result = _read(bos_server, "2026-07-28", "execute", stream_records=True, stream=stream)
    with session, result:
        for name in ("completeness", "is_error", "metadata", "context", "warnings", "result_type",
                     "source_errors", "result_count"):
            with pytest.raises(BosResultError, match="available once records are consumed"):
                getattr(result, name)
        assert result.request_id and result.tool_style == "execute"
        records = result.records
        first = next(records)
        assert isinstance(first, dict) and first["record_ref"].startswith("bos:person:")
        with pytest.raises(BosResultError):
            _ = result.completeness
        rest = list(records)
        assert result.completeness == "complete" and result.result_count == 1 + len(rest)
        with pytest.raises(BosResultError, match="only once"):
            _ = result.records


@pytest.mark.parametrize("era", ERAS)
def test_drop_mid_final_raises_from_the_iterator(bos_server_factory: Any, era: str) -> None:
    # Not resumable (else the frame restarts: tests/mcp/test_session_resume.py).
    server = server_with(bos_server_factory, "identity_merge", drop_mid_final=True, resumable=False)
    session, result = _read(server, era, "execute", stream_records=True, threshold=0)
    with session:
        with pytest.raises(BosIncompleteStreamError):
            list(result.records)
        with pytest.raises(BosResultError, match="record stream failed"):
            _ = result.completeness


def test_drop_mid_small_final_is_raised_by_federated_read(bos_server_factory: Any) -> None:
    # Below the threshold the frame is buffered whole, so the read fails before returning.
    server = server_with(bos_server_factory, "identity_merge", drop_mid_final=True, resumable=False)
    with pytest.raises(BosIncompleteStreamError):
        _read(server, "2025-11-25", "execute", stream_records=True, threshold=1024 * 1024)


def test_json_rpc_error_final_frame_is_raised_by_federated_read(bos_server_factory: Any) -> None:
    server = server_with(bos_server_factory, "complete", final_error={"code": -32000, "message": "boom"})
    with pytest.raises(BosJsonRpcError, match="boom"):
        _read(server, "2025-11-25", "execute", stream_records=True)


def test_wrong_final_id_is_refused(bos_server_factory: Any) -> None:
    server = server_with(bos_server_factory, "complete", final_id_override="someone-else")
    with pytest.raises(BosResultError, match="does not match"):
        _read(server, "2025-11-25", "execute", stream_records=True)


def test_malformed_final_raises_once_consumed(bos_server_factory: Any) -> None:
    server = server_with(bos_server_factory, "complete", malformed_final=True)
    session, result = _read(server, "2025-11-25", "execute", stream_records=True)
    with session, pytest.raises(BosResultError, match=r"structuredContent.result"):
        list(result.records)


def test_wire_mode_framing_streams_records(bos_server_factory: Any) -> None:
    server = server_with(bos_server_factory, "identity_merge", wire_mode=True)
    session, plain = _read(server, "2026-07-28", "direct", stream_records=False)
    with session:
        expected = [r.record_ref for r in plain.records]
    session, result = _read(server, "2026-07-28", "direct", stream_records=True, threshold=0)
    with session, result:
        assert [r["record_ref"] for r in result.records] == expected
        assert result.completeness == "complete"


def test_cancel_while_consuming_records(bos_server_factory: Any) -> None:
    server = bos_server_factory(scenario=large_scenario(20_000))
    session, result = _read(server, "2025-11-25", "direct", stream_records=True, threshold=64 * 1024)
    with session:
        records = result.records
        next(records)
        threading.Thread(target=session.cancel).start()
        with pytest.raises(BosReadCancelled):
            for _ in records:
                pass
        assert session._exchange._inflight is None


def test_closing_the_result_early_releases_the_response(bos_server_factory: Any) -> None:
    server = bos_server_factory(scenario=large_scenario(20_000))
    session, result = _read(server, "2025-11-25", "direct", stream_records=True, threshold=64 * 1024)
    with session:
        with result:
            next(result.records)
        assert session._exchange._inflight is None
        # The session is usable again afterwards.
        assert session.get_contexts()


@pytest.mark.parametrize("era", ERAS)
def test_a_large_json_answer_is_scanned_as_it_arrives(bos_server_factory: Any, era: str) -> None:
    """stream=False (as with a server without the extension): one application/json body, over the
    threshold, is scanned like a streamed frame (same records) and can be cancelled midway."""
    server = bos_server_factory(scenario=large_scenario(20_000))
    session, plain = _read(server, era, "direct", stream_records=False, stream=False)
    with session:
        expected = [r.record_ref for r in plain.records]
    session, result = _read(server, era, "direct", stream_records=True, threshold=64 * 1024, stream=False)
    with session, result:
        assert not result.streamed and result.observations.notifications == 0
        assert [r["record_ref"] for r in result.records] == expected
        assert result.completeness == "complete" and result.result_count == 20_000
    session, result = _read(server, era, "direct", stream_records=True, threshold=64 * 1024, stream=False)
    with session:
        records = result.records
        next(records)
        assert session._exchange._inflight is not None  # the body is still arriving
        threading.Thread(target=session.cancel).start()
        with pytest.raises(BosReadCancelled):
            for _ in records:
                pass
        assert session._exchange._inflight is None


def test_default_keeps_materialised_records(bos_server: Any) -> None:
    session, result = _read(bos_server, "2025-11-25", "execute", stream_records=False)
    with session:
        assert isinstance(result.records, list) and result.completeness == "complete"
    assert FaultSpec().drop_mid_final is False

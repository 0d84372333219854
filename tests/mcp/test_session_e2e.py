"""McpSession end to end over real loopback HTTP against the reference server (both eras)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from mcphelpers import Bearer

from airflow_provider_bos.exceptions import (
    BosDeadlineExceeded,
    BosIncompleteStreamError,
    BosJsonRpcError,
    BosResultError,
    BosRetryableHttpError,
)
from airflow_provider_bos.mcp import BosReadCancelled, McpSession, RetryPolicy, SourceProgress
from airflow_provider_bos.testing.scenario import FaultSpec, load_scenario

ERAS = ["2025-11-25", "2026-07-28"]
FAST = RetryPolicy(attempts=3, max_total_s=20, backoff_base_s=0.05, backoff_max_s=0.2)


def session_for(server: Any, era: str = "auto", **kwargs: Any) -> McpSession:
    kwargs.setdefault("retry", FAST)
    kwargs.setdefault("timeout", 20.0)
    return McpSession(server.mcp_url, auth=Bearer(server.mint_grant()["access_token"]), era=era, **kwargs)


def server_with(factory: Any, name: str = "complete", **faults: Any) -> Any:
    scenario = load_scenario(name)
    scenario.faults = FaultSpec(**faults)
    return factory(scenario=scenario)


# --- both eras, both envelopes, stream and not ------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize("via", ["direct", "execute"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_complete_read(bos_server: Any, era: str, via: str, stream: bool) -> None:
    progress: list[SourceProgress] = []
    tool = "search_people" if via == "direct" else "people.search"
    with session_for(bos_server, era) as session:
        result = session.federated_read(tool, {}, via=via, stream=stream, on_progress=progress.append)
        assert session.protocol_version == era
        assert (session.session_id is not None) == (era == "2025-11-25")
    records = list(result.records)
    assert result.completeness == "complete" and not result.is_error and result.warnings == []
    assert result.tool_style == via and len(records) == result.result_count > 0
    assert len({r.record_ref for r in records}) == len(records)
    assert result.streamed is stream
    assert (result.result_type == "complete") == (era == "2026-07-28")
    if via == "execute":
        assert result.context is not None and result.context.is_default
    if stream:
        assert [p.sequence for p in progress] == sorted(p.sequence for p in progress)
        summary = {(s["source_type"], s["source_identity"]): s for s in result.observations.summary()}
        crm = summary[("crm", "crm-eu")]
        assert (crm["pages"], crm["records"], crm["status"], crm["last_page_index"]) == (3, 250, "complete", 3)
        assert summary[("hr", "hr-main")]["records"] == 120
        assert summary[("directory", "ldap")] == {"source_type": "directory", "source_identity": "ldap", "pages": 0,
                                                  "records": 0, "status": "complete", "error_code": None,
                                                  "last_page_index": 0}
    else:
        assert progress == [] and result.observations.notifications == 0


def test_auto_era_picks_stateless_and_2025_session_is_deleted(bos_server: Any) -> None:
    with session_for(bos_server, "auto") as session:
        session.connect()
        assert session.stateless and session.source_results is not None
        assert session.source_results["pageSize"] == 100
    with session_for(bos_server, "2025-11-25") as session:
        session.connect()
    assert bos_server.counters.sessions_deleted == 1 and bos_server.counters.discover_calls >= 1


@pytest.mark.parametrize("era", ERAS)
def test_discovery_tools_contexts_and_resources(bos_server: Any, era: str) -> None:
    with session_for(bos_server, era) as session:
        names = {t["name"] for t in session.list_tools()}  # the server pages tools/list
        assert {"bos_get_context", "bos_list_context_tools", "bos_execute", "search_people"} <= names
        default = next(c for c in session.get_contexts() if c.is_default)
        catalog = session.list_context_tools(default.context_handle)
        assert "people.search" in {op["name"] for op in catalog["operations"]}
        uri = catalog["resources"][0]["uri"]
        contents = session.read_resource(uri)["contents"]
        assert contents[0]["uri"] == uri and contents[0]["text"]


@pytest.mark.parametrize("era", ERAS)
def test_wire_mode_framing_gives_the_same_result(bos_server_factory: Any, era: str) -> None:
    plain = bos_server_factory(scenario="complete")
    wire = server_with(bos_server_factory, "complete", wire_mode=True)
    outcomes = []
    for server in (plain, wire):
        progress: list[SourceProgress] = []
        with session_for(server, era) as session:
            result = session.federated_read("search_people", {}, via="direct", on_progress=progress.append)
        outcomes.append(([r.model_dump() for r in result.records], result.metadata.model_dump(),
                         result.observations.summary(),
                         [p.notification.model_dump(exclude={"requestId"}) for p in progress]))
        assert result.streamed
    assert outcomes[0] == outcomes[1]


# --- partial and identity merge ---------------------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
def test_partial_read(bos_server_factory: Any, era: str) -> None:
    server = bos_server_factory(scenario="partial")
    with session_for(server, era) as session:
        result = session.federated_read("people.search", {}, via="execute")
    assert result.completeness == "partial" and result.is_error and result.warnings == []
    reported = {e.source.key: e.error.code for e in result.source_errors}
    assert reported == result.observations.errored_sources
    assert set(reported.values()) == {"source_timeout", "rate_limited"}
    timed_out = next(s for s in result.observations.sources.values() if s.error_code == "source_timeout")
    assert timed_out.pages == 2 and timed_out.last_page_index == 2
    assert len(list(result.records)) == result.result_count


def test_all_sources_failing_is_partial_with_no_records(bos_server_factory: Any) -> None:
    server = bos_server_factory(scenario="all_errors")
    with session_for(server) as session:
        result = session.federated_read("search_people", {}, via="direct")
    assert result.completeness == "partial" and list(result.records) == [] and len(result.source_errors) == 5


def test_identity_merge_final_refs_replace_provisional_ones(bos_server_factory: Any) -> None:
    server = bos_server_factory(scenario="identity_merge")
    provisional: list[str] = []
    with session_for(server) as session:
        result = session.federated_read(
            "search_people", {}, via="direct",
            on_progress=lambda p: provisional.extend(r["record_ref"] for r in p.notification.records))
    final = [r.record_ref for r in result.records]
    assert len(provisional) == result.observations.provisional_records == 100
    assert len(final) == result.result_count == 60  # the 40 people of hr are all in crm too
    assert not set(provisional) & set(final)
    merged = [r for r in result.records if len(r.sources) == 2]
    assert len(merged) == 40


# --- failures -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
def test_drop_before_final_is_incomplete_with_observations(bos_server_factory: Any, era: str) -> None:
    # A server that cannot resume (the 2025 era resumes otherwise: tests/mcp/test_session_resume.py).
    server = server_with(bos_server_factory, drop_before_final=True, resumable=False)
    with session_for(server, era) as session, pytest.raises(BosIncompleteStreamError) as excinfo:
        session.federated_read("search_people", {}, via="direct")
    observations = excinfo.value.observations
    assert observations.notifications > 0 and observations.running_sources == []  # all looked complete
    assert server.counters.tool_calls == 1  # not retried


def test_drop_after_some_notifications(bos_server_factory: Any) -> None:
    server = server_with(bos_server_factory, drop_after_notifications=2)
    seen: list[SourceProgress] = []
    with session_for(server) as session, pytest.raises(BosIncompleteStreamError) as excinfo:
        session.federated_read("search_people", {}, via="direct", on_progress=seen.append)
    assert excinfo.value.observations.notifications == len(seen) == 2


def test_drop_mid_final_frame(bos_server_factory: Any) -> None:
    server = server_with(bos_server_factory, drop_mid_final=True)
    with session_for(server) as session, pytest.raises(BosIncompleteStreamError):
        session.federated_read("search_people", {}, via="direct")


@pytest.mark.parametrize(
    ("faults", "error", "match"),
    [
        ({"final_error": {"code": -32603, "message": "federation failed"}}, BosJsonRpcError, "federation failed"),
        ({"final_id_override": "not-yours"}, BosResultError, "does not match the request id"),
        ({"malformed_final": True}, BosResultError, "no record array"),
    ],
)
def test_bad_final_frames(bos_server_factory: Any, faults: dict, error: type, match: str) -> None:
    server = server_with(bos_server_factory, **faults)
    with session_for(server) as session, pytest.raises(error, match=match):
        session.federated_read("search_people", {}, via="direct")


@pytest.mark.parametrize(("stream", "keepalive_ms"), [(True, 50), (True, 60_000), (False, 50)],
                         ids=["keepalives", "silent", "json"])
def test_stall_ends_at_the_deadline_and_the_server_sees_the_cancel(
    bos_server_factory: Any, stream: bool, keepalive_ms: float
) -> None:
    server = server_with(bos_server_factory, stall=True, keepalive_interval_ms=keepalive_ms)
    with session_for(server) as session, pytest.raises(BosDeadlineExceeded):
        session.federated_read("search_people", {}, via="direct", stream=stream, deadline_s=1.0)
    assert server.wait_for_cancelled_calls(1, timeout=10)


@pytest.mark.parametrize("era", ERAS)
def test_429_then_503_then_success(bos_server_factory: Any, era: str) -> None:
    server = server_with(bos_server_factory, http_429=1, retry_after_s=0, http_503=1)
    with session_for(server, era) as session:
        result = session.federated_read("search_people", {}, via="direct")
    assert result.completeness == "complete" and server.counters.tool_calls == 1


def test_retries_exhausted(bos_server_factory: Any) -> None:
    server = server_with(bos_server_factory, http_503=5)
    with session_for(server) as session, pytest.raises(BosRetryableHttpError) as excinfo:
        session.federated_read("search_people", {}, via="direct")
    assert excinfo.value.status_code == 503 and "Gave up after 3 attempts" in str(excinfo.value)
    assert server.counters.tool_calls == 0


def test_cancel_from_another_thread_cancels_the_call_on_the_server(bos_server_factory: Any) -> None:
    scenario = load_scenario("complete")
    for source in scenario.sources:
        source.page_size, source.page_delay_ms = 10, 500.0  # long enough to be in flight
    server = bos_server_factory(scenario=scenario)
    first_page = threading.Event()
    with session_for(server) as session:
        canceller = threading.Thread(target=lambda: first_page.wait(10) and session.cancel())
        canceller.start()
        with pytest.raises(BosReadCancelled) as excinfo:
            session.federated_read("search_people", {}, via="direct", on_progress=lambda p: first_page.set())
        canceller.join()
    assert excinfo.value.observations.notifications >= 1
    assert server.wait_for_cancelled_calls(1, timeout=10)

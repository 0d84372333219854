"""Notification validation (one test per contract rule) and final-result parsing."""

from __future__ import annotations

import copy
import json
import logging
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_bos.exceptions import (
    BosError,
    BosJsonRpcError,
    BosResultError,
    BosStreamValidationError,
)
from airflow_provider_bos.mcp.final_result import FinalResultParser
from airflow_provider_bos.mcp.source_results import SourceResultsTracker

PROFILE = settings(settings.get_profile(os.environ.get("BOS_HYPOTHESIS_PROFILE", "bos-ci")))
RID = "bos-test-1"
CRM = {"source_type": "crm", "source_identity": "crm-eu"}
HR = {"source_type": "hr", "source_identity": "hr-main"}


def record(ref: str = "bos:person:1", source: dict | None = None) -> dict[str, Any]:
    src = source or CRM
    return {
        "record_ref": ref,
        "display_name": "Zoë Ångström",
        "email": None,
        "phone": None,
        "lifecycle": None,
        "identity_match": None,
        "attributes": {"nested": {"a": [1, 2]}},
        "sources": [
            {**src, "external_id": ref.rsplit(":", 1)[-1], "record_type": "person",
             "observed_at": "2026-10-08T12:00:00Z", "capabilities": ["read"], "version": None}
        ],
    }


def note(seq: int, page: int, status: str = "page", *, source: dict | None = None, records: list | None = None,
         error: str | None = None, request_id: Any = RID) -> dict[str, Any]:
    params: dict[str, Any] = {
        "requestId": request_id,
        "sequence": seq,
        "pageIndex": page,
        "source": source or CRM,
        "records": records if records is not None else ([record()] if status == "page" else []),
        "status": status,
    }
    if error is not None:
        params["error"] = {"code": error}
    return params


def rule_of(params_list: list[dict]) -> str:
    tracker = SourceResultsTracker(RID)
    with pytest.raises(BosStreamValidationError) as excinfo:
        for params in params_list:
            tracker.observe(params)
    return excinfo.value.rule  # type: ignore[attr-defined]


# --- tracker: the happy paths ---------------------------------------------------------------------


def test_interleaved_sources_are_tracked_per_source_pair() -> None:
    tracker = SourceResultsTracker(RID)
    progress = [
        tracker.observe(note(1, 1, records=[record("a"), record("b")])),
        tracker.observe(note(2, 1, source=HR, records=[record("c", HR)])),
        tracker.observe(note(3, 2)),
        tracker.observe(note(5, 2, "complete")),  # sequence may skip, it must only increase
        tracker.observe(note(6, 1, "error", source=HR, error="source_timeout")),
        tracker.observe(note(7, 0, "complete", source={"source_type": "directory", "source_identity": "ldap"})),
    ]
    assert [p.sequence for p in progress] == [1, 2, 3, 5, 6, 7]
    assert progress[0].stats.records == 2 and progress[2].stats.records == 3  # snapshots, not live objects
    assert tracker.notifications == 6 and tracker.pages == 3 and tracker.provisional_records == 4
    assert tracker.summary() == [
        {"source_type": "crm", "source_identity": "crm-eu", "pages": 2, "records": 3, "status": "complete",
         "error_code": None, "last_page_index": 2},
        {"source_type": "hr", "source_identity": "hr-main", "pages": 1, "records": 1, "status": "error",
         "error_code": "source_timeout", "last_page_index": 1},
        {"source_type": "directory", "source_identity": "ldap", "pages": 0, "records": 0, "status": "complete",
         "error_code": None, "last_page_index": 0},
    ]
    assert tracker.errored_sources == {("hr", "hr-main"): "source_timeout"}
    assert tracker.running_sources == []


def test_same_identity_under_two_types_are_different_sources() -> None:
    tracker = SourceResultsTracker(RID)
    tracker.observe(note(1, 1, source={"source_type": "a", "source_identity": "x"}))
    tracker.observe(note(2, 1, source={"source_type": "b", "source_identity": "x"}))
    assert len(tracker.sources) == 2


def test_integer_request_id() -> None:
    tracker = SourceResultsTracker(7)
    tracker.observe(note(1, 1, request_id=7))
    assert rule_of_with(7, [note(1, 1, request_id="7")]) == "request-id"


def rule_of_with(request_id: Any, params_list: list[dict]) -> str:
    tracker = SourceResultsTracker(request_id)
    with pytest.raises(BosStreamValidationError) as excinfo:
        for params in params_list:
            tracker.observe(params)
    return excinfo.value.rule  # type: ignore[attr-defined]


# --- tracker: one test per rule --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "expected_rule"),
    [
        ([note(1, 1, request_id="someone-else")], "request-id"),
        ([note(2, 1), note(2, 2)], "sequence"),
        ([note(3, 1), note(2, 2)], "sequence"),
        ([{**note(1, 1), "sequence": "1"}], "sequence"),
        ([{**note(1, 1), "sequence": True}], "sequence"),
        ([note(1, 1, "done")], "status"),
        ([note(1, 2)], "page-index"),
        ([note(1, 0)], "page-index"),
        ([note(1, 1), note(2, 3)], "page-index"),
        ([note(1, 1), note(2, 1)], "page-index"),
        ([note(1, 1), note(2, 2, "complete")], "terminal-page-index"),
        ([note(1, 1, "complete")], "terminal-page-index"),  # an empty source completes with 0
        ([note(1, 0, "complete"), note(2, 1)], "after-terminal"),
        ([note(1, 0, "complete"), note(2, 0, "complete")], "after-terminal"),
        ([note(1, 0, "error", error="rate_limited"), note(2, 1)], "after-terminal"),
        ([note(1, 0, "error")], "error-code"),
        ([note(1, 0, "error", error="exploded")], "error-code"),
        ([note(1, 0, "error", error="source_timeout", records=[record()])], "error-records"),
        ([note(1, 1, error="source_timeout")], "error-without-status"),
        ([note(1, 0, "complete", error="source_timeout")], "error-without-status"),
        ([{**note(1, 1), "source": {"source_type": "crm"}}], "source"),
        ([{**note(1, 1), "records": [{"display_name": "no ref"}]}], "records"),
        ([{**note(1, 1), "records": "nope"}], "records"),
        ([{**note(1, 1), "pageIndex": None}], "page-index"),
        (["not an object"], "shape"),
    ],
)
def test_each_rule_is_rejected_by_name(case: list[dict], expected_rule: str) -> None:
    assert rule_of(case) == expected_rule


def test_rejected_notification_leaves_state_unchanged() -> None:
    tracker = SourceResultsTracker(RID)
    tracker.observe(note(1, 1))
    with pytest.raises(BosStreamValidationError):
        tracker.observe(note(2, 3))
    assert tracker.notifications == 1 and tracker.sources[("crm", "crm-eu")].last_page_index == 1
    tracker.observe(note(2, 2))


def test_each_of_the_five_error_codes_is_accepted() -> None:
    tracker = SourceResultsTracker(RID)
    codes = ["source_timeout", "source_identity_mismatch", "provider_authorization_required",
             "rate_limited", "source_unavailable"]
    for i, code in enumerate(codes, 1):
        tracker.observe(note(i, 0, "error", source={"source_type": "t", "source_identity": code}, error=code))
    assert sorted(tracker.errored_sources.values()) == sorted(codes)


@PROFILE
@given(st.lists(st.dictionaries(st.sampled_from(["requestId", "sequence", "pageIndex", "source", "records",
                                                   "status", "error"]),
                                 st.one_of(st.none(), st.integers(-2, 3), st.text(max_size=5),
                                           st.sampled_from([RID, "page", "complete", "error", CRM, [],
                                                            {"code": "rate_limited"}]))),
                max_size=8))
def test_any_notification_sequence_is_accepted_or_rejected_with_a_bos_error(params_list: list[dict]) -> None:
    tracker = SourceResultsTracker(RID)
    for params in params_list:
        try:
            tracker.observe(params)
        except BosStreamValidationError:
            pass


# --- final result ---------------------------------------------------------------------------------

CONTEXT = {"context_handle": "ctx-1", "organization_name": "Org", "application_name": "App",
           "installation_name": "Inst", "role_label": "Role", "is_default": True}


def metadata(completeness: str = "complete", count: int = 1, errors: list | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"retrieval_mode": "live_provider", "cache_baseline_applied": False,
                            "source_delta_applied": False, "completeness": completeness, "result_count": count,
                            "observed_at": "2026-10-08T12:00:00+00:00",
                            "provenance": [{**CRM, "observed_at": "2026-10-08T12:00:00+00:00"}]}
    if errors:
        meta["source_errors"] = errors
    return meta


def direct_result(records: list | None = None, meta: dict | None = None, is_error: bool = False) -> dict:
    records = [record()] if records is None else records
    structured = {"result": records, "metadata": meta or metadata(count=len(records))}
    return {"content": [{"type": "text", "text": json.dumps(structured)}], "structuredContent": structured,
            "isError": is_error}


def execute_result(records: list | None = None, meta: dict | None = None, is_error: bool = False) -> dict:
    records = [record()] if records is None else records
    structured = {"contract_version": "bos-identity-mcp/v2", "context": CONTEXT,
                  "result": {"result": records, "metadata": meta or metadata(count=len(records))}}
    return {"content": [{"type": "text", "text": json.dumps(structured)}], "structuredContent": structured,
            "isError": is_error, "_meta": {"bos/context": CONTEXT}}


def frame(result: dict, request_id: Any = RID) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})


def test_direct_envelope() -> None:
    final = FinalResultParser(RID, tool_style="direct").parse_data(frame(direct_result()))
    assert final.tool_style == "direct" and final.completeness == "complete" and not final.is_error
    assert [r.record_ref for r in final.records] == ["bos:person:1"]
    assert final.result_count == 1 and final.source_errors == [] and final.warnings == []
    assert final.context is None and final.result_type is None


def test_execute_envelope_with_context_and_result_type() -> None:
    result = {**execute_result(), "resultType": "complete"}
    final = FinalResultParser(RID, tool_style="execute", streamed=True).parse_data(frame(result))
    assert [r.record_ref for r in final.records] == ["bos:person:1"]
    assert final.context is not None and final.context.context_handle == "ctx-1"
    assert final.result_type == "complete" and final.streamed and final.warnings == []
    assert final.metadata.provenance[0].source_identity == "crm-eu"


def test_partial_result_exposes_source_errors() -> None:
    errors = [{"source": HR, "error": {"code": "source_timeout"}}]
    tracker = SourceResultsTracker(RID)
    tracker.observe(note(1, 1))
    tracker.observe(note(2, 1, "complete"))
    tracker.observe(note(3, 0, "error", source=HR, error="source_timeout"))
    result = execute_result(meta=metadata("partial", 1, errors), is_error=True)
    final = FinalResultParser(RID, tool_style="execute", observations=tracker, streamed=True).parse_data(frame(result))
    assert final.is_error and final.completeness == "partial"
    assert [(e.source.key, e.error.code) for e in final.source_errors] == [(("hr", "hr-main"), "source_timeout")]
    assert final.warnings == [] and final.observations is tracker


def test_all_sources_failed_is_partial_with_zero_records() -> None:
    errors = [{"source": CRM, "error": {"code": "rate_limited"}}]
    final = FinalResultParser(RID, tool_style="direct").parse_data(
        frame(direct_result([], metadata("partial", 0, errors), is_error=True)))
    assert final.completeness == "partial" and list(final.records) == [] and final.warnings == []


def test_json_rpc_error_final_frame() -> None:
    data = json.dumps({"jsonrpc": "2.0", "id": RID, "error": {"code": -32603, "message": "provider exploded"}})
    with pytest.raises(BosJsonRpcError) as excinfo:
        FinalResultParser(RID, tool_style="direct").parse_data(data)
    assert excinfo.value.code == -32603 and "provider exploded" in str(excinfo.value)


def test_wrong_final_id() -> None:
    with pytest.raises(BosResultError, match="does not match the request id"):
        FinalResultParser(RID, tool_style="direct").parse_data(frame(direct_result(), request_id="other"))
    with pytest.raises(BosResultError):
        FinalResultParser(1, tool_style="direct").parse_data(frame(direct_result(), request_id="1"))


@pytest.mark.parametrize(
    ("style", "mutate", "message"),
    [
        ("direct", lambda r: r.pop("structuredContent"), "no structuredContent"),
        ("direct", lambda r: r["structuredContent"].pop("result"), "no record array"),
        ("direct", lambda r: r["structuredContent"].pop("metadata"), "no metadata"),
        ("direct", lambda r: r["structuredContent"]["metadata"].pop("completeness"), "metadata is malformed"),
        ("execute", lambda r: r["structuredContent"].pop("result"), "no structuredContent.result object"),
        ("execute", lambda r: r["structuredContent"]["result"].pop("result"), "no record array"),
        ("direct", lambda r: r.__setitem__("isError", "yes"), "isError"),
        ("direct", lambda r: r.__setitem__("resultType", "deferred"), "resultType"),
    ],
)
def test_malformed_results(style: str, mutate: Any, message: str) -> None:
    result = direct_result() if style == "direct" else execute_result()
    mutate(result)
    with pytest.raises(BosResultError, match=message):
        FinalResultParser(RID, tool_style=style).parse_data(frame(result))  # type: ignore[arg-type]


def test_tool_error_without_structured_content_reports_its_text() -> None:
    result = {"content": [{"type": "text", "text": "unknown context handle"}], "isError": True}
    with pytest.raises(BosResultError, match="unknown context handle"):
        FinalResultParser(RID, tool_style="execute").parse_data(frame(result))


def test_not_json_and_not_a_response() -> None:
    with pytest.raises(BosResultError, match="not valid JSON"):
        FinalResultParser(RID, tool_style="direct").parse_data('{"jsonrpc": "2.0", "id": "bos-te')
    with pytest.raises(BosResultError, match="neither"):
        FinalResultParser(RID, tool_style="direct").parse_data(json.dumps({"jsonrpc": "2.0", "id": RID}))


def test_record_without_record_ref_names_its_index() -> None:
    bad = record("x")
    del bad["record_ref"]
    with pytest.raises(BosResultError, match=r"Record 2 at structuredContent\.result\.result has no record_ref"):
        FinalResultParser(RID, tool_style="execute").parse_data(
            frame(execute_result([record("a"), record("b"), bad])))


def test_record_without_sources_is_malformed() -> None:
    bad = {**record("x"), "sources": []}
    with pytest.raises(BosResultError, match=r"Record 0 .* malformed"):
        FinalResultParser(RID, tool_style="direct").parse_data(frame(direct_result([bad])))


def test_cross_check_mismatches_are_warnings(caplog: pytest.LogCaptureFixture) -> None:
    tracker = SourceResultsTracker(RID)
    tracker.observe(note(1, 0, "error", source=HR, error="source_timeout"))
    tracker.observe(note(2, 1))  # crm never finishes
    result = direct_result([record("a")], metadata("complete", 5), is_error=True)
    with caplog.at_level(logging.WARNING, logger="airflow_provider_bos.mcp.final_result"):
        final = FinalResultParser(RID, tool_style="direct", observations=tracker, streamed=True).parse_data(
            frame(result))
    text = "\n".join(final.warnings)
    assert "isError=True is inconsistent with completeness 'complete'" in text
    assert "result_count is 5 but the result holds 1" in text
    assert "hr/hr-main ended in error 'source_timeout'" in text and "missing from metadata.source_errors" in text
    assert "before these sources finished: crm/crm-eu" in text
    assert len(caplog.records) == len(final.warnings) == 4


def test_error_flag_on_a_complete_result_is_a_contradiction() -> None:
    result = direct_result([record("a")], metadata("complete", 1), is_error=True)
    final = FinalResultParser(RID, tool_style="direct").parse_data(frame(result))
    assert final.completeness == "complete"  # what the server claims...
    assert final.contradictions == ["isError=True is inconsistent with completeness 'complete'."]


def test_source_error_missing_from_source_errors_is_a_contradiction() -> None:
    tracker = SourceResultsTracker(RID)
    tracker.observe(note(1, 0, "error", source=HR, error="source_timeout"))
    result = direct_result([record("a")], metadata("complete", 1))
    final = FinalResultParser(RID, tool_style="direct", observations=tracker, streamed=True).parse_data(
        frame(result))
    [contradiction] = final.contradictions
    assert "hr/hr-main ended in error 'source_timeout'" in contradiction
    assert "missing from metadata.source_errors" in contradiction


def test_harmless_mismatches_are_no_contradiction() -> None:
    # A partial result without isError, or without source_errors, cannot make a result pass as complete.
    for errors in ([{"source": HR, "error": {"code": "rate_limited"}}], None):
        result = direct_result([record("a")], metadata("partial", 1, errors))
        final = FinalResultParser(RID, tool_style="direct").parse_data(frame(result))
        assert len(final.warnings) == (1 if errors else 2) and final.contradictions == []


def test_error_code_disagreement_and_context_mismatch_are_warnings() -> None:
    tracker = SourceResultsTracker(RID)
    tracker.observe(note(1, 0, "error", source=HR, error="source_timeout"))
    result = execute_result([], metadata("partial", 0, [{"source": HR, "error": {"code": "rate_limited"}}]),
                            is_error=True)
    result["_meta"]["bos/context"] = {**CONTEXT, "context_handle": "ctx-2"}
    final = FinalResultParser(RID, tool_style="execute", observations=tracker, streamed=True).parse_data(
        frame(result))
    assert any("metadata.source_errors says 'rate_limited'" in w for w in final.warnings)
    assert any("differs from structuredContent.context" in w for w in final.warnings)


@PROFILE
@given(st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                            st.dictionaries(st.sampled_from(
                                                ["id", "result", "error", "structuredContent", "metadata",
                                                 "completeness", "code", "isError", "record_ref", "sources"]),
                                                inner, max_size=4)),
                    max_leaves=20),
       st.sampled_from(["direct", "execute"]))
def test_any_final_message_parses_or_raises_a_bos_error(message: Any, style: str) -> None:
    if isinstance(message, dict) and "id" in message:
        message = {**message, "id": RID}
    try:
        FinalResultParser(RID, tool_style=style).parse_message(copy.deepcopy(message))  # type: ignore[arg-type]
    except BosError:
        pass


def test_page_records_reach_progress_as_the_wire_dicts() -> None:
    # Provisional records are progress only: counted, lightly checked, never built into models.
    page = [record("a"), record("b")]
    progress = SourceResultsTracker(RID).observe({**note(1, 1, records=page), "future_field": {"x": 1}})
    assert progress.notification.records == page and len(progress.notification.records) == 2
    assert progress.notification.source.source_type == "crm" and progress.notification.pageIndex == 1
    assert progress.notification.model_dump()["future_field"] == {"x": 1}  # extra fields are kept


@pytest.mark.parametrize(
    "bad",
    [
        "not an object",
        {"record_ref": "", "sources": [{"observed_at": "2026-10-08T12:00:00Z"}]},
        {"record_ref": "r", "sources": []},
        {"record_ref": "r", "sources": [{"source_type": "crm"}]},  # provenance without observed_at
    ],
)
def test_a_malformed_page_record_breaks_the_records_rule(bad: object) -> None:
    assert rule_of([note(1, 1, records=[record("ok"), bad])]) == "records"

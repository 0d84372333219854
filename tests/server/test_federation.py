"""The reference server's federation engine: stream rules, identity merge, metadata, determinism.

These tests hold the engine to ``shared/spec/source-results-v1.txt`` without HTTP: what the
server streams is exactly what ``plan_read`` yields.
"""

from __future__ import annotations

import json
import tracemalloc
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.models import (
    SOURCE_ERROR_CODES,
    FederatedRecord,
    ReadMetadata,
    SourceResultParams,
)
from airflow_provider_bos.testing.federation import PlannedRead, build_operation_result, plan_read
from airflow_provider_bos.testing.scenario import (
    BUILTIN_SCENARIOS,
    FaultSpec,
    Scenario,
    SourceSpec,
    large_scenario,
    load_scenario,
)

CONTEXT = {
    "context_handle": "ctx_test",
    "organization_name": "Example Organization",
    "application_name": "Example Application",
    "installation_name": "Example Installation",
    "role_label": "Example Role",
    "is_default": True,
}
SCENARIO_DIR = Path(__file__).resolve().parents[2] / "airflow_provider_bos" / "testing" / "scenarios"
SMALL_BUILTINS = ["complete", "partial", "identity_merge", "all_errors", "empty"]
PAGE_KEYS = {"requestId", "sequence", "pageIndex", "source", "records", "status", "context"}


def plan(scenario: Scenario | str, request_id: str | int = "search-1") -> PlannedRead:
    if isinstance(scenario, str):
        scenario = load_scenario(scenario)
    return plan_read(scenario, request_id=request_id, context=CONTEXT, arguments={})


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


def check_stream(
    read: PlannedRead, scenario: Scenario, *, validate_every: int = 1
) -> list[tuple[float, dict]]:
    """Assert every contract rule on the notifications; return them."""
    notes = list(read.iter_notifications())
    assert [p["sequence"] for _, p in notes] == list(range(1, len(notes) + 1))
    assert len(notes) == read.notification_count
    times = [t for t, _ in notes]
    assert times == sorted(times)

    specs = {s.pair: s for s in scenario.sources}
    pages: dict[tuple[str, str], list[int]] = defaultdict(list)
    terminal: dict[tuple[str, str], dict] = {}
    refs: dict[tuple[str, str], set[str]] = defaultdict(set)
    for n, (_, params) in enumerate(notes):
        expected = PAGE_KEYS | ({"error"} if params["status"] == "error" else set())
        assert set(params) == expected
        assert params["requestId"] == read.request_id
        assert params["context"] == CONTEXT
        pair = (params["source"]["source_type"], params["source"]["source_identity"])
        assert set(params["source"]) == {"source_type", "source_identity"}
        assert pair in specs
        assert pair not in terminal, "a notification after the source's terminal status"
        if params["status"] == "page":
            pages[pair].append(params["pageIndex"])
            assert 1 <= len(params["records"]) <= specs[pair].page_size <= 100
            for record in params["records"]:
                assert record["record_ref"].startswith(f"bos:person:{pair[1]}:")
                assert record["record_ref"] not in refs[pair], "duplicate within a source"
                refs[pair].add(record["record_ref"])
                assert [(p["source_type"], p["source_identity"]) for p in record["sources"]] == [pair]
                assert record["identity_match"] is None
        else:
            assert params["status"] in {"complete", "error"}
            assert params["records"] == []
            terminal[pair] = params
            if params["status"] == "error":
                assert params["error"] == {"code": specs[pair].error}
                assert params["error"]["code"] in SOURCE_ERROR_CODES
            else:
                assert specs[pair].error is None
        if n % validate_every == 0:
            SourceResultParams.model_validate(params)
            for record in params["records"]:
                FederatedRecord.model_validate(record)

    assert set(terminal) == set(specs), "every source ends with exactly one terminal status"
    for pair, spec in specs.items():
        assert pages[pair] == list(range(1, spec.delivered_pages + 1))
        assert terminal[pair]["pageIndex"] == spec.delivered_pages
        assert len(refs[pair]) == spec.delivered_records
    return notes


def check_final(read: PlannedRead, scenario: Scenario, notes: list, *, validate_every: int = 1) -> list[dict]:
    """Assert the final result's rules against the stream; return the records."""
    final = list(read.iter_final_records())
    meta = read.final_metadata
    ReadMetadata.model_validate(meta)
    failed = [s for s in scenario.sources if s.error is not None]
    assert meta["retrieval_mode"] == "live_provider"
    assert meta["cache_baseline_applied"] is False and meta["source_delta_applied"] is False
    assert meta["completeness"] == ("partial" if failed else "complete")
    assert read.is_error is bool(failed)
    assert meta["result_count"] == len(final) == read.final_record_count
    assert meta["observed_at"].endswith("+00:00")
    assert [(p["source_type"], p["source_identity"]) for p in meta["provenance"]] == [
        s.pair for s in scenario.sources if s.error is None
    ]
    if failed:
        assert meta["source_errors"] == [
            {
                "source": {"source_type": s.source_type, "source_identity": s.source_identity},
                "error": {"code": s.error},
            }
            for s in failed
        ]
    else:
        assert "source_errors" not in meta

    final_refs = [r["record_ref"] for r in final]
    assert len(set(final_refs)) == len(final_refs)
    provisional = {rec["record_ref"] for _, p in notes for rec in p["records"]}
    assert not provisional & set(final_refs), "provisional refs never equal final refs"
    # Every delivered (source, external_id) is in exactly one final record; nothing else is.
    delivered = Counter(
        (p["source"]["source_identity"], rec["sources"][0]["external_id"])
        for _, p in notes
        for rec in p["records"]
    )
    kept = Counter((e["source_identity"], e["external_id"]) for r in final for e in r["sources"])
    assert kept == delivered
    read_observed = ts(meta["observed_at"])
    for i, record in enumerate(final):
        assert (record["identity_match"] is None) == (len(record["sources"]) == 1)
        for entry in record["sources"]:
            assert ts(entry["observed_at"]) <= read_observed
        if i % validate_every == 0:
            FederatedRecord.model_validate(record)
    return final


# --- scenarios and loading --------------------------------------------------------------------


def test_builtin_json_files_are_the_builtin_scenarios() -> None:
    files = sorted(SCENARIO_DIR.glob("*.json"))
    assert {f.stem for f in files} == set(BUILTIN_SCENARIOS) == {
        "complete", "partial", "identity_merge", "all_errors", "empty", "large", "silent_final", "resume_mid_final",
        "people_over_time", "whole_contract", "mass_leave",
    }
    for f in files:
        assert Scenario.model_validate_json(f.read_text(encoding="utf-8")) == BUILTIN_SCENARIOS[f.stem]
        assert load_scenario(str(f)) == BUILTIN_SCENARIOS[f.stem]


def test_builtin_shapes_match_the_interface() -> None:
    complete = BUILTIN_SCENARIOS["complete"]
    assert [(s.source_type, s.source_identity, s.records) for s in complete.sources] == [
        ("crm", "crm-eu", 250), ("hr", "hr-main", 120), ("directory", "ldap", 0)
    ]
    assert complete.shared_people == 20
    partial = BUILTIN_SCENARIOS["partial"]
    errors = {(s.error, s.error_after_pages) for s in partial.sources if s.error}
    assert errors == {("source_timeout", 2), ("rate_limited", 0)}
    merge = BUILTIN_SCENARIOS["identity_merge"]
    assert len(merge.sources) == 2 and merge.shared_people == min(s.records for s in merge.sources)
    assert sorted(s.error for s in BUILTIN_SCENARIOS["all_errors"].sources) == sorted(SOURCE_ERROR_CODES)
    assert [s.records for s in BUILTIN_SCENARIOS["empty"].sources] == [0]
    large = BUILTIN_SCENARIOS["large"]
    assert len(large.sources) == 2 and sum(s.records for s in large.sources) == 100_000
    assert all(s.page_size == 100 for s in large.sources)
    # The complete read from a server silent for 40 s before its final / closing mid-final
    for name in ("silent_final", "resume_mid_final"):
        assert BUILTIN_SCENARIOS[name].sources == complete.sources and BUILTIN_SCENARIOS[name].faults.resumable
    assert BUILTIN_SCENARIOS["silent_final"].faults.final_delay_ms == 40_000
    assert BUILTIN_SCENARIOS["silent_final"].faults.keepalive_interval_ms is None
    assert BUILTIN_SCENARIOS["resume_mid_final"].faults.close_mid_final_bytes == 4096


def test_load_scenario_returns_a_private_copy() -> None:
    first = load_scenario("complete")
    first.sources[0].records = 1
    assert load_scenario("complete").sources[0].records == 250


def test_load_scenario_unknown_name() -> None:
    with pytest.raises(BosConfigurationError, match=r"Unknown scenario 'compleet'.*complete"):
        load_scenario("compleet")


def test_load_scenario_reports_a_typo_by_field_path(tmp_path: Path) -> None:
    path = tmp_path / "typo.json"
    path.write_text(json.dumps({"sources": [{"source_identity": "a", "recrods": 5}]}), encoding="utf-8")
    with pytest.raises(BosConfigurationError, match=r"sources\.0\.recrods: Extra inputs are not permitted"):
        load_scenario(path)
    path.write_text('{"sources": [', encoding="utf-8")
    with pytest.raises(BosConfigurationError, match="not valid JSON"):
        load_scenario(path)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"sources": [{"source_identity": "a", "page_size": 0}]}, "page_size"),
        ({"sources": [{"source_identity": "a", "page_size": 101}]}, "page_size"),
        ({"sources": [{"source_identity": "a", "records": 100, "page_size": 50, "error": "rate_limited",
                       "error_after_pages": 3}]}, "exceeds the 2 page"),
        ({"sources": [{"source_identity": "a", "error_after_pages": 1}]}, "error is not"),
        ({"sources": [{"source_identity": "a", "error": "teapot"}]}, "sources.0.error"),
        ({"sources": [{"source_identity": "a"}, {"source_identity": "a"}]}, "appears twice"),
        ({"shared_people": 11, "sources": [{"source_identity": "a"}]}, "shared_people=11 exceeds"),
        ({"sources": []}, "sources"),
        ({"observed_at": "2026-10-08T12:00:00", "sources": [{"source_identity": "a"}]}, "timezone"),
        ({"contexts": [{"context_handle": "x"}], "sources": [{"source_identity": "a"}]}, "is_default"),
        ({"faults": {"stall": True, "drop_before_final": True}, "sources": [{"source_identity": "a"}]},
         "one stream"),
        ({"faults": {"final_error": {"message": "x"}}, "sources": [{"source_identity": "a"}]}, "integer"),
    ],
)
def test_invalid_scenarios_fail_loudly(tmp_path: Path, data: dict, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(BosConfigurationError, match=message.replace(".", r"\.")):
        load_scenario(path)


def test_contexts_default_to_two_with_the_first_default() -> None:
    contexts = BUILTIN_SCENARIOS["complete"].resolved_contexts()
    assert [c["is_default"] for c in contexts] == [True, False]
    assert FaultSpec() == BUILTIN_SCENARIOS["complete"].faults


# --- stream and final rules per builtin ---------------------------------------------------------


@pytest.mark.parametrize("name", SMALL_BUILTINS)
def test_builtin_stream_and_final_follow_the_contract(name: str) -> None:
    scenario = load_scenario(name)
    read = plan(scenario)
    notes = check_stream(read, scenario)
    check_final(read, scenario, notes)


def test_large_builtin_follows_the_contract() -> None:
    scenario = load_scenario("large")
    read = plan(scenario, request_id=7)
    notes = check_stream(read, scenario, validate_every=97)
    final = check_final(read, scenario, notes, validate_every=997)
    assert len(final) == 100_000


def test_sources_interleave_when_they_overlap_in_time() -> None:
    order = [p["source"]["source_identity"] for _, p in plan("complete").iter_notifications()]
    # Not grouped: some source reappears after another source's notification.
    runs = [s for i, s in enumerate(order) if i == 0 or order[i - 1] != s]
    assert len(runs) > len(set(runs))
    assert order == ["crm-eu", "hr-main", "ldap", "crm-eu", "hr-main", "hr-main", "crm-eu", "crm-eu"]


def test_simultaneous_notifications_follow_scenario_source_order() -> None:
    scenario = Scenario(
        sources=[SourceSpec(source_identity="b", records=150), SourceSpec(source_identity="a", records=50)]
    )
    order = [(p["source"]["source_identity"], p["status"]) for _, p in plan(scenario).iter_notifications()]
    assert order == [("b", "page"), ("b", "page"), ("b", "complete"), ("a", "page"), ("a", "complete")]


def test_at_most_eight_sources_run_at_once() -> None:
    specs = [SourceSpec(source_identity=f"s{i}", records=300, page_delay_ms=10) for i in range(9)]
    notes = list(plan(Scenario(sources=specs)).iter_notifications())
    first_of_ninth = min(t for t, p in notes if p["source"]["source_identity"] == "s8")
    first_terminal = min(t for t, p in notes if p["status"] != "page")
    assert first_of_ninth == first_terminal == 20.0


# --- identity merge -----------------------------------------------------------------------------


def test_identity_merge_collapses_shared_people() -> None:
    scenario = load_scenario("identity_merge")
    read = plan(scenario)
    notes = list(read.iter_notifications())
    provisional = {
        (p["source"]["source_identity"], r["sources"][0]["external_id"]): r
        for _, p in notes
        for r in p["records"]
    }
    assert len(provisional) == 100
    final = list(read.iter_final_records())
    assert len(final) == 60 == read.final_metadata["result_count"]
    merged = [r for r in final if len(r["sources"]) > 1]
    assert len(merged) == 40
    for record in merged:
        assert [e["source_identity"] for e in record["sources"]] == ["crm-eu", "hr-main"]
        assert record["identity_match"]["method"] == "email"
        assert 0 < record["identity_match"]["confidence"] <= 1
        views = [provisional[(e["source_identity"], e["external_id"])] for e in record["sources"]]
        assert views[0]["record_ref"] != views[1]["record_ref"] != record["record_ref"]
        assert record["email"] is not None
        assert {(v["display_name"], v["email"]) for v in views} == {(record["display_name"], record["email"])}
    assert all(r["identity_match"] is None for r in final if len(r["sources"]) == 1)


def test_records_delivered_before_a_source_error_are_kept() -> None:
    read = plan("partial")
    notes = list(read.iter_notifications())
    timed_out = {
        r["sources"][0]["external_id"]
        for _, p in notes
        if p["source"]["source_identity"] == "crm-us"
        for r in p["records"]
    }
    assert len(timed_out) == 200
    final = list(read.iter_final_records())
    kept = {e["external_id"] for r in final for e in r["sources"] if e["source_identity"] == "crm-us"}
    assert kept == timed_out
    # Shared people delivered by crm-us before it timed out carry its provenance too.
    three_way = [r for r in final if len(r["sources"]) == 3]
    assert three_way and all(r["sources"][2]["source_identity"] == "crm-us" for r in three_way)
    assert read.final_metadata["result_count"] == 230 + 100 + (200 - len(three_way)) + 20


@pytest.mark.parametrize("code", sorted(SOURCE_ERROR_CODES))
def test_each_error_code_makes_a_partial_result(code: str) -> None:
    scenario = Scenario(
        sources=[
            SourceSpec(source_type="hr", source_identity="hr-main", records=30),
            SourceSpec(source_type="crm", source_identity="crm-eu", records=30, page_size=10, error=code,
                       error_after_pages=1),
        ],
    )
    read = plan(scenario)
    notes = check_stream(read, scenario)
    check_final(read, scenario, notes)
    error = next(p for _, p in notes if p["status"] == "error")
    assert error["pageIndex"] == 1 and error["error"] == {"code": code}
    assert read.is_error
    assert read.final_metadata["source_errors"] == [
        {"source": {"source_type": "crm", "source_identity": "crm-eu"}, "error": {"code": code}}
    ]
    assert read.final_metadata["result_count"] == 40


def test_all_sources_failing_is_partial_with_zero_records() -> None:
    read = plan("all_errors")
    assert read.final_metadata["completeness"] == "partial" and read.is_error
    assert read.final_metadata["result_count"] == 0 and list(read.iter_final_records()) == []
    assert len(read.final_metadata["source_errors"]) == 5 and read.final_metadata["provenance"] == []
    assert all(p["pageIndex"] == 0 and p["status"] == "error" for _, p in read.iter_notifications())


def test_empty_source_completes_with_page_index_zero() -> None:
    read = plan("empty")
    notes = [(p["pageIndex"], p["status"], p["records"]) for _, p in read.iter_notifications()]
    assert notes == [(0, "complete", [])]
    assert read.final_metadata["completeness"] == "complete" and not read.is_error
    assert "source_errors" not in read.final_metadata and read.final_record_count == 0


def test_build_operation_result_is_the_materialised_final() -> None:
    read = plan("partial")
    result = build_operation_result(read)
    assert set(result) == {"result", "metadata"}
    assert result["result"] == list(read.iter_final_records())
    assert result["metadata"] == read.final_metadata
    result["metadata"]["source_errors"].clear()
    assert read.final_metadata["source_errors"], "the plan's metadata is not shared"


def test_record_data_has_unicode_nulls_and_nesting() -> None:
    final = list(plan("partial").iter_final_records())
    names = [r["display_name"] for r in final if r["display_name"]]
    assert any(not n.isascii() for n in names)
    assert any(r["email"] is None for r in final) and any(r["phone"] is None for r in final)
    assert any(r["lifecycle"] is None for r in final)
    assert any(isinstance(r["attributes"].get("employment"), dict) for r in final)
    assert any(isinstance(r["attributes"].get("locations"), list) for r in final)
    assert any(r["attributes"] == {} for r in final)
    # The records survive a JSON round trip unchanged (what the server sends is what we made).
    assert json.loads(json.dumps(final, ensure_ascii=False)) == final


# --- determinism --------------------------------------------------------------------------------


def test_same_scenario_same_output() -> None:
    first, second = plan("partial"), plan("partial")
    assert list(first.iter_notifications()) == list(second.iter_notifications())
    assert list(first.iter_final_records()) == list(second.iter_final_records())
    assert list(first.iter_final_records()) == list(first.iter_final_records())


def test_revision_changes_content_not_identities() -> None:
    base = load_scenario("partial")
    revised = base.model_copy(update={"revision": 1})
    old, new = list(plan(base).iter_final_records()), list(plan(revised).iter_final_records())
    identity = lambda r: (r["record_ref"], r["display_name"], r["email"],  # noqa: E731
                          [(e["source_identity"], e["external_id"]) for e in r["sources"]])
    assert [identity(r) for r in old] == [identity(r) for r in new]
    changed = sum(1 for a, b in zip(old, new, strict=True) if a != b)
    assert 0 < changed < len(old), "a revision changes some records, not all"
    old_pages = [[r["record_ref"] for r in p["records"]] for _, p in plan(base).iter_notifications()]
    new_pages = [[r["record_ref"] for r in p["records"]] for _, p in plan(revised).iter_notifications()]
    assert old_pages == new_pages


def test_seed_changes_identities() -> None:
    base = load_scenario("complete")
    other = base.model_copy(update={"seed": base.seed + 1})
    old = {r["record_ref"] for r in plan(base).iter_final_records()}
    new = {r["record_ref"] for r in plan(other).iter_final_records()}
    assert len(old) == len(new) and not old & new


# --- scale --------------------------------------------------------------------------------------


def test_iterators_do_not_materialise_a_million_records() -> None:
    read = plan(large_scenario(1_000_000))
    assert read.final_record_count == 1_000_000
    tracemalloc.start()
    try:
        notes = read.iter_notifications()
        _, params = next(notes)
        records = read.iter_final_records()
        first = next(records)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(params["records"]) == 100 and first["record_ref"].startswith("bos:person:")
    assert peak < 2 * 1024 * 1024


# --- properties ---------------------------------------------------------------------------------

_codes = st.sampled_from(sorted(SOURCE_ERROR_CODES))


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    count = draw(st.integers(1, 4))
    specs = []
    for i in range(count):
        records = draw(st.integers(0, 40))
        page_size = draw(st.integers(1, 15))
        error = draw(st.none() | _codes)
        after = draw(st.integers(0, -(-records // page_size))) if error else 0
        specs.append(SourceSpec(
            source_type=draw(st.sampled_from(["crm", "hr"])), source_identity=f"src-{i}", records=records,
            page_size=page_size, error=error, error_after_pages=after,
            start_delay_ms=draw(st.sampled_from([0.0, 1.0, 2.5])),
            page_delay_ms=draw(st.sampled_from([0.0, 1.0, 3.0])),
        ))
    non_empty = [s.records for s in specs if s.records]
    shared = draw(st.integers(0, min(non_empty))) if non_empty else 0
    return Scenario(seed=draw(st.integers(0, 2**40)), shared_people=shared, sources=specs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_any_scenario_follows_the_contract(scenario: Scenario) -> None:
    read = plan(scenario)
    notes = check_stream(read, scenario)
    final = check_final(read, scenario, notes)
    shared_seen = [r for r in final if len(r["sources"]) > 1]
    assert len(shared_seen) <= scenario.shared_people

"""A scenario's population over days, read through the reference server over HTTP.

The builtin ``people_over_time``: day 1 230 people; day 2 20 pairs merged and 10 leavers (200);
day 3 one merge split back, one joiner, three changes; day 4 the same people with ``hr-main``
failing (partial). What each day changed is checked against the day before as a client sees
it, not against the engine's own bookkeeping.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_server_faults import call, notifications_and_finals

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.models import FederatedRecord, ReadMetadata
from airflow_provider_bos.testing import BosReferenceServer
from airflow_provider_bos.testing.federation import day_changes, expected_final, plan_read, unstamped
from airflow_provider_bos.testing.scenario import DaySpec, Scenario, SourceSpec, load_scenario

SCENARIO = "people_over_time"


def read(server: BosReferenceServer) -> tuple[list[dict], dict, bytes]:
    """(page notifications' params, the final JSON-RPC response, the final event's raw bytes)."""
    response, raw, error = call(server)
    assert response.status_code == 200 and error is None
    notes, finals = notifications_and_finals(raw)
    assert len(finals) == 1
    final_bytes = raw[raw.rindex(b'{"jsonrpc"'):]
    return [n["params"] for n in notes], finals[0], final_bytes


def final_of(response: dict) -> tuple[list[dict], dict]:
    content = response["result"]["structuredContent"]
    return content["result"], content["metadata"]


def keys(record: dict) -> set[tuple[str, str]]:
    return {(e["source_identity"], e["external_id"]) for e in record["sources"]}


def owner_of(records: list[dict]) -> dict[tuple[str, str], str]:
    """provenance key -> the ref of the one record that holds it."""
    found = Counter(k for r in records for k in keys(r))
    assert set(found.values()) <= {1}, "a provenance key is in one final record only"
    return {k: r["record_ref"] for r in records for k in keys(r)}


def test_day_two_merges_pairs_into_new_refs_and_drops_leavers(bos_server_factory) -> None:
    server = bos_server_factory(scenario=SCENARIO)
    _, day1_response, _ = read(server)
    server.set_day(2)
    pages2, day2_response, _ = read(server)
    day1, meta1 = final_of(day1_response)
    day2, meta2 = final_of(day2_response)

    assert (len(day1), meta1["completeness"], meta1["result_count"]) == (230, "complete", 230)
    assert (len(day2), meta2["completeness"], meta2["result_count"]) == (200, "complete", 200)
    assert day2_response["result"]["isError"] is False
    assert datetime.fromisoformat(meta2["observed_at"]) > datetime.fromisoformat(meta1["observed_at"])
    ReadMetadata.model_validate(meta2)

    by_ref1 = {r["record_ref"]: r for r in day1}
    by_ref2 = {r["record_ref"]: r for r in day2}
    owner1 = owner_of(day1)
    new_refs = by_ref2.keys() - by_ref1.keys()
    assert len(new_refs) == 20
    merged_away: set[str] = set()
    for ref in new_refs:
        record = by_ref2[ref]
        assert [e["source_identity"] for e in record["sources"]] == ["crm-eu", "hr-main"]
        assert record["identity_match"] is not None
        FederatedRecord.model_validate(record)
        olds = {owner1[k] for k in keys(record)}
        assert len(olds) == 2, "the merged record joins two records of day 1"
        assert all(len(by_ref1[old]["sources"]) == 1 for old in olds)
        names = {by_ref1[old]["display_name"] for old in olds} - {None}
        assert len(names) == 1 and record["display_name"] in names, "one person seen twice, by name"
        assert record["email"] is not None
        merged_away |= olds
    assert not merged_away & by_ref2.keys(), "a merged-away ref is not returned any more"

    leavers = by_ref1.keys() - by_ref2.keys() - merged_away
    assert len(leavers) == 10
    day2_keys = set(owner_of(day2))
    paged = {(p["source"]["source_identity"], r["sources"][0]["external_id"]) for p in pages2 for r in p["records"]}
    for ref in leavers:
        assert not keys(by_ref1[ref]) & (day2_keys | paged), "a leaver is in neither the final nor the pages"
    assert paged == day2_keys, "every record delivered on day 2 is in exactly one final record"

    untouched = by_ref1.keys() & by_ref2.keys()
    assert len(untouched) == 180
    assert all(unstamped(by_ref1[ref]) == unstamped(by_ref2[ref]) for ref in untouched), \
        "untouched people stream the same content"
    # Each read re-stamps (the contract's example): day 2 observes everyone anew, untouched or not.
    day2_stamps = {e["observed_at"] for r in day2 for e in r["sources"]}
    assert day2_stamps.isdisjoint({e["observed_at"] for r in day1 for e in r["sources"]})

    changes = day_changes(SCENARIO, 2)
    assert set(changes.left) == leavers
    assert changes.merged.keys() == new_refs
    assert {old for pair in changes.merged.values() for old in pair} == merged_away
    assert [(e.record_ref, e.record) for e in expected_final(SCENARIO, 2).records] == [
        (r["record_ref"], r) for r in day2
    ]


def test_day_three_splits_a_merge_adds_a_joiner_and_changes_fields(bos_server_factory) -> None:
    server = bos_server_factory(scenario=SCENARIO, day=2)
    day2 = {r["record_ref"]: r for r in final_of(read(server)[1])[0]}
    with httpx.Client(timeout=10) as http:
        assert http.post(server.base_url + "/_bos/admin/day", json={"day": 3}).json() == {
            "scenario": SCENARIO, "day": 3, "days": 4}
    records3, meta3 = final_of(read(server)[1])
    day3 = {r["record_ref"]: r for r in records3}
    assert meta3["completeness"] == "complete" and len(day3) == 202

    gone = day2.keys() - day3.keys()
    assert len(gone) == 1
    split = day2[gone.pop()]
    assert len(split["sources"]) == 2
    owner3 = owner_of(records3)
    back = {owner3[k] for k in keys(split)}
    assert len(back) == 2 and not back & day2.keys(), "the split gives back two records"
    day1 = expected_final(SCENARIO, 1).by_ref()
    assert back <= day1.keys(), "a split person gets the ref they had before the merge"
    assert all(len(day3[ref]["sources"]) == 1 for ref in back)

    new = day3.keys() - day2.keys() - back
    assert len(new) == 1
    joiner = day3[new.pop()]
    assert len(joiner["sources"]) == 1 and not keys(joiner) & set(owner_of(list(day2.values())))

    changed = {ref for ref in day2.keys() & day3.keys() if unstamped(day2[ref]) != unstamped(day3[ref])}
    assert len(changed) == 3
    for ref in changed:
        before, after = day2[ref], day3[ref]
        assert (before["display_name"], before["email"], keys(before)) == (
            after["display_name"], after["email"], keys(after)), "a change keeps the identity"
        assert after["sources"][0]["observed_at"] > before["sources"][0]["observed_at"]
    assert set(day_changes(SCENARIO, 3).changed) == changed


def test_a_partial_day_reports_the_failing_source(bos_server_factory) -> None:
    server = bos_server_factory(scenario=SCENARIO, day=4)
    pages, response, _ = read(server)
    records, meta = final_of(response)
    assert response["result"]["isError"] is True
    assert meta["completeness"] == "partial"
    assert meta["source_errors"] == [{"source": {"source_type": "hr", "source_identity": "hr-main"},
                                      "error": {"code": "source_timeout"}}]
    terminal = {p["source"]["source_identity"]: p["status"] for p in pages if p["status"] != "page"}
    assert terminal == {"crm-eu": "complete", "hr-main": "error"}
    day3 = expected_final(SCENARIO, 3)
    assert len(records) == meta["result_count"] < len(day3.records)
    assert {r["record_ref"] for r in records} < day3.refs, "a partial day holds fragments of day 3's people"
    assert [r["record_ref"] for r in records] == [e.record_ref for e in expected_final(SCENARIO, 4).records]


def test_same_scenario_and_day_stream_the_same_final_bytes(bos_server_factory) -> None:
    first = bos_server_factory(scenario=SCENARIO, day=2)
    second = bos_server_factory(scenario=load_scenario(SCENARIO))
    *_, bytes_first = read(first)
    second.set_day(3)
    *_, other_day = read(second)
    second.set_day(2)
    *_, bytes_second = read(second)
    assert bytes_first == bytes_second
    assert other_day != bytes_first


def test_admin_day_endpoint_validates_the_day(bos_server_factory) -> None:
    server = bos_server_factory(scenario=SCENARIO)
    url = server.base_url + "/_bos/admin/day"
    with httpx.Client(timeout=10) as http:
        assert http.get(url).json() == {"scenario": SCENARIO, "day": 1, "days": 4}
        for body in ({"day": 5}, {"day": 0}, {"day": "2"}, {"day": True}, {"day": 2.0}, {}, {"day": 2, "x": 1}, [2]):
            response = http.post(url, json=body)
            assert response.status_code == 400, body
            assert "day" in response.json()["error"]
        assert "days 1 to 4" in http.post(url, json={"day": 5}).json()["error"]
        assert http.post(url, content=b"{not json").status_code == 400
        assert server.day == 1
        assert http.post(url, json={"day": 4}).status_code == 200
        assert server.day == 4
        assert http.post(server.base_url + "/_bos/admin/scenario", json={"name": "complete"}).status_code == 200
        assert http.get(url).json() == {"scenario": "complete", "day": 1, "days": 1}
        assert "only day 1" in http.post(url, json={"day": 2}).json()["error"]


def test_a_day_outside_the_scenario_is_a_configuration_error(bos_server) -> None:
    with pytest.raises(BosConfigurationError, match="only day 1"):
        BosReferenceServer(scenario="complete", day=2)
    with pytest.raises(BosConfigurationError, match="days 1 to 4"):
        BosReferenceServer(scenario=SCENARIO, day=5)
    with pytest.raises(BosConfigurationError, match="does not exist"):
        bos_server.set_day(2)
    with pytest.raises(BosConfigurationError):
        bos_server.set_scenario(SCENARIO, day=0)
    assert (bos_server.scenario.name, bos_server.day) == ("complete", 1)
    with pytest.raises(BosConfigurationError):
        expected_final(SCENARIO, 9)


def test_cli_serves_the_day_asked_for() -> None:
    command = [sys.executable, "-m", "airflow_provider_bos.testing.server", "--port", "0", "--scenario", SCENARIO]
    refused = subprocess.run([*command, "--day", "7"], capture_output=True, text=True, timeout=30, check=False)
    assert refused.returncode == 2 and "day 7 does not exist" in refused.stderr
    process = subprocess.Popen([*command, "--day", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        mcp_url = process.stdout.readline().rsplit(" ", 1)[-1].strip()
        assert "day 2 of 4" in process.stdout.readline()
        base = mcp_url.split("/mcp/", 1)[0]
        assert httpx.get(base + "/_bos/admin/day", timeout=10).json()["day"] == 2
    finally:
        process.terminate()
        process.wait(timeout=15)


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "days.json"
    path.write_text(json.dumps(data))
    return path


BASE = {"name": "mine", "seed": 3, "shared_people": 2, "sources": [
    {"source_type": "crm", "source_identity": "crm-a", "records": 12, "page_size": 5},
    {"source_type": "hr", "source_identity": "hr-b", "records": 8, "page_size": 5},
]}


def test_a_json_scenario_with_days_is_served(bos_server, tmp_path: Path) -> None:
    path = write(tmp_path, {**BASE, "days": [
        {"day": 2, "merge": [{"sources": ["crm-a", "hr-b"], "count": 2}], "leave": [{"source": "hr-b", "count": 1}]},
    ]})
    scenario = load_scenario(str(path))
    assert scenario.day_count == 2
    assert scenario.day_observed_at()[1] == datetime.fromisoformat("2026-10-09T12:00:00+00:00")
    bos_server.set_scenario(scenario, day=2)
    records, meta = final_of(read(bos_server)[1])
    assert meta["observed_at"] == "2026-10-09T12:00:00+00:00"
    # day 1: 2 shared + 10 + 6 own = 18; two pairs merged (-2), one leaver (-1)
    assert len(records) == 15 == len(expected_final(scenario, 2).records)
    assert sum(len(r["sources"]) == 2 for r in records) == 4


@pytest.mark.parametrize(("days", "message"), [
    ([{"day": 3}], "days[0] is day 3"),
    ([{"day": 2, "observed_at": "2026-10-08T11:00:00Z"}], "is not later than day 1"),
    ([{"day": 2, "observed_at": "tomorrow"}], "not an ISO 8601 timestamp"),
    ([{"day": 2, "leave": [{"source": "nope", "count": 1}]}], "day 2 leave[0]: 'nope' is not a source"),
    ([{"day": 2, "leave": [{"source": "hr-b", "count": 7}]}], "has only 6 own people left to pick"),
    ([{"day": 2, "merge": [{"sources": ["hr-b", "hr-b"], "count": 1}]}], "two different sources"),
    ([{"day": 2, "split": 1}], "only 0 are merged"),
    ([{"day": 2, "leaves": [{"source": "hr-b", "count": 1}]}], "days.0.leaves: Extra inputs are not permitted"),
    ([{"day": 2, "leave": [{"source": "hr-b", "count": 0}]}], "days.0.leave.0.count"),
    ([{"day": 2, "fail": [{"source": "hr-b", "error": "boom"}]}], "days.0.fail.0.error"),
    ([{"day": 2, "fail": [{"source": "hr-b", "error": "source_timeout", "error_after_pages": 3}]}],
     "exceeds the 2 page(s)"),
    ([{"day": 2, "merge": [{"sources": ["crm-a", "hr-b"], "count": 6}]}, {"day": 3, "leave": [
        {"source": "hr-b", "count": 1}]}], "day 3 leave[0]: source 'hr-b' has only 0 own people"),
])
def test_bad_day_specs_fail_loudly(tmp_path: Path, days: list, message: str) -> None:
    with pytest.raises(BosConfigurationError) as caught:
        load_scenario(str(write(tmp_path, {**BASE, "days": days})))
    assert message in str(caught.value)


# --- the engine, for any days ----------------------------------------------------------------------

@st.composite
def scenarios_with_days(draw: st.DrawFn) -> Scenario:
    sizes = [draw(st.integers(6, 30)) for _ in range(2)]
    sources = [SourceSpec(source_type=kind, source_identity=f"{kind}-{i}", records=n,
                          page_size=draw(st.integers(1, 9)))
               for i, (kind, n) in enumerate(zip(("crm", "hr"), sizes, strict=True))]
    scenario = Scenario(seed=draw(st.integers(0, 2**32)), shared_people=draw(st.integers(0, 2)), sources=sources)
    for day in range(2, draw(st.integers(2, 5)) + 1):
        spec = DaySpec(
            day=day,
            leave=[{"source": "hr-1", "count": 1}] if draw(st.booleans()) else [],
            merge=[{"sources": ["crm-0", "hr-1"], "count": draw(st.integers(1, 2))}] if draw(st.booleans()) else [],
            split=draw(st.integers(0, 1)),
            join=[{"source": "crm-0", "count": draw(st.integers(1, 3))}] if draw(st.booleans()) else [],
            change=[{"source": "crm-0", "count": 1}] if draw(st.booleans()) else [],
            fail=[{"source": "crm-0", "error": "source_timeout", "error_after_pages": 1}] if draw(st.booleans())
            else [],
        )
        try:
            scenario = Scenario.model_validate({**scenario.model_dump(), "days": [*scenario.days, spec]})
        except ValueError:
            break  # e.g. nothing left to split, or too few people to pick: the day cannot happen
    return scenario


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios_with_days())
def test_every_day_keeps_the_contract(scenario: Scenario) -> None:
    previous: datetime | None = None
    for day in range(1, scenario.day_count + 1):
        planned = plan_read(scenario, request_id=1, context={}, arguments={}, day=day)
        final = list(planned.iter_final_records())
        meta = planned.final_metadata
        assert meta["result_count"] == len(final) == planned.final_record_count
        refs = [r["record_ref"] for r in final]
        assert len(set(refs)) == len(refs)
        delivered = Counter((p["source"]["source_identity"], r["sources"][0]["external_id"])
                            for _, p in planned.iter_notifications() for r in p["records"])
        assert Counter(k for r in final for k in keys(r)) == delivered
        observed = datetime.fromisoformat(meta["observed_at"])
        assert all(datetime.fromisoformat(e["observed_at"]) <= observed
                   for r in final for e in r["sources"])
        assert previous is None or observed > previous
        previous = observed
        again = plan_read(scenario, request_id=1, context={}, arguments={}, day=day)
        assert list(again.iter_final_records()) == final

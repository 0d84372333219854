"""``record_values: "whole_contract"``: the reference server sends every value the contract admits.

The builtin ``whole_contract`` turns it on over four days. Each value kind is looked for in the
finals a client receives over HTTP (and those finals are the engine's ``expected_final``), then
the days are compared with the engine's own day functions: a change moves a person's values to
other JSON types on that day only, and everyone else keeps their bytes (bar ``observed_at``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError
from test_server_faults import call, notifications_and_finals

from airflow_provider_bos.models import FederatedRecord
from airflow_provider_bos.testing import BosReferenceServer
from airflow_provider_bos.testing.federation import day_changes, expected_final, plan_read, unstamped
from airflow_provider_bos.testing.scenario import BUILTIN_SCENARIOS, Scenario, SourceSpec, load_scenario
from airflow_provider_bos.testing.streaming import MID_FINAL, final_frame_pieces

SCENARIO = "whole_contract"
JSON_TYPES = {"string", "integer", "float", "boolean", "array", "object", "null"}
NAMED_PROVENANCE_KEYS = {"source_type", "source_identity", "external_id", "record_type", "observed_at",
                         "capabilities", "version"}


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):  # before int: a bool is an int to Python
        return "boolean"
    return {int: "integer", float: "float", str: "string", list: "array", dict: "object"}[type(value)]


def walk(value: Any, key: str | None = None, depth: int = 0) -> Iterator[tuple[str | None, Any, int]]:
    """``(its key or None, value, containers around it)`` for ``value`` and everything inside it."""
    yield key, value, depth
    if isinstance(value, dict):
        for inner_key, inner in value.items():
            yield from walk(inner, inner_key, depth + 1)
    elif isinstance(value, list):
        for inner in value:
            yield from walk(inner, None, depth + 1)


def scalars(records: list[dict]) -> list[Any]:
    return [v for r in records for _, v, _ in walk(r["attributes"]) if not isinstance(v, dict | list)]


@pytest.fixture(scope="module")
def reads_over_http() -> dict[int, tuple[list[dict], dict]]:
    """Every day's page notifications' params and final JSON-RPC response, as a client receives them."""
    reads = {}
    with BosReferenceServer(scenario=SCENARIO) as server:
        for day in range(1, load_scenario(SCENARIO).day_count + 1):
            server.set_day(day)
            response, raw, error = call(server)
            assert response.status_code == 200 and error is None
            notes, frames = notifications_and_finals(raw)
            reads[day] = ([n["params"] for n in notes], frames[-1])
    return reads


@pytest.fixture(scope="module")
def finals_over_http(reads_over_http: dict[int, tuple[list[dict], dict]]) -> dict[int, dict]:
    return {day: final for day, (_, final) in reads_over_http.items()}


def records_of(response: dict) -> list[dict]:
    """The records of a direct read tool's final (``call`` reads with ``search_people``)."""
    return response["result"]["structuredContent"]["result"]


def test_the_builtin_turns_it_on_over_four_days_with_a_partial_one() -> None:
    scenario = BUILTIN_SCENARIOS[SCENARIO]
    assert scenario.record_values == "whole_contract" and scenario.day_count == 4
    assert len(scenario.sources) == 2
    completeness = [expected_final(SCENARIO, day).completeness for day in range(1, 5)]
    assert completeness == ["complete", "complete", "complete", "partial"]
    assert all(40 <= len(expected_final(SCENARIO, day).records) <= 80 for day in range(1, 5))
    assert BUILTIN_SCENARIOS["people_over_time"].record_values == "narrow"


def test_the_option_is_validated_and_narrow_by_default() -> None:
    assert Scenario(sources=[SourceSpec(source_identity="a")]).record_values == "narrow"
    with pytest.raises(ValidationError, match="record_values"):
        Scenario(sources=[SourceSpec(source_identity="a")], record_values="wide")  # type: ignore[arg-type]


def test_a_narrow_scenario_sends_only_the_usual_shapes() -> None:
    records = [r.record for r in expected_final("people_over_time", 1).records]
    assert {json_type(r["lifecycle"]) for r in records} <= {"object", "null"}
    assert all(set(e) == NAMED_PROVENANCE_KEYS for r in records for e in r["sources"])


def test_the_server_delivers_the_engines_final_through_both_encodings(finals_over_http: dict[int, dict]) -> None:
    for day, response in finals_over_http.items():
        structured = response["result"]["structuredContent"]
        assert json.loads(response["result"]["content"][0]["text"]) == structured
        assert records_of(response) == [r.record for r in expected_final(SCENARIO, day).records]
        for record in records_of(response):
            FederatedRecord.model_validate(record)
        json.dumps(structured, allow_nan=False)  # no NaN or Infinity anywhere


def test_pages_carry_the_same_values(reads_over_http: dict[int, tuple[list[dict], dict]]) -> None:
    records = [r for pages, _ in reads_over_http.values() for params in pages for r in params["records"]]
    for record in records:
        FederatedRecord.model_validate(record)
        assert set(record["sources"][0]) > NAMED_PROVENANCE_KEYS
    json.dumps(records, allow_nan=False)
    assert {json_type(r["lifecycle"]) for r in records} == JSON_TYPES


def test_big_integers_leave_the_server_as_integers(bos_server_factory) -> None:
    server = bos_server_factory(scenario=SCENARIO)
    _, raw, _ = call(server)
    _, plain, _ = call(server, opt_in=None)  # the plain JSON response too
    streamed = notifications_and_finals(raw)[1][-1]
    for response in (streamed, json.loads(plain)):
        # Both encodings: structuredContent, and the JSON text of content[0].
        for content in (response["result"]["structuredContent"], json.loads(response["result"]["content"][0]["text"])):
            big = [v for r in content["result"] if r["attributes"] for v in r["attributes"]["big numbers"].values()]
            assert big and all(type(v) is int and abs(v) >= 1 << 64 for v in big)
    for body in (raw, plain):
        assert f"{1 << 70}," in body.decode("utf-8") or f"{1 << 70}}}" in body.decode("utf-8")  # digits, not 1.18e+21


def test_lifecycle_and_identity_match_take_every_json_type(finals_over_http: dict[int, dict]) -> None:
    records = [r for response in finals_over_http.values() for r in records_of(response)]
    assert {json_type(r["lifecycle"]) for r in records} == JSON_TYPES
    assert {json_type(r["identity_match"]) for r in records} == JSON_TYPES


def test_attributes_hold_every_awkward_value(finals_over_http: dict[int, dict]) -> None:
    records = [r for response in finals_over_http.values() for r in records_of(response)]
    values = scalars(records)
    numbers = [v for v in values if json_type(v) in {"integer", "float"}]
    assert any(v >= 1 << 70 for v in numbers) and any(v <= -(1 << 70) for v in numbers)
    assert {5e-324, -1.5e-300, -0.25} <= {v for v in numbers if isinstance(v, float)}

    found = [(key, value, depth) for r in records for key, value, depth in walk(r["attributes"])]
    # 12 containers nested inside the attributes object
    assert max(depth for _, value, depth in found if isinstance(value, dict | list)) >= 12
    keys = {key for key, _, _ in found if isinstance(key, str)}
    assert "" in keys
    assert any(" " in key for key in keys) and any(not key.isascii() for key in keys)
    assert any(value == {} for _, value, _ in found) and any(value == [] for _, value, _ in found)
    assert {} in [r["attributes"] for r in records]  # a whole attributes object empty
    assert any(isinstance(v, list) and v and all(isinstance(i, dict) for i in v) for _, v, _ in found)


def test_provenance_carries_keys_beyond_the_named_seven(finals_over_http: dict[int, dict]) -> None:
    entries = [e for response in finals_over_http.values() for r in records_of(response) for e in r["sources"]]
    assert all(set(e) > NAMED_PROVENANCE_KEYS for e in entries)
    assert all(isinstance(e["label"], str) and isinstance(e["link"], dict) for e in entries)
    assert any(isinstance(v, dict) for e in entries for v in e["link"].values())  # nested further


def test_display_names_are_sometimes_empty_emoji_or_right_to_left(finals_over_http: dict[int, dict]) -> None:
    names = {r["display_name"] for response in finals_over_http.values() for r in records_of(response)}
    assert "" in names and None in names
    assert any("\U0001f98a" in n or "\U0001f469" in n for n in names if n)  # emoji
    rtl = [n for n in names if n and "\u200f" in n]
    assert any(any("\u0600" <= c <= "\u06ff" for c in n) for n in rtl)  # Arabic
    assert any(any("\u0590" <= c <= "\u05ff" for c in n) for n in rtl)  # Hebrew


def test_the_same_scenario_streams_the_same_bytes() -> None:
    def stream(scenario: Scenario, day: int) -> str:
        read = plan_read(scenario, request_id="r", context={"context_handle": "c"}, arguments={}, day=day)
        pages = json.dumps([params for _, params in read.iter_notifications()], ensure_ascii=False)
        final = "".join(p for p in final_frame_pieces(read, request_id="r", style="execute",
                                                      context={"context_handle": "c"}, stateless=False,
                                                      server_info=None, faults=scenario.faults)
                        if p is not MID_FINAL)
        return pages + final

    copy = Scenario.model_validate_json(load_scenario(SCENARIO).model_dump_json())
    for day in range(1, 5):
        assert stream(load_scenario(SCENARIO), day) == stream(copy, day)


def test_types_change_on_the_days_people_change_and_nobody_else_moves() -> None:
    finals = {day: expected_final(SCENARIO, day).by_ref() for day in range(1, 5)}
    lifecycle_types: dict[str, list[str]] = {}
    for day in range(2, 5):
        changed = set(day_changes(SCENARIO, day).changed)
        retyped = 0
        for ref, today in finals[day].items():
            before = finals[day - 1].get(ref)
            # The partial day drops a provenance entry of someone it still returns: not comparable.
            if before is None or before.provenance != today.provenance:
                continue
            was, now = before.record, today.record
            if ref in changed:
                assert json_type(was["lifecycle"]) != json_type(now["lifecycle"]), ref
                assert json_type(was["identity_match"]) != json_type(now["identity_match"]), ref
                retyped += 1
                lifecycle_types.setdefault(ref, [json_type(was["lifecycle"])]).append(json_type(now["lifecycle"]))
            else:
                assert json.dumps(unstamped(was)) == json.dumps(unstamped(now)), ref
                assert was["sources"] != now["sources"]  # re-stamped all the same
        assert retyped >= 3, f"day {day} retypes someone"
    # Someone changed on several days goes through three JSON types (e.g. string, object, null).
    assert any(len(set(types)) >= 3 for types in lifecycle_types.values())

"""Applying a policy to records as BOS returns them: what is stored for each field, and what is left alone."""

from __future__ import annotations

import copy
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_bos.pii import PiiKey, PiiPolicy, hash_value
from tests.pii.conftest import KEY_TEXT


def person(**changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "record_ref": "bos:person:42",
        "display_name": "Zoë Martin",
        "email": "Zoe.Martin@Example.org",
        "phone": "+49 (30) 1234-56",
        "lifecycle": {"state": "active"},
        "sources": [
            {"source_type": "hris", "source_identity": "workday-eu", "external_id": "WD-00042",
             "record_type": "person", "observed_at": "2026-10-08T12:00:00Z", "capabilities": ["read"],
             "version": "7"},
            {"source_type": "idp", "source_identity": "okta", "external_id": "00u1abcd",
             "record_type": "person", "observed_at": "2026-10-08T12:01:00Z", "capabilities": ["read"]},
        ],
        "identity_match": {"method": "email"},
        "attributes": {
            "employment": {"department": "Research", "cost_center": "CC-4711", "grade": 7,
                           "manager": {"name": "Ada", "employee_id": "WD-00001"}},
            "contacts": [{"kind": "private", "email": "zoe@home.example"}, {"kind": "desk", "email": None}],
            "location": "Berlin",
            "tags": ["a", "b"],
        },
    }
    record.update(changes)
    return record


def h(field: str, value: Any, key: PiiKey) -> str:
    digest = hash_value(key, field, value)
    assert digest is not None
    return digest


def test_top_level_fields_are_hashed_or_become_null(key: PiiKey) -> None:
    stored = PiiPolicy.parse({"email": "hash", "phone": "hash", "display_name": "drop"}).plan(key).apply(person())
    assert stored["email"] == h("email", "zoe.martin@example.org", key)
    assert stored["phone"] == h("phone", "+4930123456", key)
    assert "display_name" in stored and stored["display_name"] is None  # its column is NULL
    assert stored["record_ref"] == "bos:person:42"
    assert {k: v for k, v in stored.items() if k not in ("email", "phone", "display_name")} == {
        k: v for k, v in person().items() if k not in ("email", "phone", "display_name")}


def test_null_and_missing_fields_stay_null_and_missing(key: PiiKey) -> None:
    record = person(email=None)
    del record["phone"]
    stored = PiiPolicy.parse({"email": "hash", "phone": "drop"}).plan(key).apply(record)
    assert stored["email"] is None and "phone" not in stored


def test_every_provenance_external_id_is_hashed_and_nothing_else_of_it(key: PiiKey) -> None:
    stored = PiiPolicy.parse({"sources[].external_id": "hash"}).plan(key).apply(person())
    assert [s["external_id"] for s in stored["sources"]] == [h("sources[].external_id", "WD-00042", key),
                                                             h("sources[].external_id", "00u1abcd", key)]
    for got, original in zip(stored["sources"], person()["sources"], strict=True):
        assert {k: v for k, v in got.items() if k != "external_id"} == {
            k: v for k, v in original.items() if k != "external_id"}


def test_a_dropped_attribute_path_loses_its_key(key: PiiKey) -> None:
    stored = PiiPolicy.parse({"attributes.employment.cost_center": "drop"}).plan(None).apply(person())
    employment = stored["attributes"]["employment"]
    assert "cost_center" not in employment and employment["department"] == "Research"


def test_a_dropped_subtree_goes_whole(key: PiiKey) -> None:
    stored = PiiPolicy.parse({"attributes.employment.*": "drop"}).plan(None).apply(person())
    assert "employment" not in stored["attributes"] and stored["attributes"]["location"] == "Berlin"


def test_dropping_all_attributes_leaves_an_empty_object() -> None:
    assert PiiPolicy.parse({"attributes.*": "drop"}).plan(None).apply(person())["attributes"] == {}


def test_a_hashed_subtree_keeps_its_shape_with_every_leaf_hashed(key: PiiKey) -> None:
    stored = PiiPolicy.parse({"attributes.employment": "hash"}).plan(key).apply(person())
    # Each value in the domain of its own full path, under whichever rule hashed it.
    assert stored["attributes"]["employment"] == {
        "department": h("attributes.employment.department", "Research", key),
        "cost_center": h("attributes.employment.cost_center", "CC-4711", key),
        "grade": h("attributes.employment.grade", 7, key),
        "manager": {"name": h("attributes.employment.manager.name", "Ada", key),
                    "employee_id": h("attributes.employment.manager.employee_id", "WD-00001", key)},
    }


def test_lists_are_looked_through_and_null_leaves_stay_null(key: PiiKey) -> None:
    stored = PiiPolicy.parse({"attributes.contacts.email": "hash", "attributes.tags": "hash"}).plan(key).apply(person())
    assert stored["attributes"]["contacts"] == [
        {"kind": "private", "email": h("attributes.contacts.email", "zoe@home.example", key)},
        {"kind": "desk", "email": None}]
    assert stored["attributes"]["tags"] == [h("attributes.tags", "a", key), h("attributes.tags", "b", key)]


def test_the_most_specific_rule_wins(key: PiiKey) -> None:
    policy = PiiPolicy.parse({"attributes.*": "hash", "attributes.location": "keep",
                              "attributes.employment": "drop", "attributes.employment.department": "keep",
                              "attributes.employment.manager.name": "hash"})
    attributes = policy.plan(key).apply(person())["attributes"]
    assert attributes["location"] == "Berlin"
    assert attributes["employment"] == {"department": "Research",
                                        "manager": {"name": h("attributes.employment.manager.name", "Ada", key)}}
    assert attributes["tags"] == [h("attributes.tags", "a", key), h("attributes.tags", "b", key)]


def test_a_path_that_is_not_there_changes_nothing(key: PiiKey) -> None:
    plan = PiiPolicy.parse({"attributes.nowhere.deep": "drop", "attributes.location.sub": "hash"}).plan(key)
    assert plan.apply(person()) == person()
    assert plan.apply(person(attributes={}))["attributes"] == {}


def test_a_rule_below_a_scalar_applies_its_parents_action_to_it(key: PiiKey) -> None:
    # attributes.location is a string here; a source may send an object there tomorrow.
    policy = PiiPolicy.parse({"attributes.location": "hash", "attributes.location.city": "keep"})
    assert policy.plan(key).apply(person())["attributes"]["location"] == h("attributes.location", "Berlin", key)
    moved = person(attributes={"location": {"city": "Berlin", "street": "Unter den Linden 1"}})
    assert policy.plan(key).apply(moved)["attributes"]["location"] == {
        "city": "Berlin", "street": h("attributes.location.street", "Unter den Linden 1", key)}


def test_the_input_record_is_never_changed(key: PiiKey) -> None:
    record = person()
    before = copy.deepcopy(record)
    policy = PiiPolicy.parse({"email": "hash", "display_name": "drop", "sources[].external_id": "hash",
                              "attributes.employment.manager": "hash", "attributes.contacts.email": "drop",
                              "attributes.employment.cost_center": "drop"})
    policy.plan(key).apply(record)
    assert record == before


def test_keep_everything_returns_the_record_itself() -> None:
    record = person()
    plan = PiiPolicy.parse({"email": "keep"}).plan(None)
    assert plan.is_empty and plan.apply(record) is record


def test_untouched_parts_are_shared_not_copied(key: PiiKey) -> None:
    record = person()
    stored = PiiPolicy.parse({"attributes.employment.cost_center": "drop"}).plan(key).apply(record)
    assert stored["sources"] is record["sources"]
    assert stored["attributes"]["contacts"] is record["attributes"]["contacts"]


def test_the_same_record_hashes_alike_in_every_run_and_plan(key: PiiKey) -> None:
    policy = {"email": "hash", "attributes.employment": "hash"}
    first = PiiPolicy.parse(policy).plan(key).apply(person())
    same_key = PiiKey.from_text(KEY_TEXT, source="read again")
    second = PiiPolicy.parse(dict(reversed(policy.items()))).plan(same_key).apply(person())
    assert first == second


@pytest.mark.parametrize("mapping", [{"email": "hash"}, {"attributes": "hash"}, {"sources[].external_id": "hash"}])
def test_the_key_appears_nowhere_in_what_is_stored(key: PiiKey, mapping: dict[str, str]) -> None:
    stored = PiiPolicy.parse(mapping).plan(key).apply(person())
    assert KEY_TEXT not in repr(stored)


# --- fields beyond the text columns: lifecycle, identity_match, a provenance entry's other keys -----

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)
_ENTRY_FIELDS = ("source_type", "source_identity", "external_id", "record_type", "observed_at", "capabilities",
                 "version")


def _any_person(lifecycle: Any, identity_match: Any, attributes: dict[str, Any], extras: dict[str, Any]) -> dict:
    record = person(lifecycle=lifecycle, identity_match=identity_match, attributes=attributes)
    record["sources"] = [{**entry, **{f"x-{k}": v for k, v in extras.items()}} for entry in record["sources"]]
    return record


def _leaves(value: Any) -> list[Any]:
    """Every scalar under ``value`` (object keys are not values)."""
    if isinstance(value, dict):
        return [leaf for child in value.values() for leaf in _leaves(child)]
    if isinstance(value, list):
        return [leaf for child in value for leaf in _leaves(child)]
    return [value]


def _is_hash(value: Any) -> bool:
    return value is None or (isinstance(value, str) and len(value) == 64 and set(value) <= set("0123456789abcdef"))


@settings(max_examples=60, deadline=None)
@given(lifecycle=_JSON, identity_match=_JSON, attributes=st.dictionaries(st.text(max_size=5), _JSON, max_size=3),
       extras=st.dictionaries(st.text(max_size=5), _JSON, max_size=2))
def test_star_hash_leaves_no_raw_value_in_any_field(lifecycle: Any, identity_match: Any,
                                                     attributes: dict[str, Any], extras: dict[str, Any]) -> None:
    """Under ``{"*": "hash"}`` every value a record carries is a hash (or null), whatever its JSON
    type; only the key, the entries' named fields other than external_id, and object keys stay."""
    key = PiiKey.from_text(KEY_TEXT, source="a test")
    stored = PiiPolicy.parse({"*": "hash"}).plan(key).apply(
        _any_person(lifecycle, identity_match, attributes, extras))
    for field in ("display_name", "email", "phone", "lifecycle", "identity_match", "attributes"):
        assert all(_is_hash(leaf) for leaf in _leaves(stored[field])), field
    for entry in stored["sources"]:
        assert _is_hash(entry["external_id"])
        assert all(_is_hash(leaf) for name, value in entry.items() if name not in _ENTRY_FIELDS
                   for leaf in _leaves(value))
    blank = isinstance(lifecycle, str) and not unicodedata.normalize("NFC", lifecycle).strip()
    assert (stored["lifecycle"] is None) == (lifecycle is None or blank)  # a blank is stored as null


@settings(max_examples=30, deadline=None)
@given(lifecycle=_JSON, identity_match=_JSON, extras=st.dictionaries(st.text(max_size=5), _JSON, max_size=2))
def test_an_allow_list_stores_only_what_it_names(lifecycle: Any, identity_match: Any, extras: dict[str, Any]) -> None:
    """``{"*": "drop", ...}``: what no rule keeps is gone; what a rule keeps is stored as it came."""
    key = PiiKey.from_text(KEY_TEXT, source="a test")
    record = _any_person(lifecycle, identity_match, person()["attributes"], extras)
    policy = PiiPolicy.parse({"*": "drop", "sources[].external_id": "hash", "attributes.location": "keep"})
    stored = policy.plan(key).apply(record)
    assert (stored["display_name"], stored["email"], stored["phone"]) == (None, None, None)
    assert (stored["lifecycle"], stored["identity_match"]) == (None, None)
    assert stored["attributes"] == {"location": "Berlin"}
    assert [set(entry) - set(_ENTRY_FIELDS) for entry in stored["sources"]] == [set(), set()]
    assert [entry["external_id"] for entry in stored["sources"]] == [
        h("sources[].external_id", entry["external_id"], key) for entry in record["sources"]]


def test_a_hashed_lifecycle_keeps_its_shape_and_keys(key: PiiKey) -> None:
    stored = PiiPolicy.parse({"lifecycle": "hash", "identity_match": "hash"}).plan(key).apply(
        person(lifecycle="onboarding", identity_match={"method": "email", "confidence": 0.9}))
    # One domain for the whole tree of a JSON field: its own.
    assert stored["lifecycle"] == h("lifecycle", "onboarding", key)
    assert stored["identity_match"] == {"method": h("identity_match", "email", key),
                                        "confidence": h("identity_match", 0.9, key)}


def test_an_entry_keeps_its_named_fields_whatever_happens_to_its_other_keys(key: PiiKey) -> None:
    record = person()
    record["sources"][0]["label"] = "Zoë at Workday"
    record["sources"][0]["link"] = {"href": "https://workday.example/WD-00042"}
    hashed = PiiPolicy.parse({"sources[].*": "hash"}).plan(key).apply(record)["sources"][0]
    assert {k: v for k, v in hashed.items() if k in _ENTRY_FIELDS} == {
        k: v for k, v in record["sources"][0].items() if k in _ENTRY_FIELDS}
    assert hashed["label"] == h("sources[].*", "Zoë at Workday", key)
    assert hashed["link"] == {"href": h("sources[].*", "https://workday.example/WD-00042", key)}
    dropped = PiiPolicy.parse({"sources[].*": "drop"}).plan(key).apply(record)["sources"][0]
    assert set(dropped) == set(record["sources"][0]) - {"label", "link"}


def test_each_rule_counts_the_values_it_met(key: PiiKey) -> None:
    """What a run reports per rule: a rule meeting no value names a path the records do not have."""
    plan = PiiPolicy.parse({"email": "hash", "attributes.employment.cost_center": "drop",
                            "attributes.salery": "drop", "sources[].external_id": "hash"}).plan(key)
    for _ in range(3):
        plan.apply(person())
    plan.apply(person(email=None))
    assert plan.records == 4
    assert plan.matched == {"email": 3, "attributes.employment.cost_center": 4, "attributes.salery": 0,
                            "sources[].external_id": 8}

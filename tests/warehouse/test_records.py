"""Record -> row mapping: the canonical hash and the observation time."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import pytest
from whhelpers import make_record

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.models import FederatedRecord
from airflow_provider_bos.warehouse import canonical_json, hash_arguments, record_to_row


def test_hash_is_sha256_of_the_canonical_content_json():
    record = make_record(1, name="Zoë 😀", attributes={"b": 1, "a": {"z": [1, 2], "y": None}})
    # The content: every provenance entry without its observation stamp (tests/warehouse/test_content_changes.py).
    content = {**record, "sources": [{k: v for k, v in e.items() if k != "observed_at"} for e in record["sources"]]}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert record_to_row(record).record_hash == hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize(
    "value",
    [{"b": 1, "a": [1.0, 1e15, 1.5e-7, 2**70, "ü😀\u2028\n\"", "1e+16 -0.0", None, True, {}]}, [], "x", 7, 1.5,
     None, {"k": [{"b": 2, "a": 1}]}],
)
def test_canonical_json_is_sorted_compact_stdlib_json(value):
    assert canonical_json(value) == json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_canonical_json_spells_a_number_as_every_engine_hands_it_back():
    """docs/personal-data.md: 1e+16 as PostgreSQL's jsonb writes it back, -0.0 as 0.0; a string that
    only looks like one keeps its text."""
    value = {"b": [1e16, -0.0, -1.5e300, 2.5e-7], "a": "1e+16 -0.0"}
    assert canonical_json(value) == (
        '{"a":"1e+16 -0.0","b":[10000000000000000,0.0,-15' + "0" * 299 + ',2.5e-07]}')


def test_model_and_dict_give_the_same_row():
    record = make_record(1, lifecycle=None)
    assert record_to_row(FederatedRecord.model_validate(record)) == record_to_row(record)


def test_hash_ignores_key_order_but_not_content():
    record = make_record(1)
    reordered = dict(reversed(list(record.items())))
    assert record_to_row(reordered).record_hash == record_to_row(record).record_hash
    assert record_to_row(make_record(1, name="other")).record_hash != record_to_row(record).record_hash
    changed_attr = make_record(1, attributes={"dept": "eng", "level": 4})
    assert record_to_row(changed_attr).record_hash != record_to_row(record).record_hash


def test_fields_outside_the_stored_content_do_not_change_the_hash():
    record = make_record(1)
    with_extra = {**record, "_bos_synced_at": "2030-01-01T00:00:00Z", "unknown_field": 1}
    assert record_to_row(with_extra).record_hash == record_to_row(record).record_hash


def test_observed_at_is_the_latest_source_in_utc():
    record = make_record(1, "2026-10-08T12:00:00Z")
    record["sources"].append({**record["sources"][0], "observed_at": "2026-10-08T15:30:00.250+02:00"})
    record["sources"].append({**record["sources"][0], "observed_at": "2026-10-08T13:00:00"})  # naive = UTC
    assert record_to_row(record).observed_at == datetime(2026, 10, 8, 13, 30, 0, 250000, tzinfo=UTC)


def test_observed_at_falls_back_to_the_read_and_fails_without_one():
    record = make_record(1)
    record["sources"][0].pop("observed_at")
    fallback = datetime(2026, 1, 1, tzinfo=UTC)
    assert record_to_row(record, default_observed_at=fallback).observed_at == fallback
    with pytest.raises(BosWarehouseError, match="observed_at"):
        record_to_row(record)


def test_json_null_maps_to_none_and_objects_to_canonical_text():
    row = record_to_row(make_record(1, lifecycle=None, attributes={"b": 2, "a": "ü"}))
    assert row.lifecycle is None and row.identity_match is None
    assert row.attributes == '{"a":"ü","b":2}'


def test_arguments_hash_is_order_independent():
    assert hash_arguments({"a": 1, "b": [1, 2]}) == hash_arguments({"b": [1, 2], "a": 1})
    assert hash_arguments({}) == hash_arguments(None)
    assert hash_arguments({"a": 1}) != hash_arguments({"a": 2})


def test_non_json_values_are_a_typed_error():
    with pytest.raises(BosWarehouseError, match="not JSON"):
        record_to_row(make_record(1, attributes={"x": float("nan")}))
    with pytest.raises(BosWarehouseError, match="display_name"):
        record_to_row(make_record(1, name=123))

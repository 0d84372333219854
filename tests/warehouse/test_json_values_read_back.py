"""Every JSON value the contract allows, in every JSON column, reads back as it was stored.

``lifecycle`` and ``identity_match`` have no type in the contract (any JSON value may come);
``attributes`` is an object and ``sources`` a list of objects, whose values again may be anything.
Stored, such a value must come back as the same JSON value on every database, whatever its driver
hands back (text, or a value it decoded itself), in every place that reads stored rows: the next
run (the content-hash upgrade reads the first row), pii-apply, erasure and history.

The tables are read here with SQL that turns each JSON column into JSON text and decoded once, not
with the writer's own reading code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_bos.pii import PiiKey
from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.upkeep.erase import erase_records
from airflow_provider_bos.warehouse.upkeep.pii_apply import apply_stricter_policy
from airflow_provider_bos.wire import ReconcileOptions
from tests.warehouse.whhelpers import T1, T2, make_record, write

# One value of each JSON type (and the shapes the contract allows inside objects).
JSON_VALUES: dict[str, Any] = {
    "string": "onboarding",
    "empty_string": "",
    "integer": 7,
    "big_integer": 2**70,
    "float": -0.25,
    "boolean": True,
    "array": ["a", 1, None, {"b": []}],
    "object": {"state": "active", "": {"deep": [{"x": 1}]}, "key with space é": {}},
    "null": None,
}
# The column the value goes in, and how it is placed there (attributes and sources are containers).
PLACES: dict[str, Callable[[Any], dict[str, Any]]] = {
    "lifecycle": lambda value: {"lifecycle": value},
    "identity_match": lambda value: {"identity_match": value},
    "attributes": lambda value: {"attributes": {"v": value}},
    # A provenance entry's key beyond the named ones (the contract allows extra keys).
    "sources": lambda value: {"sources": [{**make_record(0)["sources"][0], "label": value}]},
}

_AS_TEXT = {
    "sqlite": "{}",
    "postgresql": "CAST({} AS TEXT)",
    "mysql": "{}",
    "duckdb": "CAST({} AS VARCHAR)",
    "snowflake": "TO_JSON({})",
}


def stored_json(engine: sa.Engine, table: str, column: str) -> dict[str, Any]:
    """``column`` of every row of ``table`` by record_ref, read as JSON text in SQL and decoded once."""
    as_text = _AS_TEXT[engine.dialect.name].format(column)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(f"SELECT record_ref, {as_text} FROM {table}").all()
    return {ref: None if text is None else json.loads(text) for ref, text in rows}


def _first_record(place: str, value: Any, observed_at: str = T1) -> dict[str, Any]:
    # The lowest record_ref: the row the next run's content-hash check reads first.
    return make_record("bos:person:000000", observed_at, **PLACES[place](value))


def _records(place: str, value: Any, observed_at: str = T1) -> list[dict[str, Any]]:
    return [_first_record(place, value, observed_at), make_record(1, observed_at), make_record(2, observed_at)]


@pytest.mark.parametrize("kind", JSON_VALUES)
@pytest.mark.parametrize("place", PLACES)
def test_a_second_run_reads_the_first_row_back(make_writer: Callable[..., WarehouseWriter], engine: sa.Engine,
                                               place: str, kind: str) -> None:
    """Day 2 over a table whose first row holds the value runs, sees nothing changed, and the value
    reads back as it was sent."""
    writer = make_writer()
    value = JSON_VALUES[kind]
    options = {"reconcile": ReconcileOptions(sync_mode="full", history=True)}
    write(writer, _records(place, value), **options)
    second = write(writer, _records(place, value, T2), **options)
    assert (second.inserted, second.updated, second.unchanged) == (0, 0, 3)
    expected = PLACES[place](value)[place]
    assert stored_json(engine, writer.table, place)["bos:person:000000"] == expected


@pytest.mark.parametrize("kind", JSON_VALUES)
def test_a_change_of_json_type_is_a_change(make_writer: Callable[..., WarehouseWriter], engine: sa.Engine,
                                           kind: str) -> None:
    """A lifecycle that changes from an object to ``kind`` (and back) is a change each time, with a
    history version holding each value as sent."""
    writer = make_writer()
    options = {"reconcile": ReconcileOptions(sync_mode="full", history=True)}
    before = {"state": "other"}
    write(writer, _records("lifecycle", before), **options)
    second = write(writer, _records("lifecycle", JSON_VALUES[kind], T2), **options)
    assert second.updated == 1
    assert stored_json(engine, writer.table, "lifecycle")["bos:person:000000"] == JSON_VALUES[kind]
    history = f"{writer.table}_history"
    with engine.connect() as conn:
        as_text = _AS_TEXT[engine.dialect.name].format("lifecycle")
        versions = conn.exec_driver_sql(
            f"SELECT {as_text} FROM {history} WHERE record_ref = 'bos:person:000000'").all()
    def canonical(value: Any) -> str:
        return json.dumps(value, sort_keys=True)

    assert sorted(canonical(json.loads(t) if t is not None else None) for (t,) in versions) == sorted(
        canonical(v) for v in (before, JSON_VALUES[kind]))


@pytest.mark.parametrize("kind", JSON_VALUES)
@pytest.mark.parametrize("place", PLACES)
def test_pii_apply_reads_every_json_value_back(make_writer: Callable[..., WarehouseWriter], engine: sa.Engine,
                                               place: str, kind: str) -> None:
    """pii-apply over a table holding the value rewrites only what its policy names; the value is left
    as it was sent."""
    writer = make_writer()
    value = JSON_VALUES[kind]
    write(writer, _records(place, value))
    key = PiiKey(b"1W5LoUrllyfXS-FTIH84YF0tiv-8cCvP6uKctSMa9R4", source="test")
    applied = apply_stricter_policy(engine, table=writer.table, audit_table=writer.audit_table,
                                    policy={"email": "hash"}, key=key)
    assert applied.records == 3
    assert stored_json(engine, writer.table, place)["bos:person:000000"] == PLACES[place](value)[place]


@pytest.mark.parametrize("kind", JSON_VALUES)
def test_erasure_by_external_id_reads_every_json_value_back(make_writer: Callable[..., WarehouseWriter],
                                                            engine: sa.Engine, kind: str) -> None:
    """Erasure finds a person by an external id among rows whose JSON columns hold any value."""
    writer = make_writer()
    write(writer, _records("lifecycle", JSON_VALUES[kind]))
    engine.dispose()  # DuckDB: erasure rewrites the file, with no other connection open
    erased = erase_records(engine, table=writer.table, audit_table=writer.audit_table, external_ids=["crm-eu:1"])
    assert erased.records == 1
    assert set(stored_json(engine, writer.table, "lifecycle")) == {"bos:person:000000", "bos:person:000002"}


def test_unnamed_keys_of_an_entry_are_kept_and_content_those_of_a_record_are_not(
        make_writer: Callable[..., WarehouseWriter], engine: sa.Engine) -> None:
    """Without a policy, an entry's keys beyond the contract's seven are stored in ``sources`` and a
    change in one is a change; a record's keys beyond its eight have no column, and are no content."""
    writer = make_writer()

    def records(label: Any, extra: Any, observed_at: str) -> list[dict[str, Any]]:
        record = make_record(1, observed_at, sources=[{**make_record(1)["sources"][0], "label": label}])
        return [{**record, "x-unnamed": extra}]

    write(writer, records("crm person", 1, T1))
    assert stored_json(engine, writer.table, "sources")["bos:person:000001"][0]["label"] == "crm person"
    unnamed_changed = write(writer, records("crm person", 2, T2))
    assert (unnamed_changed.updated, unnamed_changed.unchanged) == (0, 1)
    label_changed = write(writer, records({"text": "crm person"}, 2, T2))
    assert label_changed.updated == 1
    assert stored_json(engine, writer.table, "sources")["bos:person:000001"][0]["label"] == {"text": "crm person"}


@pytest.mark.parametrize("kind", ["string", "big_integer", "object", "null"])
def test_pii_apply_of_star_hash_leaves_no_raw_value_in_a_json_column(make_writer: Callable[..., WarehouseWriter],
                                                                    engine: sa.Engine, kind: str) -> None:
    """pii-apply of ``{"*": "hash"}`` rewrites lifecycle, identity_match and the entries' other keys too."""
    from airflow_provider_bos.pii import PiiPolicy

    writer = make_writer()
    value = JSON_VALUES[kind]
    records = _records("lifecycle", value)
    records[0]["identity_match"] = value
    records[0]["sources"][0]["label"] = value
    write(writer, records)
    key = PiiKey(b"1W5LoUrllyfXS-FTIH84YF0tiv-8cCvP6uKctSMa9R4", source="test")
    apply_stricter_policy(engine, table=writer.table, audit_table=writer.audit_table, policy={"*": "hash"}, key=key)
    expected = PiiPolicy.parse({"*": "hash"}).plan(key).apply(records[0])
    for column in ("lifecycle", "identity_match", "sources"):
        assert stored_json(engine, writer.table, column)["bos:person:000000"] == expected[column]
    if value is not None:
        assert expected["lifecycle"] != value and expected["sources"][0]["label"] != value

"""Promoted attributes: chosen ``attributes`` paths as typed columns of the records table, on every dialect."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosConfigurationError, BosWarehouseError
from airflow_provider_bos.warehouse.tables.attribute_columns import check_attribute_columns
from airflow_provider_bos.warehouse.tables.schema import companion_table_name, rejects_table_name
from airflow_provider_bos.wire import ReconcileOptions
from tests.warehouse.whhelpers import T1, T2, make_record, reflect, rows_by_ref, run_info, write

PROMOTED = check_attribute_columns({
    "department": "attributes.department",
    "fte": {"path": "attributes.employment.fte", "type": "number"},
    "grade": {"path": "attributes.employment.grade", "type": "integer"},
    "manager": {"path": "attributes.is_manager", "type": "boolean"},
    "hired_at": {"path": "attributes.employment.hired_at", "type": "timestamp"},
    "tags": {"path": "attributes.tags", "type": "json"},
})
NAMES = PROMOTED.names
LENIENT = check_attribute_columns({c.name: {"path": c.path, "type": c.type} for c in PROMOTED.columns},
                                  type_errors="null")


def person(i: int, observed_at: str = T1, **attributes: Any) -> dict[str, Any]:
    return make_record(i, observed_at, attributes=attributes)


FULL = {"department": "Sales", "employment": {"fte": 0.8, "grade": 7, "hired_at": "2024-03-01T09:30:00+02:00"},
        "is_manager": True, "tags": ["a", {"b": 1}]}


def promoted(engine: sa.Engine, table: str) -> dict[str, dict[str, Any]]:
    return {ref: {c: _plain(row[c]) for c in NAMES} for ref, row in rows_by_ref(engine, table).items()}


def _plain(value: Any) -> Any:
    """A stored value as Python: timestamps as aware UTC, JSON decoded, booleans from 0/1."""
    if isinstance(value, Decimal):  # MariaDB's DOUBLE as reflected
        return float(value)
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, str) and value[:1] in "[{":
        import json

        return json.loads(value)
    return value


EXPECTED_FULL = {"department": "Sales", "fte": 0.8, "grade": 7, "manager": True,
                 "hired_at": datetime(2024, 3, 1, 7, 30, tzinfo=UTC), "tags": ["a", {"b": 1}]}
EMPTY = dict.fromkeys(NAMES)


def _typed(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "manager": None if row["manager"] is None else bool(row["manager"])}


def test_new_rows_carry_their_promoted_values_typed(make_writer, engine) -> None:
    writer = make_writer()
    nulls = {"department": None, "employment": {"fte": None}, "is_manager": None, "tags": None}
    write(writer, [person(1, **FULL), person(2, other="x"), person(3, **nulls)], attribute_columns=PROMOTED)
    rows = promoted(engine, writer.table)
    ref = make_record(1)["record_ref"]
    assert _typed(rows[ref]) == EXPECTED_FULL
    # A missing path and JSON null are NULL, not errors.
    assert rows[make_record(2)["record_ref"]] == EMPTY
    assert rows[make_record(3)["record_ref"]] == EMPTY
    # A changed record's columns follow it; an unchanged re-run leaves them as they are.
    changed = {**FULL, "department": "Ops", "employment": {"fte": 1, "grade": -3, "hired_at": "2025-01-02 03:04:05"}}
    counts = write(writer, [person(1, T2, **changed), person(2, other="x")], attribute_columns=PROMOTED)
    assert (counts.updated, counts.unchanged) == (1, 1)
    again = _typed(promoted(engine, writer.table)[ref])
    assert again == {**EXPECTED_FULL, "department": "Ops", "fte": 1.0, "grade": -3,
                     "hired_at": datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)}
    write(writer, [person(1, T2, **changed)], attribute_columns=PROMOTED)
    assert _typed(promoted(engine, writer.table)[ref]) == again


def test_an_existing_table_gets_the_columns_filled_from_the_stored_attributes(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, [person(1, **FULL), person(2, department=5)], reconcile=ReconcileOptions(history=True))
    before = {ref: (r["_bos_record_hash"], r["_bos_synced_at"]) for ref, r in rows_by_ref(engine, writer.table).items()}
    run = run_info()
    counts = write(make_writer(), [], run, attribute_columns=LENIENT, reconcile=ReconcileOptions(history=True))
    assert (counts.written, counts.attribute_type_errors) == (0, 0)  # stored values: the audit note counts them
    rows = promoted(engine, writer.table)
    assert _typed(rows[make_record(1)["record_ref"]]) == EXPECTED_FULL
    assert rows[make_record(2)["record_ref"]]["department"] is None  # a number is not text: NULL, counted
    after = rows_by_ref(engine, writer.table)
    assert {ref: (r["_bos_record_hash"], r["_bos_synced_at"]) for ref, r in after.items()} == before
    history = reflect(engine, companion_table_name(writer.table, "history"))
    with engine.connect() as conn:
        versions = {r.record_ref: r.department for r in conn.execute(sa.select(history))}
        note = conn.exec_driver_sql(f"SELECT notes FROM {writer.audit_table} WHERE run_id = "
                                    f"'{run.run_id}'").scalar()
    assert versions == {make_record(1)["record_ref"]: "Sales", make_record(2)["record_ref"]: None}
    assert "Filled the promoted column(s)" in note and "department: 1" in note
    # A later change opens a history version that carries the columns.
    write(writer, [person(1, T2, **{**FULL, "department": "Ops"})], attribute_columns=PROMOTED,
          reconcile=ReconcileOptions(history=True))
    with engine.connect() as conn:
        rows_now = conn.execute(sa.select(history.c.department).where(history.c._bos_valid_to.is_(None))
                                .where(history.c.record_ref == make_record(1)["record_ref"])).scalars().all()
    assert rows_now == ["Ops"]


def test_a_stored_value_of_the_wrong_type_follows_invalid_records_when_the_column_is_first_filled(
        make_writer, engine) -> None:
    """The first fill reads stored rows, not records: with ``invalid_records="fail"`` the run fails (the
    column stays unfilled, nothing written); with ``"quarantine"`` the stored row stays, its column NULL,
    counted, and the run is partial; ``attribute_type_errors="null"`` is the test above (complete)."""
    writer = make_writer()
    write(writer, [person(1, **FULL), person(2, department=98765), person(3, department=6)])
    before = rows_by_ref(engine, writer.table)
    failed = run_info()
    with pytest.raises(BosWarehouseError, match=r"2 at attributes.department are not of type text") as caught:
        write(make_writer(), [person(4, **FULL)], failed, attribute_columns=PROMOTED)
    assert "attribute_type_errors='null'" in str(caught.value) and "nothing was written" in str(caught.value)
    assert "98765" not in str(caught.value)  # no value quoted
    assert {ref: {k: v for k, v in row.items() if k not in NAMES} for ref, row in
            rows_by_ref(engine, writer.table).items()} == before
    with engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT COUNT(*) FROM {companion_table_name(writer.table, 'columns')}")
                            ).scalar() == 0
    run = run_info()
    counts = write(make_writer(), [person(4, **FULL)], run, attribute_columns=PROMOTED,
                   invalid_records="quarantine")
    assert (counts.inserted, counts.rejected, counts.attribute_type_errors) == (1, 0, 0)
    rows = promoted(engine, writer.table)
    assert rows[make_record(2)["record_ref"]]["department"] is None
    assert rows[make_record(1)["record_ref"]]["department"] == rows[make_record(4)["record_ref"]]["department"]
    with engine.connect() as conn:
        status, note = conn.exec_driver_sql(f"SELECT status, error_message FROM {writer.audit_table} "
                                            f"WHERE run_id = '{run.run_id}'").one()
    assert status == "partial" and "department: 2" in note


def test_a_first_fill_counts_current_rows_and_a_complete_read_still_retires(make_writer, engine) -> None:
    """A retired row's value of the wrong type is NULL without failing the run (BOS no longer sends
    it to be fixed); a current one under quarantine makes the run partial after the complete read
    has retired what it no longer returned."""
    full = ReconcileOptions(sync_mode="full", max_retire_fraction=None)
    writer = make_writer()
    write(writer, [person(1, **FULL), person(2, department=98765), person(3, department=6)], reconcile=full)
    write(writer, [person(1, **FULL), person(2, department=98765)], reconcile=full)  # 3 retired
    department = check_attribute_columns({"department": "attributes.department"})
    counts = write(make_writer(), [person(1, **FULL)], attribute_columns=department,
                   invalid_records="quarantine", reconcile=full)
    assert (counts.retired, counts.rejected) == (1, 0)  # 2, not returned by this complete read
    rows = rows_by_ref(engine, writer.table)
    assert rows[make_record(2)["record_ref"]]["_bos_deleted_at"] is not None
    assert rows[make_record(2)["record_ref"]]["department"] is None
    with engine.connect() as conn:
        status, note = conn.exec_driver_sql(f"SELECT status, error_message FROM {writer.audit_table} "
                                            "ORDER BY started_at DESC").first()
    assert status == "partial" and "department: 1" in note  # 2 was current when filled; 3 was not


def test_a_wrong_type_fails_the_run_and_writes_nothing(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, [person(1, **FULL)], attribute_columns=PROMOTED)
    before = rows_by_ref(engine, writer.table)
    bad = {**FULL, "employment": {"fte": "full"}}
    with pytest.raises(BosWarehouseError, match=r"attributes.employment.fte is not of type number") as caught:
        write(writer, [person(2, **FULL), person(3, T2, **bad)], attribute_columns=PROMOTED)
    assert "full" not in str(caught.value)  # the message names the path, never the value
    assert rows_by_ref(engine, writer.table) == before


def test_a_wrong_type_is_quarantined(make_writer, engine) -> None:
    writer = make_writer()
    bad = {**FULL, "employment": {"grade": 2.5}}
    counts = write(writer, [person(1, **FULL), person(2, **bad)], attribute_columns=PROMOTED,
                   invalid_records="quarantine")
    assert (counts.inserted, counts.rejected) == (1, 1)
    rejects = reflect(engine, rejects_table_name(writer.table))
    with engine.connect() as conn:
        reasons = conn.execute(sa.select(rejects.c.record_ref, rejects.c.reason)).all()
    assert [r.record_ref for r in reasons] == [make_record(2)["record_ref"]]
    assert "attributes.employment.grade is not of type integer" in reasons[0].reason


def test_a_wrong_type_may_be_stored_as_null_and_counted(make_writer, engine) -> None:
    writer = make_writer()
    columns = check_attribute_columns({"department": "attributes.department",
                                       "since": {"path": "attributes.since", "type": "timestamp"}},
                                      type_errors="null")
    run = run_info()
    counts = write(writer, [person(1, department=True, since="2024-02-30T00:00:00Z"), person(2, department="x")],
                   run, attribute_columns=columns)
    assert (counts.inserted, counts.attribute_type_errors) == (2, 2)
    rows = rows_by_ref(engine, writer.table)
    assert rows[make_record(1)["record_ref"]]["department"] is None
    assert rows[make_record(1)["record_ref"]]["since"] is None
    assert rows[make_record(2)["record_ref"]]["department"] == "x"
    with engine.connect() as conn:
        note = conn.exec_driver_sql(f"SELECT notes, status FROM {writer.audit_table} WHERE run_id = "
                                    f"'{run.run_id}'").one()
    assert "2 promoted attribute value(s) of the wrong type were stored as NULL" in note[0]
    assert note[1] == "complete"


def test_removing_a_mapping_leaves_the_column_and_mapping_it_again_fills_it(make_writer, engine) -> None:
    writer = make_writer()
    dept = check_attribute_columns({"department": "attributes.department"})
    write(writer, [person(1, department="Sales")], attribute_columns=dept)
    write(writer, [person(2, department="Ops")])  # no mapping: the column stays, new rows get NULL
    rows = rows_by_ref(engine, writer.table)
    assert (rows[make_record(1)["record_ref"]]["department"], rows[make_record(2)["record_ref"]]["department"]) == (
        "Sales", None)
    write(writer, [], attribute_columns=dept)  # configured again: filled again
    assert rows_by_ref(engine, writer.table)[make_record(2)["record_ref"]]["department"] == "Ops"
    # Its type is the column's: another type is refused, naming the way out.
    with pytest.raises(BosConfigurationError, match="cannot become integer"):
        write(writer, [], attribute_columns=check_attribute_columns(
            {"department": {"path": "attributes.department", "type": "integer"}}))


def test_a_policy_applied_since_the_fill_fills_the_columns_again(make_writer, engine) -> None:
    from airflow_provider_bos.pii import PiiPolicy
    from airflow_provider_bos.warehouse.upkeep.pii_apply import apply_stricter_policy
    from tests.warehouse.pii_helpers import KEY, every_text, write_under
    from tests.warehouse.pii_helpers import person as pii_person

    writer = make_writer()
    home = check_attribute_columns({"home": "attributes.private.home"})
    write_under(writer, None, [pii_person(1)], attribute_columns=home)
    ref = make_record(1)["record_ref"]
    assert rows_by_ref(engine, writer.table)[ref]["home"] == "Street 1"
    # pii-apply rewrites the stored attributes and, in the same transaction, the columns filled from them.
    policy = PiiPolicy.parse({"attributes.private.home": "hash"})
    applied = apply_stricter_policy(engine, table=writer.table, audit_table=writer.audit_table, policy=policy,
                                    key=KEY)
    assert applied.promoted_columns == 1
    plan = policy.plan(KEY)
    hashed = plan.apply(pii_person(1))["attributes"]["private"]["home"]
    assert rows_by_ref(engine, writer.table)[ref]["home"] == hashed
    assert "Street 1" not in every_text(engine, writer.table)
    write_under(writer, plan, [], attribute_columns=home)  # the next run under that policy: nothing to fill
    assert rows_by_ref(engine, writer.table)[ref]["home"] == hashed


def test_a_policy_that_drops_a_promoted_path_empties_its_column_at_once(make_writer, engine) -> None:
    from airflow_provider_bos.pii import PiiPolicy
    from airflow_provider_bos.warehouse.upkeep.pii_apply import apply_stricter_policy
    from tests.warehouse.pii_helpers import KEY, every_text, write_under
    from tests.warehouse.pii_helpers import person as pii_person

    writer = make_writer()
    home = check_attribute_columns({"home": "attributes.private.home"})
    write_under(writer, None, [pii_person(1), pii_person(2)], attribute_columns=home)
    apply_stricter_policy(engine, table=writer.table, audit_table=writer.audit_table,
                          policy=PiiPolicy.parse({"attributes.private.*": "drop"}), key=KEY)
    assert {row["home"] for row in rows_by_ref(engine, writer.table).values()} == {None}
    assert "Street 1" not in every_text(engine, writer.table)


EDGE_VALUES = ["x", "", 0, -7, 999999999999999999, 10**18, 1.0, 2.5, -0.0, 1e-7, 1e20, True, False, "1", "true",
               [], {"a": None}, "2024-03-01T09:30:00Z", "2024-03-01 09:30:00.123456+02:00", "2024-03-01T09:30:00",
               "2024-02-29T23:59:59-05:30", "2024-02-30T00:00:00Z", "2023-02-29T00:00:00Z", "2024-03-01",
               "2024-03-01T09:30Z", "2024-03-01T09:30:00x123", "2024-13-01T00:00:00Z", "yesterday"]
EVERY_TYPE = check_attribute_columns({f"v_{kind}": {"path": "attributes.v", "type": kind}
                                      for kind in ("text", "integer", "number", "boolean", "timestamp", "json")},
                                     type_errors="null")


@pytest.mark.parametrize("backfill", [False, True], ids=["written", "backfilled"])
def test_the_sql_and_the_python_check_agree_on_every_type(make_writer, engine, backfill: bool) -> None:
    """What a run's check calls the wrong type is exactly what the SQL leaves NULL, whether the column
    is filled as rows are written or from the stored rows afterwards."""
    records = [make_record(i, attributes={"v": value}) for i, value in enumerate(EDGE_VALUES)]
    writer = make_writer()
    if backfill:
        write(writer, records)
        write(writer, [], attribute_columns=EVERY_TYPE)
    else:
        write(writer, records, attribute_columns=EVERY_TYPE)
    rows = rows_by_ref(engine, writer.table)
    for i, value in enumerate(EDGE_VALUES):
        row = rows[make_record(i)["record_ref"]]
        stored_null = {c.name for c in EVERY_TYPE.columns if row[c.name] is None}
        wrong = {c.name for c in EVERY_TYPE.columns if c.wrong_type(value)}
        assert stored_null == wrong, value

"""Promoted attributes on Snowflake (fakesnow): typed columns filled from the VARIANT attributes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from fakesnow_support import fakesnow_server, snowflake_url  # noqa: F401 - fixtures
from test_promoted_attributes import EXPECTED_FULL, FULL, NAMES, PROMOTED, person
from whhelpers import T2, make_record, run_info, write

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.tables.schema import companion_table_name, rejects_table_name
from airflow_provider_bos.wire import ReconcileOptions, WriteOptions

pytestmark = pytest.mark.snowflake


@pytest.fixture()
def make_sf_writer(sf_engine: sa.Engine, unique_table: str) -> Iterator[Any]:
    yield lambda: WarehouseWriter(sf_engine, table=unique_table, audit_table=f"{unique_table}_runs")
    with sf_engine.begin() as conn:
        for name in (unique_table, f"{unique_table}_runs", rejects_table_name(unique_table),
                     *(companion_table_name(unique_table, s) for s in ("history", "lineage", "sources", "columns"))):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")


def promoted(engine: sa.Engine, table: str) -> dict[str, dict[str, Any]]:
    import json

    # fakesnow sends a NULL TIMESTAMP_TZ as 1970-01-01 (its IS NULL is right): read in SQL.
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(f"SELECT record_ref, {', '.join(NAMES)}, hired_at IS NULL FROM {table}").all()
    out = {}
    for row in rows:
        values = dict(zip(NAMES, row[1:-1], strict=True))
        if row[-1]:
            values["hired_at"] = None
        if isinstance(values["tags"], str):
            values["tags"] = json.loads(values["tags"])
        if isinstance(values["hired_at"], datetime):
            values["hired_at"] = values["hired_at"].astimezone(UTC)
        out[row[0]] = values
    return out


def test_promoted_columns_are_typed_new_rows_and_a_backfill(make_sf_writer, sf_engine: sa.Engine,
                                                           unique_table: str) -> None:
    writer = make_sf_writer()
    write(writer, [person(1, **FULL), person(2, other="x")], reconcile=ReconcileOptions(history=True))
    # An existing table: the columns are added and filled from the stored attributes.
    write(make_sf_writer(), [person(3, T2, **{**FULL, "department": "Ops"})], attribute_columns=PROMOTED,
          reconcile=ReconcileOptions(history=True))
    rows = promoted(sf_engine, unique_table)
    assert rows[make_record(1)["record_ref"]] == EXPECTED_FULL
    assert rows[make_record(2)["record_ref"]] == dict.fromkeys(NAMES)
    assert rows[make_record(3)["record_ref"]] == {**EXPECTED_FULL, "department": "Ops"}
    with sf_engine.connect() as conn:
        history = conn.exec_driver_sql(
            f"SELECT record_ref, department FROM {companion_table_name(unique_table, 'history')}").all()
    assert sorted(history) == sorted([(make_record(1)["record_ref"], "Sales"), (make_record(2)["record_ref"], None),
                                      (make_record(3)["record_ref"], "Ops")])


def test_a_wrong_type_fails_the_run(make_sf_writer, sf_engine: sa.Engine, unique_table: str) -> None:
    writer = make_sf_writer()
    with pytest.raises(BosWarehouseError, match=r"attributes\.is_manager is not of type boolean"):
        write(writer, [person(1, **{**FULL, "is_manager": "yes"})], run_info(), attribute_columns=PROMOTED)
    with sf_engine.connect() as conn:
        assert conn.exec_driver_sql(f"SELECT COUNT(*) FROM {unique_table}").scalar() == 0


def test_the_documented_alters_add_what_the_writer_adds(sf_engine: sa.Engine) -> None:
    from test_promoted_ddl import examples
    from test_snowflake_ddl import _shape, _statements

    from airflow_provider_bos.warehouse.tables.attribute_columns import check_attribute_columns

    found = examples("snowflake")
    columns = check_attribute_columns({column: {"path": f"attributes.{column}", "type": kind}
                                       for kind, _, _, column in found})
    tables = ("BOS_RECORDS", "BOS_RECORDS_HISTORY", "BOS_RECORDS_COLUMNS")
    suffix = uuid.uuid4().hex[:10]
    code_ns, file_ns = f"bos_pddl_code_{suffix}", f"bos_pddl_file_{suffix}"
    try:
        with sf_engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {code_ns}")
            conn.exec_driver_sql(f"CREATE SCHEMA {file_ns}")
        writer = WarehouseWriter(sf_engine, schema=code_ns)
        writer.ensure_history_table()
        # The DDL step of a run (fakesnow makes no temporary table in another schema, so no whole run).
        writer._ensure_promoted_columns(WriteOptions(audit={}, attribute_columns=columns))
        with sf_engine.begin() as conn:
            conn.exec_driver_sql(f"USE SCHEMA {file_ns}")
            for statement in (*_statements(), *(statement for _, statement, _, _ in found)):
                conn.exec_driver_sql(statement)
        sf_engine.dispose()  # the USE SCHEMA connection must not be reused
        code, from_file = _shape(sf_engine, code_ns, tables), _shape(sf_engine, file_ns, tables)
        assert code == from_file
        assert {name.lower() for name, *_ in code["BOS_RECORDS"]} >= set(columns.names)
    finally:
        with sf_engine.begin() as conn:
            for ns in (code_ns, file_ns):
                conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {ns} CASCADE")


def test_the_sql_and_the_python_check_agree_on_every_type(make_sf_writer, sf_engine: sa.Engine,
                                                          unique_table: str) -> None:
    from test_promoted_attributes import EDGE_VALUES, EVERY_TYPE

    records = [make_record(i, attributes={"v": value}) for i, value in enumerate(EDGE_VALUES)]
    write(make_sf_writer(), records, attribute_columns=EVERY_TYPE)
    nulls = ", ".join(f"{c.name} IS NULL" for c in EVERY_TYPE.columns)  # NULL-ness in SQL (see promoted())
    with sf_engine.connect() as conn:
        rows = {r[0]: r[1:] for r in conn.exec_driver_sql(f"SELECT record_ref, {nulls} FROM {unique_table}")}
    for i, value in enumerate(EDGE_VALUES):
        stored_null = {c.name for c, null in zip(EVERY_TYPE.columns, rows[make_record(i)["record_ref"]], strict=True)
                       if null}
        assert stored_null == {c.name for c in EVERY_TYPE.columns if c.wrong_type(value)}, value

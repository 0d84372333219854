"""Promoted attributes on Snowflake (fakesnow): typed columns filled from the VARIANT attributes."""

from __future__ import annotations

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
from airflow_provider_bos.warehouse.schema import companion_table_name, rejects_table_name
from airflow_provider_bos.wire import ReconcileOptions

pytestmark = pytest.mark.snowflake


@pytest.fixture()
def sf_engine(snowflake_url: str) -> Iterator[sa.Engine]:  # noqa: F811
    eng = sa.create_engine(snowflake_url, pool_size=1, max_overflow=0)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture()
def make_sf_writer(sf_engine: sa.Engine, unique_table: str) -> Iterator[Any]:
    yield lambda: WarehouseWriter(sf_engine, table=unique_table, audit_table=f"{unique_table}_runs")
    with sf_engine.begin() as conn:
        for name in (unique_table, f"{unique_table}_runs", rejects_table_name(unique_table),
                     *(companion_table_name(unique_table, s) for s in ("history", "lineage", "columns"))):
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

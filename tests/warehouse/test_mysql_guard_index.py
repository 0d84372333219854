"""MySQL/MariaDB: the covering index the change test is forced onto (InnoDB rows live in the primary key)."""

from __future__ import annotations

import re

import pytest
from whhelpers import T2, make_record, statements, write

from airflow_provider_bos.warehouse import UpsertCounts
from airflow_provider_bos.warehouse.tables.schema import guard_index_name

pytestmark = pytest.mark.parametrize(
    "warehouse_url", [pytest.param("mysql", marks=pytest.mark.mysql)], indirect=True
)


def _classify_sql(seen: list[str]) -> list[str]:
    return [sql for sql in seen if sql.startswith("SELECT COALESCE(SUM(CASE")]


def test_tables_we_create_have_the_index_and_the_change_test_forces_it(engine, writer, unique_table):
    records = [make_record(i) for i in range(50)]
    assert write(writer, records) == UpsertCounts(inserted=50)
    assert writer.guard_index == guard_index_name(unique_table)
    changed = records[:45] + [make_record(i, T2, name="moved on") for i in range(45, 50)]
    with statements(engine) as seen:
        assert write(writer, changed) == UpsertCounts(updated=5, unchanged=45)
    (classify,) = _classify_sql(seen)
    assert re.search(rf"FORCE INDEX \(`?{guard_index_name(unique_table)}`?\)", classify)


def test_a_table_made_before_the_index_still_syncs_without_the_hint(engine, make_writer, unique_table):
    make_writer().ensure_tables()
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP INDEX {guard_index_name(unique_table)} ON {unique_table}")
    writer = make_writer()
    records = [make_record(i) for i in range(20)]
    with statements(engine) as seen:
        assert write(writer, records) == UpsertCounts(inserted=20)
        assert write(writer, records) == UpsertCounts(unchanged=20)
    assert writer.guard_index is None
    assert all("FORCE INDEX" not in sql for sql in _classify_sql(seen))

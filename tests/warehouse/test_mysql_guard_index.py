"""MySQL/MariaDB: the covering index the change test is forced onto (InnoDB rows live in the primary key)."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from whhelpers import T2, make_record, statements, write

from airflow_provider_bos.warehouse import UpsertCounts, WarehouseWriter
from airflow_provider_bos.warehouse.schema import guard_index_name

pytestmark = pytest.mark.mysql


@pytest.fixture()
def my_engine(mysql_url):
    engine = sa.create_engine(mysql_url)
    yield engine
    engine.dispose()


@pytest.fixture()
def my_tables(my_engine, unique_table):
    yield unique_table
    with my_engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {unique_table}, {unique_table}_runs")


def _classify_sql(seen: list[str]) -> list[str]:
    return [sql for sql in seen if sql.startswith("SELECT COALESCE(SUM(CASE")]


def test_tables_we_create_have_the_index_and_the_change_test_forces_it(my_engine, my_tables):
    writer = WarehouseWriter(my_engine, table=my_tables, audit_table=f"{my_tables}_runs")
    records = [make_record(i) for i in range(50)]
    assert write(writer, records) == UpsertCounts(inserted=50)
    assert writer.guard_index == guard_index_name(my_tables)
    changed = records[:45] + [make_record(i, T2, name="moved on") for i in range(45, 50)]
    with statements(my_engine) as seen:
        assert write(writer, changed) == UpsertCounts(updated=5, unchanged=45)
    (classify,) = _classify_sql(seen)
    assert re.search(rf"FORCE INDEX \(`?{guard_index_name(my_tables)}`?\)", classify)


def test_a_table_made_before_the_index_still_syncs_without_the_hint(my_engine, my_tables):
    WarehouseWriter(my_engine, table=my_tables, audit_table=f"{my_tables}_runs").ensure_tables()
    with my_engine.begin() as conn:
        conn.exec_driver_sql(f"DROP INDEX {guard_index_name(my_tables)} ON {my_tables}")
    writer = WarehouseWriter(my_engine, table=my_tables, audit_table=f"{my_tables}_runs")
    records = [make_record(i) for i in range(20)]
    with statements(my_engine) as seen:
        assert write(writer, records) == UpsertCounts(inserted=20)
        assert write(writer, records) == UpsertCounts(unchanged=20)
    assert writer.guard_index is None
    assert all("FORCE INDEX" not in sql for sql in _classify_sql(seen))

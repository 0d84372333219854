"""Fixtures of the warehouse tests: an engine per dialect and a writer on a fresh table."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.tables.schema import companion_table_name, rejects_table_name


@pytest.fixture()
def engine(warehouse_url: str) -> Iterator[sa.Engine]:
    # One pooled connection: tests that look for leftover staging tables see the writer's connection.
    eng = sa.create_engine(warehouse_url, pool_size=1, max_overflow=0)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture()
def make_writer(engine: sa.Engine, unique_table: str) -> Iterator[Callable[..., WarehouseWriter]]:
    """``make_writer(**kwargs)``: a writer on ``unique_table`` / ``<unique_table>_runs``; dropped after."""
    created: list[tuple[str | None, str]] = []

    def factory(**kwargs: Any) -> WarehouseWriter:
        kwargs.setdefault("table", unique_table)
        kwargs.setdefault("audit_table", f"{unique_table}_runs")
        writer = WarehouseWriter(engine, **kwargs)
        created.append((writer.schema, writer.table))
        created.append((writer.schema, writer.audit_table))
        created.append((writer.schema, rejects_table_name(writer.table)))
        for suffix in ("history", "lineage", "sources", "columns"):
            created.append((writer.schema, companion_table_name(writer.table, suffix)))
        return writer

    yield factory
    if engine.dialect.name != "sqlite":  # SQLite files go with tmp_path
        engine.dispose()
        with engine.begin() as conn:
            for schema, table in set(created):
                name = f"{schema}.{table}" if schema else table
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")


@pytest.fixture()
def writer(make_writer: Callable[..., WarehouseWriter]) -> WarehouseWriter:
    return make_writer()

@pytest.fixture()
def sf_engine(snowflake_url: str) -> Iterator[sa.Engine]:
    """A SQLAlchemy engine on fakesnow (one connection), disposed after; ``snowflake_url`` comes from
    the Snowflake test modules (fakesnow_support)."""
    engine = sa.create_engine(snowflake_url, pool_size=1, max_overflow=0)
    try:
        yield engine
    finally:
        engine.dispose()

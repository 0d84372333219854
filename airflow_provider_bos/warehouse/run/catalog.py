"""What the database says a table has: its column names (through the dialect or SQLAlchemy), its indexes.

SQLAlchemy's inspector reflects most databases; where it cannot (duckdb-engine's PostgreSQL-style
reflection queries catalog tables DuckDB does not have), the dialect's :meth:`columns_query`
asks the database's own catalog instead.
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse.dialects import WarehouseDialect
from airflow_provider_bos.warehouse.tables.identifiers import validate_identifier
from airflow_provider_bos.warehouse.tables.schema import GUARD_INDEX_COLUMNS

__all__ = ["column_names", "find_guard_index"]

log = logging.getLogger(__name__)


def column_names(
    engine: sa.Engine, dialect: WarehouseDialect | type[WarehouseDialect], table: str, schema: str | None,
) -> set[str]:
    """The columns of ``table``.

    :raises sqlalchemy.exc.NoSuchTableError: there is no such table.
    :raises sqlalchemy.exc.SQLAlchemyError: the look-up itself failed.
    """
    query = dialect.columns_query(table, schema)
    if query is None:
        return {c["name"] for c in sa.inspect(engine).get_columns(table, schema=schema)}
    with engine.connect() as conn:
        names = {str(name) for name in conn.exec_driver_sql(query.sql, query.params).scalars()}
    if not names:
        raise sa.exc.NoSuchTableError(f"{schema}.{table}" if schema else table)
    return names


def find_guard_index(inspector: Any, table: str, schema: str | None) -> str | None:
    """An index of ``table`` leading with the change test's columns (tables made before it had none)."""
    for index in inspector.get_indexes(table, schema=schema):
        if tuple(index["column_names"][: len(GUARD_INDEX_COLUMNS)]) == GUARD_INDEX_COLUMNS:
            try:
                return validate_identifier(index["name"], kind="index")
            except BosWarehouseError:  # a name we would have to quote unsafely: go without
                continue
    log.info("%s has no index on %s; re-runs read whole rows (see sql/mysql.sql).",
             f"{schema}.{table}" if schema else table, ", ".join(GUARD_INDEX_COLUMNS))
    return None

"""What the database says a table has: its column names, through the dialect or SQLAlchemy.

SQLAlchemy's inspector reflects most databases; where it cannot (duckdb-engine's PostgreSQL-style
reflection queries catalog tables DuckDB does not have), the dialect's :meth:`columns_query`
asks the database's own catalog instead.
"""

from __future__ import annotations

import sqlalchemy as sa

from airflow_provider_bos.warehouse.dialects import WarehouseDialect

__all__ = ["column_names"]


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

"""Dialect objects that BUILD the warehouse SQL, one module per database family.

Kept apart from execution (like dlt's ``sql_jobs`` and Airflow's ``common.sql`` dialects) so each
statement can be read and tested on its own. A dialect is configured once, at construction (the
driver's capabilities, whether the target has the wire-hash column), and never mutated later.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse.dialects.base import (
    DOCUMENT_STAGE_COLUMNS,
    STAGE_COLUMNS,
    CopyDialect,
    Statement,
    WarehouseDialect,
    staging_table_name,
)
from airflow_provider_bos.warehouse.dialects.mysql import MySqlDialect
from airflow_provider_bos.warehouse.dialects.postgres import PostgresDialect
from airflow_provider_bos.warehouse.dialects.sqlite import SqliteDialect

__all__ = [
    "DOCUMENT_STAGE_COLUMNS",
    "STAGE_COLUMNS",
    "CopyDialect",
    "MySqlDialect",
    "PostgresDialect",
    "SqliteDialect",
    "Statement",
    "WarehouseDialect",
    "dialect_for",
    "staging_table_name",
]


def dialect_for(engine_or_dialect: sa.Engine | sa.Dialect, **options: Any) -> WarehouseDialect:
    """The warehouse dialect for an engine; PostgreSQL, MySQL/MariaDB, SQLite and Snowflake are supported."""
    sa_dialect = engine_or_dialect.dialect if isinstance(engine_or_dialect, sa.Engine) else engine_or_dialect
    name = sa_dialect.name
    if name == "postgresql":
        return PostgresDialect(sa_dialect, **options)
    if name in ("mysql", "mariadb"):
        return MySqlDialect(sa_dialect, **options)
    if name == "sqlite":
        return SqliteDialect(sa_dialect, **options)
    if name == "snowflake":  # imported here: its types need the optional snowflake-sqlalchemy
        from airflow_provider_bos.warehouse.dialects.snowflake import SnowflakeDialect

        return SnowflakeDialect(sa_dialect, **options)
    raise BosWarehouseError(
        f"Destination database {name!r} is not supported; use PostgreSQL, MySQL/MariaDB, SQLite or Snowflake."
    )

"""Dialect objects that BUILD the warehouse SQL, one module per database family.

Kept apart from execution (like dlt's ``sql_jobs`` and Airflow's ``common.sql`` dialects) so each
statement can be read and tested on its own. A dialect is configured once, at construction (the
driver's capabilities, whether the target has the wire-hash column), and never mutated later.

Modules: ``base`` (the SQL every database shares), ``lifecycle`` (supersede, retire, history and
erasure SQL), ``capabilities`` (what a database can do, one frozen object per dialect),
``statement`` (a SQL text and its parameters), one module per database (``postgres``, ``mysql``,
``sqlite``, ``duckdb``, ``snowflake``), ``snowflake_types`` (Snowflake's column types).

A new database is one module here (a :class:`WarehouseDialect` subclass) and one line of
:data:`DIALECTS`; see docs/dialects.md for the rest (its DDL, the DDL test, the fixture, the bench).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse.dialects.base import (
    DOCUMENT_STAGE_COLUMNS,
    STAGE_COLUMNS,
    Statement,
    WarehouseDialect,
    staging_table_name,
)
from airflow_provider_bos.warehouse.dialects.duckdb import DuckDbDialect
from airflow_provider_bos.warehouse.dialects.mysql import MySqlDialect
from airflow_provider_bos.warehouse.dialects.postgres import PostgresDialect
from airflow_provider_bos.warehouse.dialects.snowflake import SnowflakeDialect
from airflow_provider_bos.warehouse.dialects.sqlite import SqliteDialect

__all__ = [
    "DOCUMENT_STAGE_COLUMNS",
    "STAGE_COLUMNS",
    "DIALECTS",
    "SUPPORTED_DESTINATIONS",
    "DuckDbDialect",
    "MySqlDialect",
    "PostgresDialect",
    "SqliteDialect",
    "Statement",
    "WarehouseDialect",
    "dialect_class",
    "dialect_for",
    "staging_table_name",
]


#: SQLAlchemy backend name -> the dialect that writes it (the one place a backend is chosen).
DIALECTS: dict[str, type[WarehouseDialect]] = {
    "postgresql": PostgresDialect,
    "mysql": MySqlDialect,
    "mariadb": MySqlDialect,
    "sqlite": SqliteDialect,
    "duckdb": DuckDbDialect,
    "snowflake": SnowflakeDialect,
}
#: What the error of an unsupported destination names.
SUPPORTED_DESTINATIONS = "PostgreSQL, MySQL/MariaDB, SQLite, DuckDB or Snowflake"


def _backend(engine_or_dialect: sa.Engine | sa.Dialect) -> str:
    sa_dialect = engine_or_dialect.dialect if isinstance(engine_or_dialect, sa.Engine) else engine_or_dialect
    return str(sa_dialect.name)


def dialect_class(engine_or_dialect: sa.Engine | sa.Dialect) -> type[WarehouseDialect]:
    """The dialect class of an engine; an unsupported database names the supported ones."""
    name = _backend(engine_or_dialect)
    try:
        return DIALECTS[name]
    except KeyError:
        raise BosWarehouseError(
            f"Destination database {name!r} is not supported; use {SUPPORTED_DESTINATIONS}."
        ) from None


def dialect_for(engine_or_dialect: sa.Engine | sa.Dialect, **options: Any) -> WarehouseDialect:
    """The warehouse dialect for an engine (see :data:`DIALECTS`)."""
    sa_dialect = engine_or_dialect.dialect if isinstance(engine_or_dialect, sa.Engine) else engine_or_dialect
    return dialect_class(sa_dialect)(sa_dialect, **options)

"""Running a built statement, and saying what the database refused without quoting the statement."""

from __future__ import annotations

from typing import Any, TypeAlias

import sqlalchemy as sa

from airflow_provider_bos.exceptions import excerpt
from airflow_provider_bos.warehouse.dialects.statement import Statement

__all__ = ["DriverResult", "db_detail", "execute"]

#: What driver SQL returns: rows of any width and types (the SQL text is the dialect's).
DriverResult: TypeAlias = "sa.CursorResult[*tuple[Any, ...]]"


def execute(conn: sa.Connection, statement: Statement) -> DriverResult:
    """Run a built statement on ``conn`` (its parameters bound by the driver)."""
    if statement.params:
        return conn.exec_driver_sql(statement.sql, statement.params)
    return conn.exec_driver_sql(statement.sql)


def db_detail(exc: BaseException) -> str:
    """The driver's message only: str(exc) would append the SQL and its parameters (record data),
    and a COPY error's context quotes the row."""
    orig = getattr(exc, "orig", None) or exc
    primary = getattr(getattr(orig, "diag", None), "message_primary", None)
    if primary:
        return excerpt(f"{type(orig).__name__}: {primary}", 300)
    return excerpt(str(orig) if orig is not exc else exc.__class__.__name__, 300)

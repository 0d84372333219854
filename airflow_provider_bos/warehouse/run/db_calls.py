"""Running a built statement, and saying what the database refused without quoting the statement."""

from __future__ import annotations

from typing import Any, TypeAlias

import sqlalchemy as sa

from airflow_provider_bos.exceptions import excerpt
from airflow_provider_bos.warehouse.dialects.statement import Statement

__all__ = ["UNREACHABLE_HINT", "DriverResult", "db_detail", "execute"]

#: What driver SQL returns: rows of any width and types (the SQL text is the dialect's).
DriverResult: TypeAlias = "sa.CursorResult[*tuple[Any, ...]]"


def execute(conn: sa.Connection, statement: Statement) -> DriverResult:
    """Run a built statement on ``conn`` (its parameters bound by the driver)."""
    if statement.params:
        return conn.exec_driver_sql(statement.sql, statement.params)
    return conn.exec_driver_sql(statement.sql)


#: What to do when the database could not be reached at all (said after the driver's message).
UNREACHABLE_HINT = ("The database could not be reached: check that it is running and reachable from this "
                    "machine, and the connection's host, port, database and credentials.")


def db_detail(exc: BaseException) -> str:
    """The driver's message only: str(exc) would append the SQL and its parameters (record data),
    and a COPY error's context quotes the row. A failure to connect says what to check."""
    orig = getattr(exc, "orig", None) or exc
    primary = getattr(getattr(orig, "diag", None), "message_primary", None)
    if primary:
        detail = excerpt(f"{type(orig).__name__}: {primary}", 300)
    else:
        detail = excerpt(str(orig) if orig is not exc else exc.__class__.__name__, 300)
    # SQLAlchemy wraps a driver error raised while connecting with no statement.
    connecting = isinstance(exc, sa.exc.DBAPIError) and exc.statement is None
    return f"{detail} {UNREACHABLE_HINT}" if connecting else detail

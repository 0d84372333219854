"""How the sync-health page opens a destination: read-only, with short timeouts, never waiting for a sync.

- SQLite: the file is opened ``mode=ro`` (a missing file is reported, never created), with a short
  busy timeout.
- PostgreSQL: a read-only session (``default_transaction_read_only``), a connect timeout of
  :data:`CONNECT_TIMEOUT_S` and a statement timeout of :data:`STATEMENT_TIMEOUT_S`.
- MySQL/MariaDB: a read-only session, connect and read timeouts.
- DuckDB: opened ``read_only``: a file a running sync holds is reported busy at once (a DuckDB file
  admits one writing process; waiting here could hold up the sync).
- Any other type (Snowflake): its hook's engine, as the operator gets it.

No pool is kept: each page view connects anew and disposes of the engine.
"""

from __future__ import annotations

import math
import sqlite3
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from airflow_provider_bos.exceptions import BosConfigurationError

__all__ = ["CONNECT_TIMEOUT_S", "STATEMENT_TIMEOUT_S", "destination_engine"]

#: The longest the page waits to connect to a destination database (and for SQLite's lock).
CONNECT_TIMEOUT_S = 5.0
#: The longest one of the page's statements may take on a destination.
STATEMENT_TIMEOUT_S = 20.0


def destination_engine(conn_id: str) -> sa.Engine:
    """A read-only engine on the destination that Airflow connection ``conn_id`` names (dispose it)."""
    from airflow.sdk import BaseHook

    from airflow_provider_bos.airflow_compat import AirflowNotFoundException
    from airflow_provider_bos.hooks.connections import (
        duckdb_database,
        engine_for_connection,
        url_from_connection,
    )

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise BosConfigurationError(f"The Airflow connection {conn_id!r} does not exist.") from None
    conn_type = (conn.conn_type or "").lower()
    if conn_type == "sqlite":
        path = str(url_from_connection(conn).database or "")
        if not path or path == ":memory:":
            raise BosConfigurationError(f"Connection {conn_id!r} names no SQLite file.")

        def connect() -> sqlite3.Connection:
            uri = f"file:{path}?mode=ro"
            return sqlite3.connect(uri, uri=True, timeout=CONNECT_TIMEOUT_S, check_same_thread=False)

        return sa.create_engine("sqlite://", creator=connect, poolclass=NullPool)
    if conn_type in ("postgres", "postgresql"):
        statement_ms = int(STATEMENT_TIMEOUT_S * 1000)
        options = (f"-c statement_timeout={statement_ms} -c lock_timeout={statement_ms} "
                   "-c default_transaction_read_only=on")
        connect_args: dict[str, Any] = {"connect_timeout": max(2, math.ceil(CONNECT_TIMEOUT_S)), "options": options}
        return sa.create_engine(url_from_connection(conn), connect_args=connect_args, poolclass=NullPool,
                                hide_parameters=True)
    if conn_type in ("mysql", "mariadb"):
        connect_args = {"connect_timeout": CONNECT_TIMEOUT_S, "read_timeout": STATEMENT_TIMEOUT_S,
                        "write_timeout": STATEMENT_TIMEOUT_S, "init_command": "SET SESSION TRANSACTION READ ONLY"}
        return sa.create_engine(url_from_connection(conn), connect_args=connect_args, poolclass=NullPool,
                                hide_parameters=True)
    if conn_type == "duckdb":
        database, config = duckdb_database(conn)
        if database == ":memory:":
            raise BosConfigurationError(f"Connection {conn_id!r} names no DuckDB file.")
        return sa.create_engine(URL.create("duckdb", database=database),
                                connect_args={"read_only": True, "config": config}, poolclass=NullPool)
    return engine_for_connection(conn_id)

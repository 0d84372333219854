"""A fakesnow server (Snowflake's HTTP protocol, DuckDB underneath) for the Snowflake tests.

``snowflake_url`` is a SQLAlchemy URL string like ``postgres_url``: the connector reaches the server
over loopback HTTP, so snowflake-sqlalchemy, the connector and the SnowflakeHook run for real. The
server's host, port and protocol travel in the URL's query, which snowflake-sqlalchemy accepts only
with its legacy URL parameters switched on (set here for the test session).

Without the snowflake test dependencies the tests skip; with ``BOS_REQUIRE_SNOWFLAKE=1`` (the CI
step that installs them) they fail instead.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator
from typing import Any

import pytest

REQUIRED = os.environ.get("BOS_REQUIRE_SNOWFLAKE", "").lower() in {"1", "true", "yes"}
DATABASE, SCHEMA = "bosdb", "public"


def _require() -> Any:
    try:
        import fakesnow
        import snowflake.sqlalchemy  # noqa: F401
    except ImportError as exc:
        message = f"the Snowflake test dependencies are not installed ({exc})"
        if REQUIRED:
            pytest.fail(f"{message}; BOS_REQUIRE_SNOWFLAKE is set, so they must run.")
        pytest.skip(f"{message}: install .[snowflake-test] with .ci/constraints-snowflake.txt")
    return fakesnow


_RUNNING: dict[str, Any] = {}


@pytest.fixture(scope="session")
def fakesnow_server() -> Iterator[dict[str, Any]]:
    """The running server's connection keyword arguments (host, port, protocol, account, ...).

    One server per test process, however many modules import this fixture: ``fakesnow.server()``
    imports its ``fakesnow.server`` module, which then shadows the function for a second call.
    """
    if not _RUNNING:
        fakesnow = _require()
        os.environ["SNOWFLAKE_SQLALCHEMY_LEGACY_URL_PARAMS"] = "1"
        server = fakesnow.server()
        _RUNNING.update(server.__enter__())
        atexit.register(server.__exit__, None, None, None)
    yield _RUNNING  # noqa: PT022 - the server stops at exit (a second fakesnow.server() fails)


@pytest.fixture(scope="session")
def snowflake_url(fakesnow_server: dict[str, Any]) -> str:
    """SQLAlchemy URL of the fakesnow database ``bosdb``, schema ``public``."""
    kw = fakesnow_server
    return (
        f"snowflake://{kw['user']}:{kw['password']}@{kw['account']}/{DATABASE}/{SCHEMA}"
        f"?host={kw['host']}&port={kw['port']}&protocol={kw['protocol']}"
    )


def snowflake_connection_json(kwargs: dict[str, Any]) -> dict[str, Any]:
    """An Airflow ``snowflake`` Connection (JSON form) on the fakesnow server, as a user writes it."""
    return {
        "conn_type": "snowflake",
        "login": kwargs["user"],
        "password": kwargs["password"],
        "schema": SCHEMA,
        "extra": {
            "account": kwargs["account"],
            "database": DATABASE,
            "warehouse": "compute_wh",
            "host": kwargs["host"],
            "port": kwargs["port"],
            "protocol": kwargs["protocol"],
        },
    }


@pytest.fixture()
def sf_writer(snowflake_url: str, unique_table: str) -> Iterator[Any]:
    """A WarehouseWriter on fakesnow for ``unique_table``; the table and its companions dropped after."""
    import sqlalchemy as sa

    from airflow_provider_bos.warehouse import WarehouseWriter
    from airflow_provider_bos.warehouse.tables.schema import companion_table_name

    engine = sa.create_engine(snowflake_url, pool_size=1, max_overflow=0)
    yield WarehouseWriter(engine, table=unique_table, audit_table=f"{unique_table}_runs")
    with engine.begin() as conn:
        kinds = ("history", "lineage", "sources", "rejects", "policy")
        for name in (unique_table, f"{unique_table}_runs", *(companion_table_name(unique_table, k) for k in kinds)):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
    engine.dispose()

"""Identities over time on Snowflake: the reconcile and history suites, run against fakesnow.

The same tests as every other dialect (imported, so they cannot drift apart), with the
``warehouse_url`` of this module pointing at the fakesnow server. Their table reads go through
plain SQL here: fakesnow does not answer the information_schema query snowflake-sqlalchemy reflects
a table with once a schema holds several tables.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fakesnow_support import fakesnow_server, snowflake_url  # noqa: F401 - fixtures

import tests.warehouse.test_history as history_suite
import tests.warehouse.test_reconcile as reconcile_suite
from airflow_provider_bos.warehouse.schema import companion_table_name
from tests.warehouse.test_history import *  # noqa: F403 - the shared suite runs again on this destination
from tests.warehouse.test_reconcile import *  # noqa: F403 - the shared suite runs again on this destination

pytestmark = pytest.mark.snowflake


@pytest.fixture()
def warehouse_url(snowflake_url: str) -> str:  # noqa: F811
    return snowflake_url


# fakesnow sends a NULL TIMESTAMP_TZ to the client as 1970-01-01 (its IS NULL is right): the nullable
# timestamps' NULL-ness is read in SQL.
_NULLABLE_TIMES = ("_bos_deleted_at", "_bos_valid_to")


def _select(engine: sa.Engine, sql: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = [{k.lower(): v for k, v in r._mapping.items()} for r in conn.exec_driver_sql(sql)]
    for row in rows:
        for column in _NULLABLE_TIMES:
            if row.pop(f"{column}_isnull", False):
                row[column] = None
    return rows


def _star(table: str, columns: tuple[str, ...]) -> str:
    nulls = "".join(f", {c} IS NULL AS {c}_isnull" for c in columns)
    return f"SELECT *{nulls} FROM {table}"


def _rows_by_ref(engine: sa.Engine, table: str, schema: str | None = None) -> dict[str, dict[str, Any]]:
    name = f"{schema}.{table}" if schema else table
    return {r["record_ref"]: r for r in _select(engine, _star(name, ("_bos_deleted_at",)))}


def _lineage(engine: sa.Engine, table: str) -> set[tuple[str, str]]:
    rows = _select(engine, f"SELECT record_ref, successor_ref FROM {companion_table_name(table, 'lineage')}")
    return {(r["record_ref"], r["successor_ref"]) for r in rows}


def _versions(engine: sa.Engine, table: str) -> list[dict[str, Any]]:
    history = companion_table_name(table, "history")
    return _select(engine, f"{_star(history, ('_bos_valid_to',))} ORDER BY record_ref, _bos_valid_from")


@pytest.fixture(autouse=True)
def _sql_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for suite in (history_suite, reconcile_suite):
        if hasattr(suite, "rows_by_ref"):
            monkeypatch.setattr(suite, "rows_by_ref", _rows_by_ref)
    monkeypatch.setattr(reconcile_suite, "lineage", _lineage)
    monkeypatch.setattr(history_suite, "versions", _versions)
    yield  # noqa: PT022 - monkeypatch undoes these at teardown

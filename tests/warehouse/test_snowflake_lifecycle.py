"""Identities over time on Snowflake: the reconcile, history and provenance suites, run against fakesnow.

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
import tests.warehouse.test_provenance_table as provenance_suite
import tests.warehouse.test_reconcile as reconcile_suite
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from tests.warehouse.test_history import *  # noqa: F403 - the shared suite runs again on this destination
from tests.warehouse.test_provenance_table import *  # noqa: F403 - the shared suite runs again on this destination
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


def _stored_entries(engine: sa.Engine, table: str) -> set[Any]:
    """As the suite's, but each entry's place read from its record's JSON once the places of every
    record are checked to be 0..n-1: fakesnow emulates FLATTEN's INDEX with ``row_number() OVER ()``,
    which numbers a record's elements in no set order (Snowflake's INDEX is the element's place)."""
    rows = _select(engine, f"SELECT * FROM {companion_table_name(table, 'sources')}")
    places: dict[str, list[int]] = {}
    for r in rows:
        places.setdefault(r["record_ref"], []).append(int(r["entry_index"]))
    assert all(sorted(p) == list(range(len(p))) for p in places.values())
    json = provenance_suite.json
    place = {(ref, e["source_type"], e["source_identity"], e["external_id"]): i
             for ref, row in _rows_by_ref(engine, table).items() for i, e in enumerate(json.loads(row["sources"]))}
    return {(r["record_ref"], place[(r["record_ref"], r["source_type"], r["source_identity"], r["external_id"])],
             r["source_type"], r["source_identity"], r["external_id"], r["record_type"], r["version"],
             json.dumps(provenance_suite._json(r["capabilities"])), bool(r["is_current"])) for r in rows}


def _holder(engine: sa.Engine, table: str, source_type: str, external_id: str) -> list[str]:
    rows = _select(engine, f"SELECT record_ref FROM {companion_table_name(table, 'sources')} WHERE "
                           f"source_type = '{source_type}' AND external_id = '{external_id}' AND is_current")
    return [r["record_ref"] for r in rows]


@pytest.fixture(autouse=True)
def _sql_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(provenance_suite, "stored_entries", _stored_entries)
    monkeypatch.setattr(provenance_suite, "holder", _holder)
    for suite in (history_suite, reconcile_suite, provenance_suite):
        if hasattr(suite, "rows_by_ref"):
            monkeypatch.setattr(suite, "rows_by_ref", _rows_by_ref)
    monkeypatch.setattr(reconcile_suite, "lineage", _lineage)
    monkeypatch.setattr(history_suite, "versions", _versions)
    yield  # noqa: PT022 - monkeypatch undoes these at teardown

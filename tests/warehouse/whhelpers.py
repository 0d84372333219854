"""Helpers shared by the warehouse tests (records, runs, table dumps)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.warehouse import SyncRunInfo, WarehouseWriter
from airflow_provider_bos.wire import WriteOptions

T0 = "2026-10-07T12:00:00Z"
T1 = "2026-10-08T12:00:00Z"
T2 = "2026-10-09T12:00:00Z"


def make_record(i: int | str, observed_at: str = T1, *, name: str | None = None, **fields: Any) -> dict[str, Any]:
    ref = i if isinstance(i, str) else f"bos:person:{i:06d}"
    record: dict[str, Any] = {
        "record_ref": ref,
        "display_name": name if name is not None else f"Person {i}",
        "email": f"p{i}@example.com",
        "phone": None,
        "lifecycle": {"state": "active"},
        "identity_match": None,
        "attributes": {"dept": "eng", "level": 3},
        "sources": [
            {
                "source_type": "crm",
                "source_identity": "crm-eu",
                "external_id": str(i),
                "record_type": "person",
                "observed_at": observed_at,
                "capabilities": ["read"],
                "version": None,
            }
        ],
    }
    record.update(copy.deepcopy(fields))
    return record


def run_info(**overrides: Any) -> SyncRunInfo:
    values: dict[str, Any] = {
        "dag_id": "d",
        "task_id": "t",
        "airflow_run_id": "manual__1",
        "conn_id": "bos_default",
        "context_handle": "ctx-1",
        "tool_name": "people.search",
        "arguments_hash": "0" * 64,
    }
    values.update(overrides)
    return SyncRunInfo(**values)


def write(writer: WarehouseWriter, records: list[dict[str, Any]], run: SyncRunInfo | None = None, **kwargs: Any):
    audit: dict[str, Any] = {
        "completeness": "complete",
        "status": "complete",
        "result_count": len(records) if hasattr(records, "__len__") else None,
        "source_errors": [],
        "source_summary": [{"source": "crm/crm-eu", "pages": 1}],
        "provisional_records": 0,
        "provisional_pages": 0,
    }
    options = {name: kwargs.pop(name) for name in ("known", "default_observed_at", "invalid_records", "reconcile",
                                                   "pii", "attribute_columns",
                                                   "coverage_columns") if name in kwargs}
    audit.update(kwargs)
    return writer.write_run(run or run_info(), records, WriteOptions(audit=audit, **options))


# DuckDB column types as SQLAlchemy types (duckdb-engine cannot reflect under SQLAlchemy 2.1).
_DUCKDB_TYPES = {"VARCHAR": sa.String, "JSON": sa.JSON, "BIGINT": sa.BigInteger, "BOOLEAN": sa.Boolean,
                 "BLOB": sa.LargeBinary, "INTEGER": sa.Integer, "DOUBLE": sa.Float,
                 "TIMESTAMP WITH TIME ZONE": lambda: sa.DateTime(True)}


def reflect(engine: sa.Engine, table: str, schema: str | None = None) -> sa.Table:
    """``table`` as stored (every column, extra ones too)."""
    if engine.dialect.name != "duckdb":
        return sa.Table(table, sa.MetaData(), autoload_with=engine, schema=schema)
    with engine.connect() as conn:
        described = conn.exec_driver_sql(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ? "
            "AND table_schema = COALESCE(?, current_schema()) ORDER BY ordinal_position", (table, schema),
        ).all()
    if not described:
        raise sa.exc.NoSuchTableError(table)
    return sa.Table(table, sa.MetaData(), *(sa.Column(n, _DUCKDB_TYPES[t]()) for n, t in described), schema=schema)


def dump(engine: sa.Engine, table: str, schema: str | None = None) -> list[tuple[str, ...]]:
    """Every row, every column (extra columns too), as repr text, in key order."""
    t = reflect(engine, table, schema)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t).order_by(t.c.record_ref)).all()
    return [tuple(repr(v) for v in row) for row in rows]


def rows_by_ref(engine: sa.Engine, table: str, schema: str | None = None) -> dict[str, dict[str, Any]]:
    t = reflect(engine, table, schema)
    with engine.connect() as conn:
        return {row.record_ref: dict(row._mapping) for row in conn.execute(sa.select(t))}


@contextmanager
def statements(engine: sa.Engine) -> Iterator[list[str]]:
    """The SQL text of every statement the engine executes inside the block."""
    seen: list[str] = []

    def before(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", before)


def drop_columns(engine: sa.Engine, table: str, columns: tuple[str, ...]) -> None:
    """``ALTER TABLE ... DROP COLUMN`` each of ``columns`` (a table as made before them). DuckDB
    refuses to alter a table with an index: its indexes are dropped first and made again after."""
    with engine.begin() as conn:
        indexes = conn.exec_driver_sql(
            "SELECT index_name, sql FROM duckdb_indexes() WHERE table_name = ?", (table,),
        ).all() if engine.dialect.name == "duckdb" else []
        for name, _ in indexes:
            conn.exec_driver_sql(f"DROP INDEX {name}")
        for column in columns:
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {column}")
        for _, sql in indexes:
            conn.exec_driver_sql(sql)

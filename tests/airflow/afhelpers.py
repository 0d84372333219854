"""Helpers for the Airflow end-to-end tests: task states, table dumps, audit rows."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa

# The end-to-end smoke of one test per file on every dialect (tests/airflow/conftest.py): SQLite in
# the fast tier; PostgreSQL, MariaDB and DuckDB in the full tier (tests/conftest.py). Each dialect's
# SQL is proven in tests/warehouse; the smoke proves the Airflow side of it (the connection type, the
# engine the hook builds, a whole DAG run landing and auditing on that database).
every_dialect = pytest.mark.parametrize(
    "warehouse_url",
    ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres), pytest.param("mysql", marks=pytest.mark.mysql),
     "duckdb"],
    indirect=True,
)


def task_states(dag_run: Any) -> dict[str, str]:
    return {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dag_run.get_task_instances()}


def table_dump(engine: sa.Engine, table: str) -> list[tuple]:
    """Every row of ``table`` in key order, as comparable tuples (empty if the table is missing)."""
    if not sa.inspect(engine).has_table(table):
        return []
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT * FROM {table} ORDER BY record_ref")).all()
    return [tuple(str(v) for v in row) for row in rows]


def audit_rows(engine: sa.Engine, table: str, audit_table: str = "bos_sync_runs") -> list[dict[str, Any]]:
    """Audit rows of syncs into ``table`` (the audit table is shared by tests on a server database)."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT * FROM {audit_table} ORDER BY started_at")).mappings().all()
    return [dict(r) for r in rows if str(r["destination_table"]).split(".")[-1] == table]


def xcom_summary(dag_run: Any, task_id: str = "sync") -> dict[str, Any]:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            sa.select(XComModel).where(
                XComModel.dag_id == dag_run.dag_id,
                XComModel.run_id == dag_run.run_id,
                XComModel.task_id == task_id,
                XComModel.key == "return_value",
            )
        ).one()
        value = row.value
    return json.loads(value) if isinstance(value, str) else value

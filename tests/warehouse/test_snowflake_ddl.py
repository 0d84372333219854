"""sql/snowflake.sql and the SQLAlchemy definitions create the same tables on Snowflake (fakesnow)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from fakesnow_support import fakesnow_server, snowflake_url  # noqa: F401 - fixtures

from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.tables.companions import COMPANIONS

SQL_FILE = Path(__file__).resolve().parents[2] / "sql" / "snowflake.sql"
# The records and audit tables and every companion of the registry.
TABLES = ("BOS_RECORDS", "BOS_SYNC_RUNS", *(c.name("bos_records").upper() for c in COMPANIONS))

pytestmark = pytest.mark.snowflake


def _statements() -> list[str]:
    text = re.sub(r"--[^\n]*", "", SQL_FILE.read_text(encoding="utf-8"))
    return [s.strip() for s in text.split(";") if s.strip()]


def _shape(engine: sa.Engine, schema: str, tables: tuple[str, ...] = TABLES) -> dict[str, list[tuple[str, str, str]]]:
    # information_schema, as a Snowflake user would compare them: (name, type, nullable) in order.
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_schema = %s ORDER BY table_name, ordinal_position", (schema.upper(),)).all()
    shape: dict[str, list[tuple[str, str, str]]] = {t: [] for t in tables}
    for table, column, data_type, nullable in rows:
        if table in shape:  # the tables compared (the file also makes those of optional features)
            shape[table].append((column, data_type, nullable))
    return shape


def test_sql_file_matches_the_code(snowflake_url: str) -> None:  # noqa: F811
    engine = sa.create_engine(snowflake_url)
    suffix = uuid.uuid4().hex[:10]
    code_ns, file_ns = f"bos_ddl_code_{suffix}", f"bos_ddl_file_{suffix}"
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {code_ns}")
            conn.exec_driver_sql(f"CREATE SCHEMA {file_ns}")
        writer = WarehouseWriter(engine, schema=code_ns)
        writer.ensure_tables()
        for companion in COMPANIONS:
            writer.ensure_companion(companion)
        with engine.begin() as conn:
            conn.exec_driver_sql(f"USE SCHEMA {file_ns}")
            for statement in _statements():
                conn.exec_driver_sql(statement)
        engine.dispose()  # the USE SCHEMA connection must not be reused
        code, from_file = _shape(engine, code_ns), _shape(engine, file_ns)
        assert code == from_file
        assert code["BOS_RECORDS"][4] == ("LIFECYCLE", "VARIANT", "YES")
        assert ("_BOS_OBSERVED_AT", "TIMESTAMP_TZ", "NO") in code["BOS_RECORDS"]
        assert ("_BOS_DELETED_AT", "TIMESTAMP_TZ", "YES") in code["BOS_RECORDS"]
        assert ("SCOPE", "TEXT", "YES") in code["BOS_SYNC_RUNS"] and code["BOS_RECORDS_HISTORY"]
        assert ("COVERAGE", "VARIANT", "YES") in code["BOS_SYNC_RUNS"]
    finally:
        with engine.begin() as conn:
            for ns in (code_ns, file_ns):
                conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {ns} CASCADE")
        engine.dispose()

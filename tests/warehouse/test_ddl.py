"""sql/<dialect>.sql and the SQLAlchemy definitions create the same tables (compared by inspection)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import sqlalchemy as sa

from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.tables.companions import COMPANIONS

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
SQL_FILES = {"sqlite": "sqlite.sql", "postgresql": "postgres.sql", "mysql": "mysql.sql", "duckdb": "duckdb.sql"}
# The records and audit tables and every companion of the registry: a new companion is compared too.
TABLES = ("bos_records", "bos_sync_runs", *(c.name("bos_records") for c in COMPANIONS))


def _create_by_code(writer: WarehouseWriter) -> None:
    writer.ensure_tables()
    for companion in COMPANIONS:
        writer.ensure_companion(companion)


def _statements(path: Path) -> list[str]:
    text = re.sub(r"--[^\n]*", "", path.read_text(encoding="utf-8"))
    return [s.strip() for s in text.split(";") if s.strip()]


def _duckdb_shape(engine: sa.Engine, schema: str, tables: tuple[str, ...] = TABLES) -> dict:
    """As :func:`_shape`, from DuckDB's own catalog (duckdb-engine cannot reflect under SQLAlchemy 2.1)."""
    shape = {}
    with engine.connect() as conn:
        for table in tables:
            where = (schema, table)
            shape[table] = {
                "columns": conn.exec_driver_sql(
                    "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
                    "WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position", where).all(),
                "pk": conn.exec_driver_sql(
                    "SELECT constraint_column_names FROM duckdb_constraints() WHERE schema_name = ? "
                    "AND table_name = ? AND constraint_type = 'PRIMARY KEY'", where).scalars().all(),
                "indexes": sorted(conn.exec_driver_sql(
                    "SELECT index_name, expressions, is_unique FROM duckdb_indexes() WHERE schema_name = ? "
                    "AND table_name = ?", where).all()),
            }
    return shape


def _shape(engine: sa.Engine, schema: str | None, tables: tuple[str, ...] = TABLES) -> dict:
    if engine.dialect.name == "duckdb":
        return _duckdb_shape(engine, schema or "main", tables)
    inspector = sa.inspect(engine)
    shape = {}
    for table in tables:
        shape[table] = {
            "columns": [
                (c["name"], c["type"].compile(dialect=engine.dialect), c["nullable"])
                for c in inspector.get_columns(table, schema=schema)
            ],
            "pk": inspector.get_pk_constraint(table, schema=schema)["constrained_columns"],
            "indexes": sorted(
                # MySQL's key prefixes too (mysql_length): a longer one than InnoDB holds fails the DDL.
                (i["name"], tuple(i["column_names"]), bool(i["unique"]),
                 repr(i.get("dialect_options", {}).get("mysql_length")))
                for i in inspector.get_indexes(table, schema=schema)
            ),
            "options": inspector.get_table_options(table, schema=schema),
        }
    return shape


def test_sql_files_match_the_code(warehouse_url, tmp_path):
    engine = sa.create_engine(warehouse_url)
    dialect = engine.dialect.name
    statements = _statements(SQL_DIR / SQL_FILES[dialect])
    suffix = uuid.uuid4().hex[:10]
    try:
        if dialect == "sqlite":
            file_engine = sa.create_engine(f"sqlite:///{tmp_path / 'from_file.db'}")
            _create_by_code(WarehouseWriter(engine))
            with file_engine.begin() as conn:
                for statement in statements:
                    conn.exec_driver_sql(statement)
            code_shape, file_shape = _shape(engine, None), _shape(file_engine, None)
        else:
            code_ns, file_ns = f"bos_ddl_code_{suffix}", f"bos_ddl_file_{suffix}"
            create = "CREATE DATABASE" if dialect == "mysql" else "CREATE SCHEMA"
            with engine.begin() as conn:
                conn.exec_driver_sql(f"{create} {code_ns}")
                conn.exec_driver_sql(f"{create} {file_ns}")
            _create_by_code(WarehouseWriter(engine, schema=code_ns))
            with engine.begin() as conn:
                conn.exec_driver_sql(f"USE {file_ns}" if dialect == "mysql" else f"SET search_path TO {file_ns}")
                for statement in statements:
                    conn.exec_driver_sql(statement)
            engine.dispose()  # the USE / search_path connection must not be reused
            code_shape, file_shape = _shape(engine, code_ns), _shape(engine, file_ns)
        assert code_shape == file_shape
        if dialect == "duckdb":
            assert code_shape["bos_records"]["pk"] == [["record_ref"]]
            assert [name for name, *_ in code_shape["bos_sync_runs"]["indexes"]] == ["ix_bos_sync_runs_lookup"]
            assert ("attributes", "JSON", "NO") in code_shape["bos_records"]["columns"]
            assert ("_bos_observed_at", "TIMESTAMP WITH TIME ZONE", "NO") in code_shape["bos_records"]["columns"]
            assert code_shape["bos_records_history"]["pk"] == [["record_ref", "_bos_valid_from"]]
        else:
            assert code_shape["bos_records"]["pk"] == ["record_ref"]
            assert code_shape["bos_records_history"]["pk"] == ["record_ref", "_bos_valid_from"]
            assert ("ix_bos_sync_runs_lookup", ("conn_id", "context_handle", "tool_name", "finished_at"), False,
                    "None") in code_shape["bos_sync_runs"]["indexes"]
        if dialect == "mysql":  # the prefixes are compared above: they are there to compare
            assert ("ix_bos_records_sources_entry", ("source_type", "source_identity", "external_id"), False,
                    repr({"source_type": 128, "source_identity": 256, "external_id": 384})) in (
                code_shape["bos_records_sources"]["indexes"])
        assert {"_bos_deleted_at", "_bos_superseded_by"} <= {c[0] for c in code_shape["bos_records"]["columns"]}
        assert {"retired", "superseded", "scope", "coverage"} <= {c[0] for c in code_shape["bos_sync_runs"]["columns"]}
    finally:
        if dialect != "sqlite":
            drop = "DROP DATABASE IF EXISTS {}" if dialect == "mysql" else "DROP SCHEMA IF EXISTS {} CASCADE"
            with engine.begin() as conn:
                for ns in (f"bos_ddl_code_{suffix}", f"bos_ddl_file_{suffix}"):
                    conn.exec_driver_sql(drop.format(ns))
        engine.dispose()


def test_record_columns_describe_the_records_table():
    from airflow_provider_bos.warehouse import RECORD_COLUMNS, record_columns
    from airflow_provider_bos.warehouse.tables.schema import WIRE_HASH_COLUMN

    for backend, json_type, key_type in (
        ("postgresql", "JSONB", "VARCHAR(512)"), ("mysql", "JSON", "VARCHAR(512)"), ("mariadb", "JSON", "VARCHAR(512)"),
        ("sqlite", "TEXT", "VARCHAR(512)"), ("duckdb", "JSON", "VARCHAR"),
    ):
        columns = dict(record_columns(backend))
        assert tuple(columns) == (*RECORD_COLUMNS, WIRE_HASH_COLUMN, "_bos_deleted_at", "_bos_superseded_by")
        assert columns["attributes"] == json_type and columns["record_ref"] == key_type

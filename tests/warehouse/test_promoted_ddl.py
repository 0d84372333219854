"""sql/<dialect>.sql shows the promoted columns the writer adds (one ALTER per type) and the
``<table>_columns`` table; both are compared with what the code makes, by inspection."""

from __future__ import annotations

import re
import uuid

import sqlalchemy as sa

from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.tables.attribute_columns import ATTRIBUTE_TYPES, check_attribute_columns
from tests.warehouse.test_ddl import SQL_DIR, SQL_FILES, _shape, _statements
from tests.warehouse.whhelpers import write

TABLES = ("bos_records", "bos_records_history", "bos_records_columns")
FILES = {**SQL_FILES, "snowflake": "snowflake.sql"}  # Snowflake's are compared in test_snowflake_promoted.py
_EXAMPLE = re.compile(r"^-- promoted (\w+): (ALTER TABLE (\w+) ADD COLUMN (\w+) [^;]+);$", re.MULTILINE)


def examples(dialect: str) -> list[tuple[str, str, str, str]]:
    """(type, statement, table, column) of each documented ALTER in the dialect's sql file."""
    return [m.groups() for m in _EXAMPLE.finditer((SQL_DIR / FILES[dialect]).read_text(encoding="utf-8"))]


def test_every_type_has_a_documented_alter_per_table() -> None:
    for dialect in FILES:
        found = examples(dialect)
        assert sorted({kind for kind, *_ in found}) == sorted(ATTRIBUTE_TYPES), dialect
        assert {(kind, table) for kind, _, table, _ in found} == {
            (kind, table) for kind in ATTRIBUTE_TYPES for table in ("bos_records", "bos_records_history")}


def test_the_documented_alters_add_what_the_writer_adds(warehouse_url, tmp_path) -> None:
    engine = sa.create_engine(warehouse_url)
    dialect = engine.dialect.name
    found = examples(dialect)
    columns = check_attribute_columns({column: {"path": f"attributes.{column}", "type": kind}
                                       for kind, _, _, column in found})
    file_statements = [*_statements(SQL_DIR / SQL_FILES[dialect]), *(statement for _, statement, _, _ in found)]
    suffix = uuid.uuid4().hex[:10]
    try:
        if dialect == "sqlite":
            file_engine = sa.create_engine(f"sqlite:///{tmp_path / 'from_file.db'}")
            writer = WarehouseWriter(engine)
            writer.ensure_history_table()
            write(writer, [], attribute_columns=columns)
            with file_engine.begin() as conn:
                for statement in file_statements:
                    conn.exec_driver_sql(statement)
            code_shape, file_shape = _shape(engine, None, TABLES), _shape(file_engine, None, TABLES)
        else:
            code_ns, file_ns = f"bos_pddl_code_{suffix}", f"bos_pddl_file_{suffix}"
            create = "CREATE DATABASE" if dialect == "mysql" else "CREATE SCHEMA"
            with engine.begin() as conn:
                conn.exec_driver_sql(f"{create} {code_ns}")
                conn.exec_driver_sql(f"{create} {file_ns}")
            writer = WarehouseWriter(engine, schema=code_ns)
            writer.ensure_history_table()
            write(writer, [], attribute_columns=columns)
            with engine.begin() as conn:
                conn.exec_driver_sql(f"USE {file_ns}" if dialect == "mysql" else f"SET search_path TO {file_ns}")
                for statement in file_statements:
                    conn.exec_driver_sql(statement)
            engine.dispose()  # the USE / search_path connection must not be reused
            code_shape, file_shape = _shape(engine, code_ns, TABLES), _shape(engine, file_ns, TABLES)
        assert code_shape == file_shape
        names = {c[0] for c in code_shape["bos_records"]["columns"]}
        assert set(columns.names) <= names
    finally:
        if dialect != "sqlite":
            drop = "DROP DATABASE IF EXISTS {}" if dialect == "mysql" else "DROP SCHEMA IF EXISTS {} CASCADE"
            with engine.begin() as conn:
                for ns in (f"bos_pddl_code_{suffix}", f"bos_pddl_file_{suffix}"):
                    conn.exec_driver_sql(drop.format(ns))
        engine.dispose()

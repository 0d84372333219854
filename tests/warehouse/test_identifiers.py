"""Table and schema names are validated before they reach SQL; injection attempts are refused."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosConfigurationError, BosIdentifierError
from airflow_provider_bos.warehouse import AuditReader, WarehouseWriter, validate_identifier, validate_schema

BAD_NAMES = [
    "x; DROP TABLE y",
    'records"; DROP TABLE y; --',
    "records'",
    "`records`",
    "public.records",
    "records -- comment",
    "records\n",
    "1records",
    "",
    " records",
    "rec ords",
    "récords",
    "a" * 64,
    None,
    42,
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_refused(name):
    with pytest.raises(BosIdentifierError):
        validate_identifier(name)


@pytest.mark.parametrize("name", ["bos_records", "_private", "T1", "a" * 63, "select"])
def test_good_names_pass(name):
    assert validate_identifier(name) == name


def test_writer_and_reader_refuse_injection_before_touching_the_database(tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'w.db'}")
    with pytest.raises(BosIdentifierError, match="table name"):
        WarehouseWriter(engine, table="x; DROP TABLE y")
    with pytest.raises(BosIdentifierError, match="audit table"):
        WarehouseWriter(engine, audit_table='runs"')
    with pytest.raises(BosIdentifierError):
        AuditReader(engine, table="a.b")
    assert sa.inspect(engine).get_table_names() == []


def test_schema_rules_per_dialect(tmp_path):
    assert validate_schema(None, "sqlite") is None
    assert validate_schema("main", "sqlite") is None
    with pytest.raises(BosConfigurationError, match="SQLite"):
        validate_schema("other", "sqlite")
    with pytest.raises(BosIdentifierError, match="schema"):
        validate_schema("public; DROP SCHEMA x", "postgresql")
    assert validate_schema("analytics", "mysql") == "analytics"
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'w.db'}")
    with pytest.raises(BosConfigurationError):
        WarehouseWriter(engine, schema="elsewhere")


def test_the_message_names_what_was_refused():
    with pytest.raises(BosIdentifierError, match="destination_table"):
        validate_identifier("a;b", what="destination_table")

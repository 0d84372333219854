"""The tables as stored, read with plain SQL: no code shared with the writer.

Every JSON column is read AS TEXT in SQL (SQLite: the column; PostgreSQL: ``col::text``; MySQL and
MariaDB: the column, their JSON is LONGTEXT; DuckDB: ``CAST(col AS VARCHAR)``; Snowflake:
``TO_JSON(col)``) and decoded once here with :func:`json.loads`, numbers as exact
:class:`~decimal.Decimal` and integers, so a comparison is exact whatever the driver would have done
with the value. Timestamps come through the driver and are made aware UTC datetimes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

RECORD_JSON = ("lifecycle", "identity_match", "attributes", "sources")
JSON_COLUMNS = {
    "": RECORD_JSON,
    "_history": RECORD_JSON,
    "_sources": ("capabilities",),
    "_runs": ("coverage", "source_errors", "source_summary"),
}
COMPANIONS = ("", "_history", "_lineage", "_sources", "_rejects", "_policy", "_columns", "_runs")


class Undecodable:
    """A JSON column whose text is not JSON: kept as it was, so the comparison names it."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Undecodable({self.text[:200]!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Undecodable) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


def json_as_text(dialect: str, column: str) -> str:
    if dialect == "postgresql":
        return f"{column}::text"
    if dialect == "duckdb":
        return f"CAST({column} AS VARCHAR)"
    if dialect == "snowflake":
        return f"TO_JSON({column})"
    return column  # sqlite, mysql (MariaDB's JSON is LONGTEXT)


def any_as_text(dialect: str, column: str) -> str:
    if dialect == "postgresql":
        return f"{column}::text"
    if dialect == "mysql":
        return f"CAST({column} AS CHAR)"
    if dialect == "duckdb":
        return f"CAST({column} AS VARCHAR)"
    if dialect == "snowflake":
        return f"TO_VARCHAR({column})"
    return f"CAST({column} AS TEXT)"


def decode(text: Any) -> Any:
    """A JSON column's text, decoded once (SQL NULL: None)."""
    if text is None:
        return None
    if isinstance(text, bytes | bytearray | memoryview):
        text = bytes(text).decode("utf-8")
    try:
        return json.loads(text, parse_float=Decimal)
    except (TypeError, ValueError):
        return Undecodable(str(text))


def utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def table_names(conn: sa.Connection, dialect: str, prefix: str) -> list[str]:
    """The tables named ``prefix`` or ``prefix_...``."""
    if dialect == "sqlite":
        rows = conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'table'").scalars()
    elif dialect == "mysql":
        rows = conn.exec_driver_sql("SELECT table_name FROM information_schema.tables "
                                    "WHERE table_schema = DATABASE()").scalars()
    else:
        rows = conn.exec_driver_sql("SELECT table_name FROM information_schema.tables "
                                    "WHERE table_schema = current_schema()").scalars()
    return sorted(name for name in rows if name == prefix or name.startswith(prefix + "_"))


def column_names(conn: sa.Connection, dialect: str, table: str) -> list[str]:
    if dialect == "sqlite":
        return [row[1] for row in conn.exec_driver_sql(f"PRAGMA table_info({table})")]
    schema = "DATABASE()" if dialect == "mysql" else "current_schema()"
    return list(conn.exec_driver_sql(
        f"SELECT column_name FROM information_schema.columns WHERE table_name = '{table}' "
        f"AND table_schema = {schema} ORDER BY ordinal_position").scalars())


def read_table(conn: sa.Connection, dialect: str, table: str, json_columns: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every row of ``table``: JSON columns decoded from their text, the rest as the driver gives them."""
    names = column_names(conn, dialect, table)
    select = ", ".join(json_as_text(dialect, n) if n in json_columns else n for n in names)
    rows = conn.exec_driver_sql(f"SELECT {select} FROM {table}").all()
    return [{n: decode(v) if n in json_columns else v for n, v in zip(names, row, strict=True)} for row in rows]


def read_as_text(conn: sa.Connection, dialect: str, table: str) -> list[tuple[str | None, ...]]:
    """Every row of ``table``, every column as the database's own text."""
    names = column_names(conn, dialect, table)
    select = ", ".join(any_as_text(dialect, n) for n in names)
    return [tuple(row) for row in conn.exec_driver_sql(f"SELECT {select} FROM {table}").all()]


@dataclass
class Tables:
    """One records table and its companions, as stored."""

    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Each records row, every column as text (to tell a rewritten row from an untouched one).
    records_text: dict[str, tuple[str | None, ...]] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    lineage: list[dict[str, Any]] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    policy: list[dict[str, Any]] = field(default_factory=list)
    rejects: list[dict[str, Any]] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    #: Every column of every table as text, one line per row (to look for values in).
    text: str = ""


def read_tables(engine: sa.Engine, table: str) -> Tables:
    """``table`` and every table named ``table_...`` (its companions and its audit table ``table_runs``)."""
    dialect = engine.dialect.name
    out = Tables()
    with engine.connect() as conn:
        out.present = table_names(conn, dialect, table)
        lines = []
        for name in out.present:
            for row in read_as_text(conn, dialect, name):
                lines.append(f"{name}: " + "\t".join("" if v is None else str(v) for v in row))
        out.text = "\n".join(lines)

        def read(suffix: str) -> list[dict[str, Any]]:
            name = table + suffix
            if name not in out.present:
                return []
            return read_table(conn, dialect, name, JSON_COLUMNS.get(suffix, ()))

        for row in read(""):
            out.records[row["record_ref"]] = row
        if table in out.present:
            names = column_names(conn, dialect, table)
            for row in read_as_text(conn, dialect, table):
                out.records_text[row[names.index("record_ref")]] = row
        out.history = read("_history")
        out.lineage = read("_lineage")
        out.sources = read("_sources")
        out.runs = {row["run_id"]: row for row in read("_runs")}
        out.policy = read("_policy")
        out.rejects = read("_rejects")
    return out


def same_json(expected: Any, stored: Any) -> bool:
    """``stored`` (decoded with exact numbers) holds the JSON value ``expected`` (a model value):
    the same types (a boolean is no number), objects with the same keys, numbers of the same value
    (an integer exactly; a float as the nearest double of the stored number)."""
    if expected is None or isinstance(expected, bool):
        return stored is expected
    if isinstance(expected, int):
        return isinstance(stored, int | Decimal) and not isinstance(stored, bool) and stored == expected
    if isinstance(expected, float):
        return isinstance(stored, int | Decimal) and not isinstance(stored, bool) and float(stored) == expected
    if isinstance(expected, str):
        return isinstance(stored, str) and stored == expected
    if isinstance(expected, list):
        return (isinstance(stored, list) and len(stored) == len(expected)
                and all(same_json(e, s) for e, s in zip(expected, stored, strict=True)))
    if isinstance(expected, dict):
        return (isinstance(stored, dict) and set(stored) == set(expected)
                and all(same_json(expected[k], stored[k]) for k in expected))
    raise TypeError(f"not a JSON value: {expected!r}")

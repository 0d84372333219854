"""The "chart coverage over time" queries of docs/warehouse.md, run as written against audit rows a
writer made: each dialect's query gives (finished_at, column_name, ratio) of the complete runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from whhelpers import make_record, run_info, write

DOC = Path(__file__).resolve().parents[2] / "docs" / "warehouse.md"
LABELS = {"postgresql": "PostgreSQL", "mysql": "MySQL / MariaDB", "sqlite": "SQLite", "duckdb": "DuckDB",
          "snowflake": "Snowflake"}


def chart_query(dialect: str, audit_table: str) -> str:
    """The documented query of ``dialect`` (its block starts ``-- <label> (``), on ``audit_table``."""
    section = DOC.read_text(encoding="utf-8").split("#### Chart coverage over time", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sql\n(.*?)```", section, re.DOTALL)
    [query] = [b for b in blocks if b.startswith(f"-- {LABELS[dialect]} (")]
    return query.replace("bos_sync_runs", audit_table).rstrip().rstrip(";")


def write_runs(writer) -> None:
    """A run with values, a run where email went empty, and a failed run (no coverage)."""
    write(writer, [make_record(i, email=None if i < 3 else f"p{i}@example.com", phone="+49" if i < 5 else None)
                   for i in range(10)], run_info())
    write(writer, [make_record(i, email=None, phone="+49" if i < 5 else None) for i in range(10)], run_info())
    writer.record_failure(run_info(), error="BosTransportError: the stream dropped")


EXPECTED = [("display_name", 1.0), ("email", 0.7), ("phone", 0.5), ("display_name", 1.0), ("email", 0.0),
            ("phone", 0.5)]


def test_the_documented_query_charts_each_column_of_each_complete_run(writer, engine) -> None:
    write_runs(writer)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(chart_query(engine.dialect.name, writer.audit_table)).all()
    assert [(column, pytest.approx(float(ratio))) for _, column, ratio in rows] == EXPECTED
    times = [finished for finished, _, _ in rows]
    assert times[0] == times[1] == times[2] < times[3] == times[4] == times[5]


def test_every_dialect_has_its_query() -> None:
    for dialect in LABELS:
        assert "finished_at" in chart_query(dialect, "runs")


"""The warehouse writer on Snowflake (fakesnow over the connector's HTTP protocol).

Each test runs the real snowflake-sqlalchemy engine and connector against the fakesnow server:
MERGE, VARIANT by PARSE_JSON, TIMESTAMP_TZ, identifier folding, staging by multi-row INSERT.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from fakesnow_support import fakesnow_server, snowflake_url  # noqa: F401 - fixtures
from whhelpers import T0, T1, T2, make_record, run_info, statements, write

from airflow_provider_bos.exceptions import BosIdentifierError
from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.tables.schema import rejects_table_name

pytestmark = pytest.mark.snowflake


@pytest.fixture()
def sf_writer(sf_engine: sa.Engine, unique_table: str) -> Iterator[WarehouseWriter]:
    writer = WarehouseWriter(sf_engine, table=unique_table, audit_table=f"{unique_table}_runs")
    yield writer
    with sf_engine.begin() as conn:
        for name in (unique_table, f"{unique_table}_runs", rejects_table_name(unique_table)):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")


def _select(engine: sa.Engine, sql: str) -> list[dict[str, Any]]:
    # Plain SQL, not reflection: fakesnow answers snowflake-sqlalchemy's schema-wide column query
    # only for some schemas. Snowflake reports unquoted names upper-cased.
    with engine.connect() as conn:
        return [{k.lower(): v for k, v in r._mapping.items()} for r in conn.exec_driver_sql(sql)]


def rows_by_ref(engine: sa.Engine, table: str) -> dict[str, dict[str, Any]]:
    return {r["record_ref"]: r for r in _select(engine, f"SELECT * FROM {table}")}


def _audit(engine: sa.Engine, table: str) -> list[dict[str, Any]]:
    return _select(engine, f"SELECT * FROM {table}_runs ORDER BY finished_at")


def test_first_sync_lands_variant_json_and_timestamp_tz(sf_writer: WarehouseWriter, sf_engine: sa.Engine,
                                                        unique_table: str) -> None:
    counts = write(sf_writer, [make_record(i) for i in range(3)])
    assert (counts.inserted, counts.updated, counts.unchanged) == (3, 0, 0)
    with sf_engine.connect() as conn:
        types = {r[0].lower(): r[1] for r in conn.exec_driver_sql(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s",
            (unique_table.upper(),))}
        # JSON is VARIANT: a path into it works in SQL.
        dept = conn.exec_driver_sql(
            f"SELECT attributes:dept::VARCHAR FROM {unique_table} ORDER BY record_ref LIMIT 1").scalar()
    assert types["attributes"] == "VARIANT" and types["_bos_observed_at"] == "TIMESTAMP_TZ"
    assert dept == "eng"
    rows = rows_by_ref(sf_engine, unique_table)
    row = rows["bos:person:000000"]
    assert json.loads(row["sources"])[0]["source_identity"] == "crm-eu"
    assert row["_bos_observed_at"] == datetime(2026, 10, 8, 12, tzinfo=UTC)
    assert row["lifecycle"] is not None and row["identity_match"] is None


def test_unquoted_lower_case_name_is_the_upper_case_table(sf_writer: WarehouseWriter, sf_engine: sa.Engine,
                                                           unique_table: str) -> None:
    write(sf_writer, [make_record(1)])
    with sf_engine.connect() as conn:
        # What a Snowflake user types: unquoted, any case, or the folded name quoted.
        assert conn.exec_driver_sql(f"SELECT COUNT(*) FROM {unique_table.upper()}").scalar() == 1
        assert conn.exec_driver_sql(f'SELECT COUNT(*) FROM "{unique_table.upper()}"').scalar() == 1
        names = [r[0] for r in conn.exec_driver_sql(
            "SELECT table_name FROM information_schema.tables WHERE table_name ILIKE %s", (unique_table,))]
    assert names == [unique_table.upper()]


def test_mixed_case_name_is_quoted_and_case_sensitive(sf_engine: sa.Engine, unique_table: str) -> None:
    name = "Mixed_" + unique_table
    writer = WarehouseWriter(sf_engine, table=name, audit_table=f"{unique_table}_runs")
    try:
        write(writer, [make_record(1)])
        with sf_engine.connect() as conn:
            assert conn.exec_driver_sql(f'SELECT COUNT(*) FROM "{name}"').scalar() == 1
            found = [r[0] for r in conn.exec_driver_sql(
                "SELECT table_name FROM information_schema.tables WHERE table_name = %s", (name,))]
        assert found == [name]
    finally:
        with sf_engine.begin() as conn:
            conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{name}"')
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {unique_table}_runs")


def test_invalid_identifier_is_refused_before_any_sql(sf_engine: sa.Engine) -> None:
    with pytest.raises(BosIdentifierError):
        WarehouseWriter(sf_engine, table='x"; DROP TABLE y')


def test_unchanged_rerun_rewrites_nothing(sf_writer: WarehouseWriter, sf_engine: sa.Engine, unique_table: str) -> None:
    records = [make_record(i) for i in range(5)]
    write(sf_writer, records)
    before = rows_by_ref(sf_engine, unique_table)
    with statements(sf_engine) as seen:
        counts = write(sf_writer, records, run=run_info())
    assert (counts.inserted, counts.updated, counts.unchanged) == (0, 0, 5)
    assert not [s for s in seen if s.lstrip().upper().startswith("MERGE")]  # no merge ran at all
    after = rows_by_ref(sf_engine, unique_table)
    assert {k: v["_bos_run_id"] for k, v in after.items()} == {k: v["_bos_run_id"] for k, v in before.items()}


def test_update_and_stale_guard(sf_writer: WarehouseWriter, sf_engine: sa.Engine, unique_table: str) -> None:
    write(sf_writer, [make_record(1, T1), make_record(2, T1)])
    counts = write(sf_writer, [make_record(1, T2, name="Newer"), make_record(2, T0, name="Older")], run=run_info())
    assert (counts.inserted, counts.updated, counts.unchanged, counts.skipped_stale) == (0, 1, 0, 1)
    rows = rows_by_ref(sf_engine, unique_table)
    assert rows["bos:person:000001"]["display_name"] == "Newer"
    assert rows["bos:person:000002"]["display_name"] == "Person 2"  # the older copy never overwrote it


def test_duplicates_in_one_result_latest_wins(sf_writer: WarehouseWriter, sf_engine: sa.Engine,
                                              unique_table: str) -> None:
    write(sf_writer, [make_record(9, T0)])
    records = [make_record(1, T1, name="a"), make_record(1, T2, name="b"), make_record(1, T2, name="c"),
               make_record(9, T2, name="z"), make_record(9, T1, name="y")]
    counts = write(sf_writer, records, run=run_info())
    assert (counts.inserted, counts.updated, counts.duplicates) == (1, 1, 3)
    rows = rows_by_ref(sf_engine, unique_table)
    assert rows["bos:person:000001"]["display_name"] == "c"  # a tie goes to the last occurrence
    assert rows["bos:person:000009"]["display_name"] == "z"


def test_records_and_audit_row_commit_together(sf_writer: WarehouseWriter, sf_engine: sa.Engine,
                                               unique_table: str) -> None:
    write(sf_writer, [make_record(1)])

    def broken() -> Iterator[dict[str, Any]]:
        yield make_record(2)
        raise RuntimeError("stream ended early")

    with pytest.raises(RuntimeError):
        write(sf_writer, broken(), run=run_info())  # type: ignore[arg-type]
    # A failure in the audit fields after every record was staged: nothing of the run stays.
    with pytest.raises(Exception, match="status"):
        write(sf_writer, [make_record(3)], run=run_info(), status="nonsense")
    assert set(rows_by_ref(sf_engine, unique_table)) == {"bos:person:000001"}
    audit = _audit(sf_engine, unique_table)
    assert len(audit) == 1 and audit[0]["status"] == "complete" and audit[0]["inserted"] == 1
    assert json.loads(audit[0]["source_summary"]) == [{"source": "crm/crm-eu", "pages": 1}]
    with sf_engine.connect() as conn:  # no staging table left behind in the pooled session
        left = conn.exec_driver_sql("SELECT COUNT(*) FROM information_schema.tables "
                                    "WHERE table_name ILIKE 'bos_stage_%'").scalar()
    assert left == 0


def test_quarantine_puts_bad_records_in_the_rejects_table(sf_writer: WarehouseWriter, sf_engine: sa.Engine,
                                                          unique_table: str) -> None:
    bad = make_record(2)
    bad["record_ref"] = "x" * 600  # longer than the key column
    counts = write(sf_writer, [make_record(1), bad], invalid_records="quarantine")
    assert counts.inserted == 1 and counts.rejected == 1
    rows = _select(sf_engine, f"SELECT * FROM {rejects_table_name(unique_table)}")
    assert len(rows) == 1 and "record_ref" in rows[0]["reason"] and bytes(rows[0]["record"]).startswith(b"{")
    audit = _audit(sf_engine, unique_table)
    assert audit[0]["status"] == "partial" and audit[0]["rejected"] == 1


def test_failure_row_in_its_own_transaction(sf_writer: WarehouseWriter, sf_engine: sa.Engine,
                                            unique_table: str) -> None:
    run = run_info()
    sf_writer.record_failure(run, error="boom")
    sf_writer.record_failure(run, error="boom again")
    audit = _audit(sf_engine, unique_table)
    assert [(a["status"], a["error_message"]) for a in audit] == [("failed", "boom again")]


def test_the_audit_row_counts_coverage_also_for_an_unchanged_rerun(sf_writer: WarehouseWriter,
                                                                   sf_engine: sa.Engine, unique_table: str) -> None:
    records = [make_record(i, email=None if i < 3 else f"p{i}@example.com", phone="+49 30 1" if i < 4 else None,
                           name="" if i == 9 else f"Person {i}") for i in range(10)]
    write(sf_writer, records)
    write(sf_writer, records)  # unchanged: every record counted unchanged, none rewritten
    write(sf_writer, records[:6], status="partial", completeness="partial")
    coverages = [json.loads(a["coverage"]) if isinstance(a["coverage"], str) else a["coverage"]
                 for a in _audit(sf_engine, unique_table)]
    assert coverages[0] == coverages[1] == {"records": 10, "columns": {"display_name": 9, "email": 7, "phone": 4}}
    assert coverages[2] == {"records": 6, "columns": {"display_name": 6, "email": 3, "phone": 4}}


def test_the_documented_coverage_chart_query_runs(sf_writer: WarehouseWriter, sf_engine: sa.Engine) -> None:
    from test_coverage_chart import EXPECTED, chart_query, write_runs

    write_runs(sf_writer)
    with sf_engine.connect() as conn:
        rows = conn.exec_driver_sql(chart_query("snowflake", sf_writer.audit_table)).all()
    assert [(column, pytest.approx(float(ratio))) for _, column, ratio in rows] == EXPECTED

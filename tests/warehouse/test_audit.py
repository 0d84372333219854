"""The audit table: failed rows, and AuditReader's latest_run / get_run on every dialect."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from whhelpers import make_record, run_info, write

from airflow_provider_bos.warehouse import AuditReader


def test_record_failure_writes_a_failed_row(writer, engine):
    run = run_info()
    summary = [{"source": {"source_type": "crm", "source_identity": "crm-eu"}, "pages": 2, "status": "running"}]
    writer.record_failure(run, error="stream ended " + "x" * 10_000, source_summary=summary,
                          provisional_records=150, provisional_pages=2)
    row = AuditReader(engine, table=writer.audit_table).get_run(run.run_id)
    assert row["status"] == "failed"
    assert row["error_message"].startswith("stream ended") and len(row["error_message"]) == 4000
    assert row["source_summary"] == summary
    assert (row["provisional_records"], row["provisional_pages"]) == (150, 2)
    assert row["inserted"] is None and row["result_count"] is None
    assert row["conn_id"] == "bos_default" and row["tool_name"] == "people.search"
    assert row["finished_at"].tzinfo is not None
    # the records table was created but nothing was written to it
    with engine.connect() as conn:
        assert conn.exec_driver_sql(f"SELECT COUNT(*) FROM {writer.table}").scalar_one() == 0

    writer.record_failure(run, error="second attempt", source_summary=None)
    assert AuditReader(engine, table=writer.audit_table).get_run(run.run_id)["error_message"] == "second attempt"


def test_record_failure_does_not_overwrite_a_committed_run(writer, engine):
    run = run_info()
    write(writer, [make_record(1)], run)
    writer.record_failure(run, error="late failure")
    row = AuditReader(engine, table=writer.audit_table).get_run(run.run_id)
    assert row["status"] == "complete" and row["error_message"] is None


def test_run_row_holds_everything_the_sensor_reads(writer, engine):
    run = run_info(started_at="2026-10-08T11:59:00+02:00")
    errors = [{"source": {"source_type": "hr", "source_identity": "hr-main"}, "error": {"code": "source_timeout"}}]
    write(writer, [make_record(1), make_record(2)], run, status="partial", completeness="partial",
          result_count=2, source_errors=errors, provisional_records=7, provisional_pages=3)
    row = AuditReader(engine, table=writer.audit_table).get_run(run.run_id)
    assert row["status"] == "partial" and row["completeness"] == "partial"
    assert row["source_errors"] == errors
    assert row["started_at"] == datetime(2026, 10, 8, 9, 59, tzinfo=UTC)
    assert row["finished_at"] >= row["started_at"]
    assert (row["result_count"], row["inserted"], row["provisional_records"], row["provisional_pages"]) == (2, 2, 7, 3)
    assert AuditReader(engine, table=writer.audit_table).get_run("no-such-run") is None


def test_latest_run_semantics(writer, engine):
    reader = AuditReader(engine, table=writer.audit_table)
    assert reader.latest_run("bos_default", "ctx-1", "people.search") is None

    first = run_info()
    write(writer, [make_record(1)], first)
    partial = run_info()
    write(writer, [make_record(2)], partial, status="partial", completeness="partial")
    other_tool = run_info(tool_name="other.tool")
    write(writer, [], other_tool)
    other_ctx = run_info(context_handle="ctx-2")
    writer.record_failure(other_ctx, error="boom")
    failed = run_info()
    writer.record_failure(failed, error="boom")

    latest = reader.latest_run("bos_default", "ctx-1", "people.search")
    assert latest["run_id"] == failed.run_id
    assert reader.latest_run("bos_default", "ctx-1", "people.search", status="complete")["run_id"] == first.run_id
    assert reader.latest_run(
        "bos_default", "ctx-1", "people.search", statuses=["complete", "partial"]
    )["run_id"] == partial.run_id
    assert reader.latest_run("bos_default", "ctx-1", "other.tool")["run_id"] == other_tool.run_id
    assert reader.latest_run("bos_default", "ctx-2", "people.search")["run_id"] == other_ctx.run_id
    assert reader.latest_run("other_conn", "ctx-1", "people.search") is None
    # None means "any": the default context's runs are found whatever handle they resolved to
    assert reader.latest_run("bos_default", None, "people.search")["run_id"] == failed.run_id
    assert reader.latest_run("bos_default", None, "people.search", status="partial")["run_id"] == partial.run_id
    assert AuditReader(engine, audit_table=writer.audit_table).get_run(first.run_id)["status"] == "complete"

    partial_done = reader.get_run(partial.run_id)["finished_at"]
    since_partial = reader.latest_run("bos_default", "ctx-1", "people.search", status="partial", since=partial_done)
    assert since_partial["run_id"] == partial.run_id
    assert reader.latest_run(
        "bos_default", "ctx-1", "people.search", status=("complete",), since=partial_done
    ) is None
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert reader.latest_run("bos_default", "ctx-1", "people.search", since=future) is None

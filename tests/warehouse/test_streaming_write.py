"""write_run(audit=...): audit fields known only after the records are consumed (streamed reads).

Every dialect (``warehouse_url``): records are staged first, THEN audit() runs inside the same
transaction; an exception from the iterator or from audit() rolls everything back.
"""

from __future__ import annotations

from typing import Any

import pytest
from whhelpers import dump, make_record, run_info

from airflow_provider_bos.exceptions import BosIncompleteStreamError, BosResultError
from airflow_provider_bos.mcp.final_frame import WireRecord
from airflow_provider_bos.warehouse import AuditReader, record_to_row
from airflow_provider_bos.wire import WriteOptions


def _audit_rows(engine: Any, writer: Any) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql(f"SELECT COUNT(*) FROM {writer.audit_table}").scalar_one()


def test_audit_callable_runs_after_the_records_and_fills_the_audit_row(writer, engine):
    consumed: list[int] = []

    def records():
        for i in range(5):
            consumed.append(i)
            yield WireRecord(make_record(i))

    calls: list[int] = []
    run = run_info(context_handle=None)

    def audit() -> dict[str, Any]:
        calls.append(len(consumed))  # every record was consumed before
        run.context_handle = "ctx-late"
        return {"completeness": "partial", "status": "partial", "result_count": 5,
                "source_errors": [{"source": {"source_type": "hr", "source_identity": "hr-main"},
                                   "error": {"code": "source_timeout"}}],
                "source_summary": [{"source": "crm/crm-eu"}], "provisional_records": 7, "provisional_pages": 2}

    counts = writer.write_run(run, records(), WriteOptions(audit=audit))
    assert calls == [5] and counts.inserted == 5
    row = AuditReader(engine, table=writer.audit_table).get_run(run.run_id)
    assert row["status"] == "partial" and row["completeness"] == "partial" and row["result_count"] == 5
    assert row["context_handle"] == "ctx-late" and row["provisional_records"] == 7
    assert len(dump(engine, writer.table)) == 5


def test_iterator_failing_midway_leaves_table_and_audit_untouched(writer, engine):
    writer.write_run(run_info(), [make_record(1)],
                     WriteOptions(audit={"completeness": "complete", "status": "complete", "result_count": 1}))
    before = dump(engine, writer.table)
    audits = _audit_rows(engine, writer)

    def records():
        yield WireRecord(make_record(2))
        raise BosIncompleteStreamError("the stream ended inside the final frame")

    called = []
    with pytest.raises(BosIncompleteStreamError):
        writer.write_run(run_info(), records(), WriteOptions(audit=lambda: called.append(1) or {"status": "complete"}))
    assert called == []
    assert dump(engine, writer.table) == before and _audit_rows(engine, writer) == audits


def test_audit_raising_rolls_back(writer, engine):
    writer.ensure_tables()
    before = dump(engine, writer.table)

    def audit() -> dict[str, Any]:
        raise BosResultError("Unknown completeness 'mostly' in the final result.")

    with pytest.raises(BosResultError, match="mostly"):
        writer.write_run(run_info(), [WireRecord(make_record(i)) for i in range(3)], WriteOptions(audit=audit))
    assert dump(engine, writer.table) == before and _audit_rows(engine, writer) == 0


def test_wire_records_land_exactly_like_dicts(make_writer, engine, unique_table):
    records = [make_record(i, attributes={"f": 1e-7, "g": 0.5, "t": "re-hire", "n": [1, {"b": 2, "a": 1}]})
               for i in range(3)] + [make_record(9, name="Zoë \\ \"q\"\t😀")]
    assert [record_to_row(WireRecord(r)) for r in records] == [record_to_row(r) for r in records]
    plain = make_writer()
    wire = make_writer(table=unique_table + "w", audit_table=unique_table + "w_runs")
    audit = WriteOptions(audit={"completeness": "complete", "status": "complete", "result_count": 4})
    plain.write_run(run_info(), records, audit)
    wire.write_run(run_info(), [WireRecord(r) for r in records], audit)

    def content(table: str) -> list[tuple[str, ...]]:
        return [row[:9] + row[11:] for row in dump(engine, table)]  # all but _bos_synced_at / _bos_run_id

    assert content(plain.table) == content(wire.table)

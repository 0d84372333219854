"""The audit row keeps information apart from errors: ``notes`` for what a run says for information,
``error_message`` only for why a run failed or is partial; an audit table made before ``notes`` gets
it in place on the next run, on every dialect."""

from __future__ import annotations

from typing import Any

import pytest
from fakesnow_support import fakesnow_server, sf_writer, snowflake_url  # noqa: F401 - fixtures

from airflow_provider_bos.warehouse import AuditReader
from airflow_provider_bos.warehouse.dialects import dialect_for
from airflow_provider_bos.warehouse.run.audit import audit_insert, utcnow
from airflow_provider_bos.warehouse.run.audit_fields import partial_with, with_note
from airflow_provider_bos.warehouse.tables.attribute_columns import check_attribute_columns
from airflow_provider_bos.warehouse.tables.schema import ADDED_AUDIT_COLUMNS, NOTES_COLUMN
from tests.warehouse.whhelpers import drop_columns, make_record, run_info, write

WRONG_TYPE = check_attribute_columns({"department": "attributes.department"}, type_errors="null")


def _with_a_wrong_type(i: int) -> dict[str, Any]:
    """A record whose promoted attribute has the wrong type: stored as NULL, the run noted (not failed)."""
    return make_record(i, attributes={"department": True})


def test_a_complete_runs_note_goes_to_notes_and_leaves_error_message_empty(make_writer, engine) -> None:
    writer = make_writer()
    run = run_info()
    write(writer, [_with_a_wrong_type(1), make_record(2)], run, attribute_columns=WRONG_TYPE)

    row = AuditReader(engine, table=writer.audit_table).get_run(run.run_id)
    assert row["status"] == "complete"
    assert "1 promoted attribute value(s) of the wrong type were stored as NULL" in row["notes"]
    assert row["error_message"] is None


def test_a_partial_runs_cause_stays_in_error_message_and_its_notes_in_notes(make_writer, engine) -> None:
    writer = make_writer()
    run = run_info()
    write(writer, [make_record(1)], run, status="partial", completeness="partial",
          error_message="The final result contradicts itself.", notes="Re-hashed 3 rows once.")

    row = AuditReader(engine, table=writer.audit_table).get_run(run.run_id)
    assert (row["status"], row["error_message"], row["notes"]) == (
        "partial", "The final result contradicts itself.", "Re-hashed 3 rows once.")


def test_an_audit_table_made_before_notes_gets_the_column_on_the_next_run(make_writer, engine, caplog) -> None:
    first = make_writer()
    old = run_info()
    write(first, [make_record(1)], old)
    drop_columns(engine, first.audit_table, (NOTES_COLUMN,))
    reader = AuditReader(engine, table=first.audit_table)
    assert reader.get_run(old.run_id)["notes"] is None  # read without the column

    run = run_info()
    with caplog.at_level("INFO", logger="airflow_provider_bos"):
        write(make_writer(), [_with_a_wrong_type(2)], run, attribute_columns=WRONG_TYPE)
    assert "Added the notes column" in caplog.text
    assert "stored as NULL" in reader.get_run(run.run_id)["notes"]
    assert reader.get_run(old.run_id)["notes"] is None  # earlier rows keep NULL

    again = run_info()  # idempotent: a writer finding the column adds nothing and writes its notes
    caplog.clear()
    with caplog.at_level("INFO", logger="airflow_provider_bos"):
        write(make_writer(), [_with_a_wrong_type(3)], again, attribute_columns=WRONG_TYPE)
    assert "Added the notes column" not in caplog.text
    assert "stored as NULL" in reader.get_run(again.run_id)["notes"]


def test_without_the_column_notes_are_kept_after_the_error(make_writer, engine) -> None:
    """A table the column could not be added to yet (no ALTER privilege): the notes are not lost."""
    writer = make_writer()
    writer.ensure_tables()
    drop_columns(engine, writer.audit_table, (NOTES_COLUMN,))
    run = run_info()
    present = [c for c in ADDED_AUDIT_COLUMNS if c != NOTES_COLUMN]
    statement = audit_insert(dialect_for(engine), writer.audit_table, None, run, status="partial",
                             finished_at=utcnow(), error_message="2 record(s) quarantined.",
                             notes="Re-hashed 3 rows once.", present=present)
    with engine.begin() as conn:
        conn.exec_driver_sql(statement.sql, statement.params)

    row = AuditReader(engine, table=writer.audit_table).get_run(run.run_id)
    assert row["error_message"] == "2 record(s) quarantined. Re-hashed 3 rows once."
    assert row["notes"] is None


def test_notes_and_the_partial_cause_are_kept_apart() -> None:
    audit = {"status": "complete", "error_message": None, "notes": None}
    noted = with_note(with_note(audit, "Re-hashed 3 rows once."), "Filled department: 2.")
    assert noted == {"status": "complete", "error_message": None,
                     "notes": "Re-hashed 3 rows once. Filled department: 2."}
    partial = partial_with(noted, "1 record(s) quarantined.")
    assert (partial["status"], partial["error_message"], partial["notes"]) == (
        "partial", "1 record(s) quarantined.", "Re-hashed 3 rows once. Filled department: 2.")


@pytest.mark.snowflake
def test_on_snowflake_a_table_made_before_notes_gets_it_and_notes_land_there(sf_writer, caplog) -> None:  # noqa: F811
    old = run_info()
    write(sf_writer, [make_record(1)], old)
    with sf_writer.engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {sf_writer.audit_table} DROP COLUMN {NOTES_COLUMN}")

    run = run_info()
    with caplog.at_level("INFO", logger="airflow_provider_bos"):
        write(type(sf_writer)(sf_writer.engine, table=sf_writer.table, audit_table=sf_writer.audit_table),
              [_with_a_wrong_type(2)], run, attribute_columns=WRONG_TYPE)
    assert "Added the notes column" in caplog.text
    row = AuditReader(sf_writer.engine, table=sf_writer.audit_table).get_run(run.run_id)
    assert "stored as NULL" in row["notes"] and row["error_message"] is None


def test_the_sensors_verdict_ends_with_the_notes_of_the_row_it_judged(make_writer, engine) -> None:
    from airflow_provider_bos.sensors.verdict import judge

    writer = make_writer()
    complete, partial = run_info(), run_info()
    write(writer, [_with_a_wrong_type(1)], complete, attribute_columns=WRONG_TYPE)
    write(writer, [make_record(2)], partial, status="partial", completeness="partial",
          error_message="2 record(s) quarantined.", notes="Re-hashed 3 rows once.")
    reader = AuditReader(engine, table=writer.audit_table)

    passed = judge(reader.get_run(complete.run_id))
    assert passed.passed
    assert "is complete with 1 record(s). Notes: 1 promoted attribute value(s) of the wrong type" in passed.message
    held = judge(reader.get_run(partial.run_id))
    assert held.message.endswith("Note: 2 record(s) quarantined. Notes: Re-hashed 3 rows once.")

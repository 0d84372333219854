"""End to end, promoted attributes: the reference server -> the operator in dag.test() -> a database.

A table synced without ``attribute_columns`` is synced again with them: the columns are added and
filled from the stored ``attributes`` (every record arrives unchanged, so no row is rewritten: the
values come from the table), its history versions carry them, and the hashes and sync times stay.
A value of the wrong type fails the run (nothing written), is quarantined in ``<table>_rejects`` with
``invalid_records="quarantine"`` (the run partial, the check failed) or, with
``attribute_type_errors="null"``, is stored as NULL and counted in the task's XCom. A stored value of
the wrong type found when a column is first filled fails that run under ``invalid_records="fail"``
(the column left unfilled), and is stored as NULL and counted otherwise (the run partial under
``"quarantine"``, the row kept in the table).

On every dialect: SQLite in the fast tier, PostgreSQL, MariaDB and DuckDB in the full tier
(Snowflake: tests/airflow/test_snowflake_promoted_e2e.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from afhelpers import audit_rows, every_dialect, task_states, xcom_summary

from airflow_provider_bos.testing.federation import PlannedRead, expected_final
from airflow_provider_bos.warehouse.tables.schema import companion_table_name

pytestmark = [pytest.mark.airflow]

SCENARIO = "people_over_time"
COLUMNS = {
    "department": "attributes.department",
    "fte": {"path": "attributes.employment.fte", "type": "number"},
    "groups": {"path": "attributes.groups", "type": "json"},
}
RUN = {"BOS_TEST_SYNC_MODE": "full", "BOS_TEST_HISTORY": "1"}
PROMOTE = {**RUN, "BOS_TEST_ATTRIBUTE_COLUMNS": json.dumps(COLUMNS)}
QUARANTINE = {"BOS_TEST_INVALID_RECORDS": "quarantine"}
WRONG = "full time"  # what the server sends as one person's fte: not a number


def expected_values() -> dict[str, tuple[Any, Any, Any]]:
    """record_ref -> (department, fte, groups) as the server sends day 1 (None where missing)."""
    values = {}
    for final in expected_final(SCENARIO, 1).records:
        attributes = final.record.get("attributes") or {}
        values[final.record["record_ref"]] = (attributes.get("department"),
                                              (attributes.get("employment") or {}).get("fte"),
                                              attributes.get("groups"))
    return values


def promoted_values(engine: sa.Engine, table: str, where: str = "") -> dict[str, tuple[Any, Any, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT record_ref, department, fte, groups FROM {table}{where}")).all()
    return {ref: (department, None if fte is None else float(fte),
                  json.loads(groups) if isinstance(groups, str) else groups) for ref, department, fte, groups in rows}


def stamps(engine: sa.Engine, table: str) -> dict[str, tuple[Any, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT record_ref, _bos_record_hash, _bos_synced_at FROM {table}")).all()
    return {ref: (h, synced) for ref, h, synced in rows}


def row_count(engine: sa.Engine, table: str) -> int:
    """Rows of ``table`` (0 when it does not exist)."""
    if not sa.inspect(engine).has_table(table):
        return 0
    with engine.connect() as conn:
        return conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one()


def rows_of(engine: sa.Engine, table: str, columns: list[str]) -> dict[str, tuple[str, ...]]:
    """record_ref -> the row's ``columns`` as text, for comparing a table before and after a run."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT {', '.join(columns)} FROM {table}")).mappings().all()
    return {row["record_ref"]: tuple(str(row[c]) for c in columns) for row in rows}


@pytest.fixture()
def promoting(days: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """``days`` with ``edits`` (record_ref -> a function changing what the server sends for it)."""
    edits: dict[str, Callable[[dict[str, Any]], None]] = {}
    final_records = PlannedRead.iter_final_records

    def edited(self: Any) -> Iterator[dict]:
        for record in final_records(self):
            edit = edits.get(record["record_ref"])
            if edit is not None:
                edit(record)
            yield record

    monkeypatch.setattr(PlannedRead, "iter_final_records", edited)
    yield {**days, "edits": edits}
    with days["engine"].begin() as conn:
        for suffix in ("columns", "rejects"):
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {companion_table_name(days['table'], suffix)}"))


@every_dialect
def test_promoting_attributes_of_a_synced_table_fills_them_from_what_is_stored(promoting, run_dag) -> None:
    engine, table = promoting["engine"], promoting["table"]
    first = run_dag("bos_test_days", "bos_test_days.py", **RUN)
    assert task_states(first) == {"sync": "success", "check": "success"}
    before = stamps(engine, table)

    second = run_dag("bos_test_days", "bos_test_days.py", **PROMOTE)
    assert task_states(second) == {"sync": "success", "check": "success"}
    summary = xcom_summary(second)
    # Every record came back unchanged: no row was rewritten, the columns were filled from the table.
    assert (summary["unchanged"], summary["updated"], summary["inserted"]) == (230, 0, 0)
    assert summary["attribute_type_errors"] == 0
    expected = expected_values()
    assert promoted_values(engine, table) == expected
    assert stamps(engine, table) == before  # no hash or sync time rewritten
    history = companion_table_name(table, "history")
    assert promoted_values(engine, history, " WHERE _bos_valid_to IS NULL") == expected

    # A changed record's columns follow it, in the table and in its new history version.
    ref = next(r for r, (department, _, _) in expected.items() if department)
    promoting["edits"][ref] = lambda record: record["attributes"].update(department="Moved")
    third = run_dag("bos_test_days", "bos_test_days.py", **PROMOTE)
    assert task_states(third) == {"sync": "success", "check": "success"}
    assert xcom_summary(third)["updated"] == 1
    assert promoted_values(engine, table)[ref][0] == "Moved"
    assert promoted_values(engine, history, " WHERE _bos_valid_to IS NULL")[ref][0] == "Moved"


@every_dialect
def test_a_promoted_value_of_the_wrong_type_fails_the_run_or_is_stored_as_null(promoting, run_dag) -> None:
    engine, table = promoting["engine"], promoting["table"]
    expected = expected_values()
    ref = next(r for r, (_, fte, _) in expected.items() if fte is not None)
    promoting["edits"][ref] = lambda record: record["attributes"]["employment"].update(fte="full time")

    failed = run_dag("bos_test_days", "bos_test_days.py", **PROMOTE)
    assert task_states(failed)["sync"] == "failed"
    with engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one() == 0

    stored = run_dag("bos_test_days", "bos_test_days.py", **PROMOTE, BOS_TEST_ATTRIBUTE_TYPE_ERRORS="null")
    assert task_states(stored) == {"sync": "success", "check": "success"}
    summary = xcom_summary(stored)
    assert (summary["inserted"], summary["attribute_type_errors"]) == (230, 1)
    values = promoted_values(engine, table)
    assert values[ref] == (expected[ref][0], None, expected[ref][2])
    assert {r: v for r, v in values.items() if r != ref} == {r: v for r, v in expected.items() if r != ref}


def with_wrong_fte(promoting: dict[str, Any]) -> str:
    """Make the server send ``fte`` as text for one person who has a number there; returns the ref."""
    ref = next(r for r, (_, fte, _) in expected_values().items() if fte is not None)
    promoting["edits"][ref] = lambda record: record["attributes"]["employment"].update(fte=WRONG)
    return ref


@every_dialect
def test_a_read_value_of_the_wrong_type_is_quarantined_and_the_check_fails(promoting, run_dag) -> None:
    """``invalid_records="quarantine"``: the record of the wrong type goes to ``<table>_rejects`` with a
    reason naming its column and path (not the value), the rest land filled, and the run is partial."""
    engine, table = promoting["engine"], promoting["table"]
    expected = expected_values()
    ref = with_wrong_fte(promoting)

    dag_run = run_dag("bos_test_days", "bos_test_days.py", **PROMOTE, **QUARANTINE)

    assert task_states(dag_run) == {"sync": "success", "check": "failed"}
    summary = xcom_summary(dag_run)
    assert (summary["status"], summary["rejected"], summary["inserted"]) == ("partial", 1, len(expected) - 1)
    assert summary["attribute_type_errors"] == 0  # quarantined, not stored as NULL
    [audit] = audit_rows(engine, table, promoting["audit"])
    assert (audit["status"], audit["rejected"]) == ("partial", 1)
    assert WRONG not in audit["error_message"]
    assert promoted_values(engine, table) == {r: v for r, v in expected.items() if r != ref}
    with engine.connect() as conn:
        [(kept_ref, reason, record)] = conn.execute(sa.text(
            f"SELECT record_ref, reason, record FROM {companion_table_name(table, 'rejects')}")).all()
    assert kept_ref == ref
    assert "attributes.employment.fte" in reason and "'fte'" in reason and "number" in reason
    assert WRONG not in reason
    assert json.loads(bytes(record))["attributes"]["employment"]["fte"] == WRONG  # the record as it was sent


def synced_with_wrong_fte(promoting: dict[str, Any], run_dag: Callable[..., Any]) -> str:
    """Sync day 1 without promoted columns, one person's ``fte`` sent (and stored) as text; returns the ref."""
    ref = with_wrong_fte(promoting)
    first = run_dag("bos_test_days", "bos_test_days.py", **RUN)
    assert task_states(first) == {"sync": "success", "check": "success"}
    return ref


def column_names(engine: sa.Engine, table: str) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(f"SELECT * FROM {table} WHERE 1 = 0")).keys())


@every_dialect
def test_a_stored_value_of_the_wrong_type_fails_the_first_fill_and_leaves_the_column_unfilled(
        promoting, run_dag) -> None:
    """Promoting a synced table that holds a value of the wrong type, under ``invalid_records="fail"``:
    the run fails naming column, path and count (not the value), every row is as it was, the column is
    NULL everywhere and not marked filled, so a later run (``attribute_type_errors="null"``) fills it."""
    engine, table = promoting["engine"], promoting["table"]
    expected = expected_values()
    ref = synced_with_wrong_fte(promoting, run_dag)
    columns = column_names(engine, table)
    before = rows_of(engine, table, columns)
    assert len(before) == len(expected)

    failed = run_dag("bos_test_days", "bos_test_days.py", **PROMOTE)

    assert task_states(failed) == {"sync": "failed", "check": "upstream_failed"}
    first, audit = audit_rows(engine, table, promoting["audit"])
    assert first["status"] == "complete" and audit["status"] == "failed"
    assert "1 at attributes.employment.fte are not of type number (column 'fte')" in audit["error_message"]
    assert WRONG not in audit["error_message"]
    assert rows_of(engine, table, columns) == before  # nothing written
    with engine.connect() as conn:
        filled = conn.execute(sa.text(f"SELECT COUNT(*) FROM {table} WHERE department IS NOT NULL "
                                      "OR fte IS NOT NULL OR groups IS NOT NULL")).scalar_one()
    assert filled == 0
    assert row_count(engine, companion_table_name(table, "columns")) == 0

    retried = run_dag("bos_test_days", "bos_test_days.py", **PROMOTE, BOS_TEST_ATTRIBUTE_TYPE_ERRORS="null")
    assert task_states(retried) == {"sync": "success", "check": "success"}
    assert promoted_values(engine, table) == {**expected, ref: (expected[ref][0], None, expected[ref][2])}


@every_dialect
def test_a_stored_value_of_the_wrong_type_is_null_and_the_run_partial_under_quarantine(promoting, run_dag) -> None:
    """Promoting a synced table that holds a value of the wrong type, under ``invalid_records="quarantine"``:
    that row's column is NULL (in its history too), every other row is filled as the server sent it, the
    run is partial (the check fails) with the stored value counted in the audit note, and the row stays
    where it is. The record BOS sends again with that value is quarantined, as on any run."""
    engine, table = promoting["engine"], promoting["table"]
    expected = expected_values()
    ref = synced_with_wrong_fte(promoting, run_dag)
    columns = column_names(engine, table)
    before = rows_of(engine, table, columns)

    dag_run = run_dag("bos_test_days", "bos_test_days.py", **PROMOTE, **QUARANTINE)

    assert task_states(dag_run) == {"sync": "success", "check": "failed"}
    audit = audit_rows(engine, table, promoting["audit"])[-1]
    assert audit["status"] == "partial" and "fte: 1" in audit["error_message"]
    assert WRONG not in audit["error_message"]
    wanted = {**expected, ref: (expected[ref][0], None, expected[ref][2])}
    assert promoted_values(engine, table) == wanted
    assert promoted_values(engine, companion_table_name(table, "history"), " WHERE _bos_valid_to IS NULL") == wanted
    assert rows_of(engine, table, columns) == before  # every stored row stays as it was, that one too
    summary = xcom_summary(dag_run)
    # The stored value is in the audit note; the record read again is refused as a read record is.
    assert (summary["status"], summary["attribute_type_errors"], summary["rejected"], summary["unchanged"]) == (
        "partial", 0, 1, len(expected) - 1)
    assert row_count(engine, companion_table_name(table, "rejects")) == 1


@every_dialect
def test_a_stored_value_of_the_wrong_type_is_null_and_counted_with_type_errors_null(promoting, run_dag) -> None:
    """``attribute_type_errors="null"``: promoting a synced table that holds a value of the wrong type
    fills NULL there and the run is complete; the audit note counts the stored value, XCom the record
    read again with it."""
    engine, table = promoting["engine"], promoting["table"]
    expected = expected_values()
    ref = synced_with_wrong_fte(promoting, run_dag)

    dag_run = run_dag("bos_test_days", "bos_test_days.py", **PROMOTE, BOS_TEST_ATTRIBUTE_TYPE_ERRORS="null")

    assert task_states(dag_run) == {"sync": "success", "check": "success"}
    audit = audit_rows(engine, table, promoting["audit"])[-1]
    assert audit["status"] == "complete" and "fte: 1" in audit["notes"] and audit["error_message"] is None
    assert WRONG not in audit["notes"]
    assert promoted_values(engine, table) == {**expected, ref: (expected[ref][0], None, expected[ref][2])}
    summary = xcom_summary(dag_run)
    # XCom counts the run's records: the one read again with the value.
    assert (summary["status"], summary["attribute_type_errors"], summary["rejected"], summary["unchanged"]) == (
        "complete", 1, 0, len(expected))

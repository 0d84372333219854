"""End to end, promoted attributes: the reference server -> the operator in dag.test() -> a database.

A table synced without ``attribute_columns`` is synced again with them: the columns are added and
filled from the stored ``attributes`` (every record arrives unchanged, so no row is rewritten: the
values come from the table), its history versions carry them, and the hashes and sync times stay.
A value of the wrong type fails the run (nothing written) or, with ``attribute_type_errors="null"``,
is stored as NULL and counted in the task's XCom.

On every dialect: SQLite in the fast tier, PostgreSQL, MariaDB and DuckDB in the full tier
(Snowflake: tests/airflow/test_snowflake_promoted_e2e.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from afhelpers import every_dialect, task_states, xcom_summary

from airflow_provider_bos.testing.federation import PlannedRead, expected_final
from airflow_provider_bos.warehouse.schema import companion_table_name

pytestmark = [pytest.mark.airflow]

SCENARIO = "people_over_time"
COLUMNS = {
    "department": "attributes.department",
    "fte": {"path": "attributes.employment.fte", "type": "number"},
    "groups": {"path": "attributes.groups", "type": "json"},
}
RUN = {"BOS_TEST_SYNC_MODE": "full", "BOS_TEST_HISTORY": "1"}
PROMOTE = {**RUN, "BOS_TEST_ATTRIBUTE_COLUMNS": json.dumps(COLUMNS)}


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

"""End to end, identities over time: the reference server's days -> the operator in dag.test() -> a database.

Scenario ``people_over_time``: day 1 230 people; day 2 20 people merged from 40 day-1 records and
10 leavers (200 records); day 3 one merge split back, a joiner, changes (202); day 4 partial. The
expected sets come from the server's own planner (``expected_final``, ``day_changes``).

The DAG runs are on SQLite (the fast tier): they prove the operator's sync modes, the sensor's
verdicts and the counts in XCom and the audit row. Retiring, superseding, splits, the guard, stale
backfills and history are proven on every dialect in tests/warehouse (test_reconcile.py,
test_history.py). The four-day full sync is this file's smoke on every dialect (the server dialects
and DuckDB in the full tier).
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from afhelpers import audit_rows, every_dialect, task_states, xcom_summary

from airflow_provider_bos.testing.federation import day_changes, expected_final
from airflow_provider_bos.testing.scenario import load_scenario
from airflow_provider_bos.warehouse.tables.schema import companion_table_name

pytestmark = pytest.mark.airflow

SCENARIO = "people_over_time"


def rows(env: dict[str, Any]) -> dict[str, dict[str, Any]]:
    with env["engine"].connect() as conn:
        result = conn.execute(sa.text(
            f"SELECT record_ref, _bos_deleted_at, _bos_superseded_by FROM {env['table']}"
        )).mappings()
        return {r["record_ref"]: dict(r) for r in result}


def current(env: dict[str, Any]) -> set[str]:
    return {ref for ref, row in rows(env).items() if row["_bos_deleted_at"] is None}


def lineage(env: dict[str, Any]) -> set[tuple[str, str]]:
    with env["engine"].connect() as conn:
        return {tuple(r) for r in conn.execute(sa.text(
            f"SELECT record_ref, successor_ref FROM {companion_table_name(env['table'], 'lineage')}"
        ))}


def run_day(env: dict[str, Any], run_dag: Any, day: int, **settings: str) -> Any:
    env["server"].set_day(day)
    return run_dag("bos_test_days", "bos_test_days.py", **settings)


@every_dialect
def test_a_full_sync_over_four_days_retires_leavers_and_follows_merges_and_splits(days, run_dag) -> None:
    settings = {"BOS_TEST_SYNC_MODE": "full", "BOS_TEST_HISTORY": "1"}
    first = run_day(days, run_dag, 1, **settings)
    assert task_states(first) == {"sync": "success", "check": "success"}
    assert current(days) == expected_final(SCENARIO, 1).refs and len(current(days)) == 230

    second = run_day(days, run_dag, 2, **settings)
    assert task_states(second) == {"sync": "success", "check": "success"}
    changes = day_changes(SCENARIO, 2)
    assert current(days) == expected_final(SCENARIO, 2).refs and len(rows(days)) == 250
    table = rows(days)
    for new, olds in changes.merged.items():
        assert all(table[old]["_bos_superseded_by"] == new for old in olds)
    for leaver in changes.left:
        assert table[leaver]["_bos_deleted_at"] is not None and table[leaver]["_bos_superseded_by"] is None
    assert lineage(days) == {(old, new) for new, olds in changes.merged.items() for old in olds}
    summary = xcom_summary(second)
    assert (summary["superseded"], summary["retired"], summary["status"]) == (40, 10, "complete")

    third = run_day(days, run_dag, 3, **settings)
    assert task_states(third) == {"sync": "success", "check": "success"}
    split = day_changes(SCENARIO, 3).split
    assert len(split) == 1 and current(days) == expected_final(SCENARIO, 3).refs
    [(merged, people)] = split.items()
    assert rows(days)[merged]["_bos_superseded_by"] == min(people)  # both are back, current again
    assert {(merged, p) for p in people} <= lineage(days)

    before = current(days)
    fourth = run_day(days, run_dag, 4, **settings)
    assert task_states(fourth)["check"] == "failed"  # partial: the sensor stops it
    assert current(days) == before  # a partial read retires and supersedes nothing
    audits = audit_rows(days["engine"], days["table"], days["audit"])
    assert [(a["status"], a["retired"], a["superseded"]) for a in audits] == [
        ("complete", 0, 0), ("complete", 10, 40), ("complete", 0, 1), ("partial", 0, 0),
    ]
    assert "Nothing was retired" in audits[-1]["notes"]
    with days["engine"].connect() as conn:
        open_versions = set(conn.execute(sa.text(
            f"SELECT record_ref FROM {companion_table_name(days['table'], 'history')} WHERE _bos_valid_to IS NULL"
        )).scalars())
    assert open_versions == current(days)


def test_a_late_backfill_of_day_one_does_not_undo_day_two(days, run_dag) -> None:
    """Day 1's read re-run after day 2's (a backfill, or a retry that came late): the server answers
    with day 1's population and observation time; the people day 2 merged away or saw leave stay
    retired and day 2's merged records stay current."""
    settings = {"BOS_TEST_SYNC_MODE": "full"}
    run_day(days, run_dag, 1, **settings)
    run_day(days, run_dag, 2, **settings)
    after_day_two = rows(days)
    late = run_day(days, run_dag, 1, **settings)
    assert task_states(late)["sync"] == "success"
    assert current(days) == expected_final(SCENARIO, 2).refs
    assert rows(days) == after_day_two
    summary = xcom_summary(late)
    changes = day_changes(SCENARIO, 2)
    retired_by_day_two = len(changes.left) + sum(len(olds) for olds in changes.merged.values())
    assert (summary["retired"], summary["superseded"], summary["skipped_stale"]) == (0, 0, retired_by_day_two)


def test_the_hourly_incremental_sync_does_not_double_count_a_merged_person(days, run_dag) -> None:
    run_day(days, run_dag, 1)
    second = run_day(days, run_dag, 2)
    changes = day_changes(SCENARIO, 2)
    merged_away = {old for olds in changes.merged.values() for old in olds}
    assert current(days) == (expected_final(SCENARIO, 2).refs | set(changes.left))  # leavers stay
    assert merged_away.isdisjoint(current(days))
    assert (xcom_summary(second)["superseded"], xcom_summary(second)["retired"]) == (40, 0)


def test_an_empty_complete_read_is_stopped_by_the_guard(days, run_dag) -> None:
    run_day(days, run_dag, 1, BOS_TEST_SYNC_MODE="full")
    empty = load_scenario(SCENARIO).model_copy(update={"days": [], "observed_at": "2026-11-20T06:00:00Z"})
    empty = empty.model_copy(update={"sources": [s.model_copy(update={"records": 0}) for s in empty.sources],
                                     "shared_people": 0})
    days["server"].set_scenario(empty)
    dag_run = run_dag("bos_test_days", "bos_test_days.py", BOS_TEST_SYNC_MODE="full")
    assert task_states(dag_run) == {"sync": "success", "check": "failed"}
    assert len(current(days)) == 230  # nothing retired
    summary = xcom_summary(dag_run)
    assert (summary["status"], summary["retired"], summary["retire_withheld"]) == ("partial", 0, 230)
    audit = audit_rows(days["engine"], days["table"], days["audit"])[-1]
    assert "230 of its scope's 230 current rows" in audit["error_message"]
    assert "max_retire_fraction=0.5" in audit["error_message"]


def test_the_sensor_fails_a_run_that_retired_more_than_max_retired(days, run_dag) -> None:
    run_day(days, run_dag, 1, BOS_TEST_SYNC_MODE="full")
    dag_run = run_day(days, run_dag, 2, BOS_TEST_SYNC_MODE="full", BOS_TEST_MAX_RETIRED="20")
    assert task_states(dag_run) == {"sync": "success", "check": "failed"}  # 10 retired + 40 superseded
    assert xcom_summary(dag_run)["retired"] == 10

"""End to end, a change is a change of content: the reference server re-stamps every provenance entry on
every read (as the contract's example does) -> the operator in dag.test() -> a database.

Scenario ``people_over_time`` (see tests/airflow/test_identities_over_time.py): day 1 230 people; day 2
20 merges of 40 day-1 records and 10 leavers; day 3 a split, a joiner, 3 changes; day 4 partial. The
expected sets come from the server's own planner (``expected_final``, ``day_changes``).

Each behaviour runs on every dialect: SQLite in the fast tier, the server dialects and DuckDB in the
full tier (their SQL is also proven on every dialect in tests/warehouse/test_content_changes.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from afhelpers import audit_rows, every_dialect, table_dump, task_states, xcom_summary

from airflow_provider_bos.testing.federation import day_changes, expected_final
from airflow_provider_bos.testing.scenario import load_scenario
from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.tables.records import parse_timestamp
from airflow_provider_bos.warehouse.tables.schema import companion_table_name

pytestmark = pytest.mark.airflow

SCENARIO = "people_over_time"
FULL = {"BOS_TEST_SYNC_MODE": "full", "BOS_TEST_HISTORY": "1"}


def run_day(env: dict[str, Any], run_dag: Any, day: int, **settings: str) -> Any:
    env["server"].set_day(day)
    return run_dag("bos_test_days", "bos_test_days.py", **settings)


def versions(env: dict[str, Any]) -> int:
    with env["engine"].connect() as conn:
        return int(conn.execute(sa.text(
            f"SELECT COUNT(*) FROM {companion_table_name(env['table'], 'history')}")).scalar_one())


def lifecycle(env: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    with env["engine"].connect() as conn:
        return {r[0]: (r[1], r[2]) for r in conn.execute(sa.text(
            f"SELECT record_ref, _bos_deleted_at, _bos_superseded_by FROM {env['table']}"))}


def current(env: dict[str, Any]) -> set[str]:
    return {ref for ref, (deleted, _) in lifecycle(env).items() if deleted is None}


@every_dialect
def test_a_re_read_that_only_moved_observations_rewrites_nothing(days, run_dag) -> None:
    first = run_day(days, run_dag, 1, **FULL)
    assert task_states(first) == {"sync": "success", "check": "success"}
    before, history = table_dump(days["engine"], days["table"]), versions(days)
    # The same day read again a few minutes later: every provenance observed_at is new, nothing else.
    again = run_day(days, run_dag, 1, **FULL)
    summary = xcom_summary(again)
    assert (summary["inserted"], summary["updated"], summary["unchanged"]) == (0, 0, 230)
    # (This read is small enough to be answered whole, so nothing is skipped undecoded here; that the
    # wire-hash shortcut survives re-stamped records is tests/warehouse/test_known_records_e2e.py's.)
    assert table_dump(days["engine"], days["table"]) == before  # no row rewritten, _bos_synced_at included
    assert versions(days) == history == 230
    # Day 2: the 20 merged records are new, 40 superseded, 10 retired; the 180 untouched are unchanged.
    second = run_day(days, run_dag, 2, **FULL)
    summary = xcom_summary(second)
    assert (summary["inserted"], summary["updated"], summary["unchanged"]) == (20, 0, 180)
    assert (summary["superseded"], summary["retired"]) == (40, 10)
    assert versions(days) == 230 + 20
    # When was each person last confirmed? Day 2's complete read, for every current row.
    audits = audit_rows(days["engine"], days["table"], days["audit"])
    observed = expected_final(SCENARIO, 2).observed_at
    assert parse_timestamp(audits[-1]["confirmed_at"]) == observed
    writer = WarehouseWriter(days["engine"], table=days["table"], audit_table=days["audit"])
    confirmed = writer.last_confirmed()
    assert set(confirmed) == expected_final(SCENARIO, 2).refs
    assert set(confirmed.values()) == {observed}


@every_dialect
def test_a_partial_read_revives_nothing_a_complete_read_merged_away(days, run_dag) -> None:
    run_day(days, run_dag, 1, **FULL)
    run_day(days, run_dag, 2, **FULL)
    table = lifecycle(days)
    merged_away = {ref for ref, (deleted, successor) in table.items()
                   if successor is not None and table[successor][0] is None}
    returned_again = merged_away & expected_final(SCENARIO, 4).refs
    assert returned_again, "day 4's partial read returns fragments under refs day 2 merged away"
    partial = run_day(days, run_dag, 4, **FULL)
    assert task_states(partial)["check"] == "failed"  # partial: the sensor stops it
    assert merged_away.isdisjoint(current(days)), "no person is counted twice"
    summary = xcom_summary(partial)
    assert summary["withheld"] == len(returned_again)
    audit = audit_rows(days["engine"], days["table"], days["audit"])[-1]
    assert audit["withheld"] == len(returned_again) and "merged away" in audit["notes"]
    assert audit["confirmed_at"] is None


@every_dialect
def test_an_older_read_changes_nothing_a_newer_complete_read_confirmed(days, run_dag) -> None:
    """Day 3's complete read, then day 2's read arriving late (a backfill): day 3 confirmed every
    current row without rewriting it, and the late read changes, retires and supersedes none of them."""
    run_day(days, run_dag, 1, **FULL)
    run_day(days, run_dag, 3, **FULL)
    after_day_three = table_dump(days["engine"], days["table"])
    late = run_day(days, run_dag, 2, **FULL)
    assert task_states(late)["sync"] == "success"
    assert table_dump(days["engine"], days["table"]) == after_day_three
    summary = xcom_summary(late)
    assert (summary["inserted"], summary["updated"], summary["retired"], summary["superseded"]) == (0, 0, 0, 0)
    assert current(days) == expected_final(SCENARIO, 3).refs
    changes = day_changes(SCENARIO, 3)
    assert summary["skipped_stale"] >= len(changes.changed)  # day 2's older content of day 3's changes


def test_the_reference_server_re_stamps_every_read_by_default() -> None:
    from airflow_provider_bos.testing.federation import plan_read

    scenario = load_scenario(SCENARIO)
    reads = [plan_read(scenario, request_id=1, context={}, arguments={}, day=1, read_index=i) for i in (0, 1)]
    stamps = [{e["observed_at"] for r in read.iter_final_records() for e in r["sources"]} for read in reads]
    assert stamps[0].isdisjoint(stamps[1])
    kept = scenario.model_copy(update={"provenance_stamps": "last_change"})
    same = [list(plan_read(kept, request_id=1, context={}, arguments={}, day=1, read_index=i).iter_final_records())
            for i in (0, 1)]
    assert same[0] == same[1]
    assert datetime.fromisoformat(reads[1].final_metadata["observed_at"]) > datetime.fromisoformat(
        reads[0].final_metadata["observed_at"])

"""End to end, the provenance table: the reference server's days -> the operator in dag.test() -> a database.

Scenario ``people_over_time`` (see test_identities_over_time.py): day 2 merges 40 day-1 records into
20 and retires 10 leavers, day 3 splits one merge back. After every day ``<table>_sources`` holds
exactly the entries of the records table's ``sources`` JSON, current as their rows are, and "which
current record holds this source's id?" is answered by that table alone.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from afhelpers import every_dialect, task_states, xcom_summary

from airflow_provider_bos.testing.federation import day_changes, expected_final
from airflow_provider_bos.warehouse.tables.schema import companion_table_name

pytestmark = pytest.mark.airflow

SCENARIO = "people_over_time"
FULL = {"BOS_TEST_SYNC_MODE": "full"}


def _text(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def entries_of_the_records(env: dict[str, Any]) -> set[tuple[str, int, str, str, str, bool]]:
    with env["engine"].connect() as conn:
        rows = conn.execute(sa.text(
            f"SELECT record_ref, sources, CASE WHEN _bos_deleted_at IS NULL THEN 1 ELSE 0 END AS live "
            f"FROM {env['table']}")).all()
    return {(ref, i, e["source_type"], e["source_identity"], e["external_id"], bool(live))
            for ref, sources, live in rows for i, e in enumerate(_text(sources))}


def provenance_rows(env: dict[str, Any]) -> set[tuple[str, int, str, str, str, bool]]:
    with env["engine"].connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT record_ref, entry_index, source_type, source_identity, external_id, "
            f"CASE WHEN is_current THEN 1 ELSE 0 END FROM {companion_table_name(env['table'], 'sources')}")).all()
    return {(ref, int(i), st, si, ei, bool(live)) for ref, i, st, si, ei, live in rows}


def current_holders(env: dict[str, Any]) -> dict[tuple[str, str, str], set[str]]:
    """Each entry (source_type, source_identity, external_id) -> the current records holding it."""
    holders: dict[tuple[str, str, str], set[str]] = {}
    for entry in provenance_rows(env):
        ref, (st, si, ei, live) = entry[0], entry[-4:]
        if live:
            holders.setdefault((st, si, ei), set()).add(ref)
    return holders


def run_day(env: dict[str, Any], run_dag: Any, day: int, **settings: str) -> Any:
    env["server"].set_day(day)
    return run_dag("bos_test_days", "bos_test_days.py", **FULL, **settings)


@every_dialect
def test_the_provenance_table_follows_merges_leavers_and_splits(days, run_dag) -> None:
    first = run_day(days, run_dag, 1)
    assert task_states(first)["sync"] == "success"
    assert provenance_rows(days) == entries_of_the_records(days)
    day1 = current_holders(days)
    assert {ref for refs in day1.values() for ref in refs} == expected_final(SCENARIO, 1).refs

    second = run_day(days, run_dag, 2)
    assert task_states(second)["sync"] == "success" and xcom_summary(second)["superseded"] == 40
    assert provenance_rows(days) == entries_of_the_records(days)
    holders = current_holders(days)
    assert all(len(refs) == 1 for refs in holders.values())  # an entry belongs to one identity at a time
    assert {ref for refs in holders.values() for ref in refs} == expected_final(SCENARIO, 2).refs
    for new, olds in day_changes(SCENARIO, 2).merged.items():
        # The ids the merged records were known by now find the merged record, and only it.
        theirs = {entry for entry, refs in day1.items() if refs & set(olds)}
        assert theirs and all(holders.get(entry) == {new} for entry in theirs)

    assert_day_3_splits_the_merge(days, run_dag)


def assert_day_3_splits_the_merge(days: dict[str, Any], run_dag: Any) -> None:
    """Day 3 splits one merge back: its people hold the entries again, each entry one current record."""
    third = run_day(days, run_dag, 3)
    assert task_states(third)["sync"] == "success"
    assert provenance_rows(days) == entries_of_the_records(days)
    [(was_merged, people)] = day_changes(SCENARIO, 3).split.items()
    holders = current_holders(days)
    assert all(len(refs) == 1 for refs in holders.values())
    assert was_merged not in {ref for refs in holders.values() for ref in refs}
    assert set(people) <= {ref for refs in holders.values() for ref in refs}


def stored_rows(env: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """record_ref -> what a rewrite of the row would change: its hash, sync time, run and whether it is current."""
    with env["engine"].connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT record_ref, _bos_record_hash, _bos_synced_at, _bos_run_id, "
            f"CASE WHEN _bos_deleted_at IS NULL THEN 1 ELSE 0 END FROM {env['table']}")).all()
    return {ref: tuple(str(v) for v in rest) for ref, *rest in rows}


def drop_provenance_table(env: dict[str, Any]) -> None:
    with env["engine"].begin() as conn:
        conn.execute(sa.text(f"DROP TABLE {companion_table_name(env['table'], 'sources')}"))


@every_dialect
def test_a_table_stored_before_its_provenance_table_gets_it_from_the_sources_column(days, run_dag) -> None:
    """A records table without ``<table>_sources`` (stored before it existed) gets it on its next run,
    built from the stored ``sources`` JSON, retired rows' entries not current, without rewriting a row;
    and the next day's supersession finds its candidates in the table so built."""
    run_day(days, run_dag, 1)
    assert task_states(run_day(days, run_dag, 2))["sync"] == "success"
    stored, entries = stored_rows(days), entries_of_the_records(days)
    assert {live for *_, live in entries} == {True, False}  # current rows and retired or superseded ones
    drop_provenance_table(days)

    again = run_day(days, run_dag, 2)  # nothing changed at the server
    assert task_states(again) == {"sync": "success", "check": "success"}
    summary = xcom_summary(again)
    assert (summary["inserted"], summary["updated"], summary["retired"], summary["superseded"]) == (0, 0, 0, 0)
    assert summary["unchanged"] == len(expected_final(SCENARIO, 2).records)
    assert stored_rows(days) == stored  # no row rewritten: same hash, sync time, run, state
    assert provenance_rows(days) == entries_of_the_records(days) == entries

    assert_day_3_splits_the_merge(days, run_dag)  # found through the entries built from the JSON


@every_dialect
def test_hard_deletions_leave_no_provenance_row_of_the_people_removed(days, run_dag) -> None:
    """With ``deletions="hard"`` a leaver's row and a merged-away row are deleted, and so are their
    entries in ``<table>_sources``: it holds only the current records' entries, none of a removed person's."""
    hard = {"BOS_TEST_DELETIONS": "hard"}
    assert task_states(run_day(days, run_dag, 1, **hard))["sync"] == "success"
    day1 = {r.record_ref: set(r.provenance) for r in expected_final(SCENARIO, 1).records}
    changes = day_changes(SCENARIO, 2)
    removed = set(changes.left) | {old for olds in changes.merged.values() for old in olds}
    assert len(removed) == 50 and removed <= {entry[0] for entry in provenance_rows(days)}

    second = run_day(days, run_dag, 2, **hard)
    assert task_states(second)["sync"] == "success"
    summary = xcom_summary(second)
    assert (summary["retired"], summary["superseded"]) == (len(changes.left), 40)
    assert set(stored_rows(days)) == expected_final(SCENARIO, 2).refs  # the removed rows are deleted
    rows = provenance_rows(days)
    assert rows == entries_of_the_records(days) and all(entry[-1] for entry in rows)
    assert not removed & {entry[0] for entry in rows}
    # A leaver's ids are held by nobody now: no row of the table names them.
    gone = set().union(*(day1[ref] for ref in changes.left))
    assert gone and not gone & {entry[-4:-1] for entry in rows}

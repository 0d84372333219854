"""Identities over time at the warehouse: retire (full reads), supersede (merges and splits), the guard.

Synthetic records through :class:`WarehouseWriter` on every dialect; the end-to-end runs through the
reference server are in tests/airflow/test_identities_over_time.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_bos.warehouse import AuditReader, UpsertCounts
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from airflow_provider_bos.wire import ReconcileOptions
from tests.warehouse.whhelpers import (
    T0,
    T1,
    T2,
    drop_columns,
    make_record,
    reflect,
    rows_by_ref,
    run_info,
    write,
)

FULL = ReconcileOptions(sync_mode="full")


def person(i: int, observed_at: str = T1, *, keys: list[int] | None = None, ref: str | None = None,
           **fields: Any) -> dict[str, Any]:
    """A record whose provenance is crm/<k> for each k of ``keys`` (default: its own number)."""
    record = make_record(ref or i, observed_at, **fields)
    template = record["sources"][0]
    record["sources"] = [{**template, "external_id": str(k)} for k in (keys or [i])]
    return record


def current(engine: sa.Engine, table: str) -> set[str]:
    return {ref for ref, row in rows_by_ref(engine, table).items() if row["_bos_deleted_at"] is None}


def lineage(engine: sa.Engine, table: str) -> set[tuple[str, str]]:
    t = reflect(engine, companion_table_name(table, "lineage"))
    with engine.connect() as conn:
        return {(r.record_ref, r.successor_ref) for r in conn.execute(sa.select(t))}


def audit_of(engine: sa.Engine, writer: Any, run: Any) -> dict[str, Any]:
    return AuditReader(engine, table=writer.audit_table).get_run(run.run_id)


def day1() -> list[dict[str, Any]]:
    return [person(i) for i in range(1, 11)]


def day2() -> list[dict[str, Any]]:
    # 1 and 2 merged into "m:1-2" (a new canonical ref); 10 left; 3 changed its name.
    merged = person(0, T2, keys=[1, 2], ref="m:1-2")
    rest = [person(i, T2, name="Renamed" if i == 3 else None) for i in range(3, 10)]
    return [merged, *rest]


def test_a_complete_full_read_retires_the_leaver_and_supersedes_the_merged(make_writer, engine) -> None:
    writer = make_writer()
    assert write(writer, day1(), reconcile=FULL) == UpsertCounts(inserted=10)
    run = run_info()
    counts = write(writer, day2(), run, reconcile=FULL)
    # Only 3 changed; 4-9 were re-stamped (observed later), which is no change: not rewritten.
    assert (counts.inserted, counts.updated, counts.unchanged) == (1, 1, 6)
    assert (counts.superseded, counts.retired) == (2, 1)
    rows = rows_by_ref(engine, writer.table)
    assert current(engine, writer.table) == {"m:1-2", *(make_record(i)["record_ref"] for i in range(3, 10))}
    one, two, leaver = (rows[make_record(i)["record_ref"]] for i in (1, 2, 10))
    assert one["_bos_superseded_by"] == two["_bos_superseded_by"] == "m:1-2"
    assert one["_bos_deleted_at"] is not None and leaver["_bos_deleted_at"] is not None
    assert leaver["_bos_superseded_by"] is None and leaver["_bos_run_id"] == run.run_id
    assert lineage(engine, writer.table) == {(make_record(1)["record_ref"], "m:1-2"),
                                             (make_record(2)["record_ref"], "m:1-2")}
    audit = audit_of(engine, writer, run)
    assert (audit["status"], audit["retired"], audit["superseded"]) == ("complete", 1, 2)


def test_an_incremental_read_supersedes_a_merge_but_retires_nobody(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, day1())
    counts = write(writer, day2())
    assert (counts.superseded, counts.retired) == (2, 0)
    assert make_record(10)["record_ref"] in current(engine, writer.table)  # the leaver stays: not a full read
    assert make_record(1)["record_ref"] not in current(engine, writer.table)


@pytest.mark.parametrize("mode", ["full", "incremental"])
def test_a_partial_read_retires_and_supersedes_nothing(make_writer, engine, mode) -> None:
    writer = make_writer()
    options = ReconcileOptions(sync_mode=mode)
    write(writer, day1(), reconcile=options)
    run = run_info()
    counts = write(writer, day2(), run, reconcile=options, status="partial", completeness="partial")
    assert (counts.superseded, counts.retired) == (0, 0)
    assert len(current(engine, writer.table)) == 11  # 10 + the merged record
    audit = audit_of(engine, writer, run)
    assert (audit["retired"], audit["superseded"]) == (0, 0)
    if mode == "full":
        assert "Nothing was retired" in audit["notes"]


def test_a_split_supersedes_with_the_smallest_successor_and_both_in_the_lineage(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, [person(0, keys=[1, 2], ref="m:1-2"), person(3)], reconcile=FULL)
    counts = write(writer, [person(1, T2, ref="s:b"), person(2, T2, ref="s:a"), person(3, T2)], reconcile=FULL)
    assert (counts.inserted, counts.superseded, counts.retired) == (2, 1, 0)
    rows = rows_by_ref(engine, writer.table)
    assert rows["m:1-2"]["_bos_superseded_by"] == "s:a"
    assert lineage(engine, writer.table) == {("m:1-2", "s:a"), ("m:1-2", "s:b")}


def test_a_row_with_provenance_the_result_does_not_hold_is_not_superseded(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, [person(0, keys=[1, 2], ref="m:1-2")])
    # Only entry 1 moved to another record: entry 2 still belongs to nobody in the result.
    counts = write(writer, [person(1, T2, ref="n:1")])
    assert counts.superseded == 0 and "m:1-2" in current(engine, writer.table)


def test_the_guard_keeps_an_empty_complete_full_read_from_retiring_everything(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, day1(), reconcile=FULL)
    run = run_info()
    counts = write(writer, [], run, reconcile=FULL)
    assert (counts.retired, counts.retire_withheld) == (0, 10)
    assert len(current(engine, writer.table)) == 10
    audit = audit_of(engine, writer, run)
    assert audit["status"] == "partial" and audit["retired"] == 0
    assert "10 of its scope's 10 current rows" in audit["error_message"]  # why the run is partial
    assert "max_retire_fraction=0.5" in audit["error_message"]
    # Turned off, the same read retires them all.
    counts = write(writer, [], reconcile=ReconcileOptions(sync_mode="full", max_retire_fraction=None))
    assert counts.retired == 10 and current(engine, writer.table) == set()


def test_a_full_read_retires_only_rows_of_its_own_scope(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, [person(i) for i in (1, 2)], run_info(tool_name="people.search"), reconcile=FULL)
    write(writer, [person(i) for i in (3, 4)], run_info(tool_name="people.other"), reconcile=FULL)
    counts = write(writer, [person(1, T2)], run_info(tool_name="people.search"), reconcile=FULL)
    assert counts.retired == 1  # 2, not 3 or 4 (another read's rows)
    assert current(engine, writer.table) == {make_record(i)["record_ref"] for i in (1, 3, 4)}
    # An explicit scope joins reads whose arguments differ.
    named = ReconcileOptions(sync_mode="full", scope="nightly", max_retire_fraction=None)
    write(writer, [person(5)], run_info(arguments_hash="1" * 64), reconcile=named)
    counts = write(writer, [person(6)], run_info(arguments_hash="2" * 64), reconcile=named)
    assert counts.retired == 1 and make_record(5)["record_ref"] not in current(engine, writer.table)


def test_rows_written_before_scopes_are_retired_only_on_opt_in(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, day1())
    with engine.begin() as conn:  # as an audit row written before this release: no scope
        conn.exec_driver_sql(f"UPDATE {writer.audit_table} SET scope = NULL")
    options = ReconcileOptions(sync_mode="full", max_retire_fraction=None)
    assert write(writer, [person(1, T2)], reconcile=options).retired == 0
    adopted = ReconcileOptions(sync_mode="full", max_retire_fraction=None, adopt_unscoped_rows=True)
    assert write(writer, [person(1, T2)], reconcile=adopted).retired == 9
    assert current(engine, writer.table) == {make_record(1)["record_ref"]}


def test_a_retired_record_that_comes_back_is_current_again(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, [person(1), person(2)], reconcile=FULL)
    write(writer, [person(1)], reconcile=ReconcileOptions(sync_mode="full", max_retire_fraction=None))
    assert current(engine, writer.table) == {make_record(1)["record_ref"]}
    counts = write(writer, [person(1), person(2)], reconcile=FULL)  # byte-identical to its retired row
    assert (counts.updated, counts.unchanged, counts.retired) == (1, 1, 0)
    row = rows_by_ref(engine, writer.table)[make_record(2)["record_ref"]]
    assert row["_bos_deleted_at"] is None and row["_bos_superseded_by"] is None


def test_a_backfill_never_retires_a_row_observed_after_it(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, [person(1, T1), person(2, T2)], reconcile=FULL)
    options = ReconcileOptions(sync_mode="full", max_retire_fraction=None)
    counts = write(writer, [person(1, T0)], reconcile=options, observed_at=T1)
    assert counts.retired == 0 and counts.skipped_stale == 1  # 2 was observed at T2, after this read


def test_an_older_complete_read_brings_back_nothing_a_newer_one_retired(make_writer, engine) -> None:
    """A late retry or backfill of day 1's read, run after day 2's reconciled the table: the leaver
    day 2 retired stays retired (the older read is stale for it), the rest is unchanged."""
    writer = make_writer()
    unguarded = ReconcileOptions(sync_mode="full", max_retire_fraction=None)
    write(writer, [person(1, T0), person(2, T0)], reconcile=FULL, observed_at=T0)
    assert write(writer, [person(1, T0)], reconcile=unguarded, observed_at=T1).retired == 1
    counts = write(writer, [person(1, T0), person(2, T0)], reconcile=FULL, observed_at=T0)
    assert (counts.inserted, counts.updated, counts.unchanged, counts.skipped_stale) == (0, 0, 1, 1)
    assert current(engine, writer.table) == {make_record(1)["record_ref"]}
    # A newer read that returns the leaver, byte-identical to its retired row, brings it back.
    counts = write(writer, [person(1, T0), person(2, T0)], reconcile=FULL, observed_at=T2)
    assert (counts.updated, counts.unchanged, counts.skipped_stale) == (1, 1, 0)
    assert current(engine, writer.table) == {make_record(i)["record_ref"] for i in (1, 2)}


def test_an_older_complete_read_does_not_undo_a_newer_merge(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, [person(1, T0), person(2, T0), person(3, T0)], reconcile=FULL, observed_at=T0)
    counts = write(writer, [person(0, T1, keys=[1, 2], ref="m:1-2"), person(3, T0)], reconcile=FULL,
                   observed_at=T1)
    assert counts.superseded == 2
    counts = write(writer, [person(1, T0), person(2, T0), person(3, T0)], reconcile=FULL, observed_at=T0)
    assert (counts.superseded, counts.retired, counts.skipped_stale) == (0, 0, 2)
    assert current(engine, writer.table) == {"m:1-2", make_record(3)["record_ref"]}
    rows = rows_by_ref(engine, writer.table)
    assert rows[make_record(1)["record_ref"]]["_bos_superseded_by"] == "m:1-2"
    assert lineage(engine, writer.table) == {(make_record(1)["record_ref"], "m:1-2"),
                                             (make_record(2)["record_ref"], "m:1-2")}


def test_hard_deletions_delete_the_retired_and_superseded_rows(make_writer, engine) -> None:
    writer = make_writer()
    hard = ReconcileOptions(sync_mode="full", deletions="hard")
    write(writer, day1(), reconcile=hard)
    counts = write(writer, day2(), reconcile=hard)
    assert (counts.superseded, counts.retired) == (2, 1)
    assert set(rows_by_ref(engine, writer.table)) == current(engine, writer.table)
    assert len(current(engine, writer.table)) == 8
    assert len(lineage(engine, writer.table)) == 2  # who was merged into whom outlives the rows


def test_an_unchanged_full_rerun_rewrites_and_retires_nothing(make_writer, engine) -> None:
    writer = make_writer()
    write(writer, day1(), reconcile=FULL)
    before = rows_by_ref(engine, writer.table)
    counts = write(writer, day1(), reconcile=FULL)
    assert counts == UpsertCounts(unchanged=10)
    assert rows_by_ref(engine, writer.table) == before


def test_tables_made_before_the_lifecycle_columns_get_them_in_place(make_writer, engine, caplog) -> None:
    first = make_writer()
    write(first, day1())
    drop_columns(engine, first.audit_table, ("retired", "superseded", "scope"))
    drop_columns(engine, first.table, ("_bos_deleted_at", "_bos_superseded_by"))
    reader = AuditReader(engine, table=first.audit_table)
    assert reader.latest_run(None, None, None)["retired"] is None  # read without the columns
    writer = make_writer()
    with caplog.at_level("INFO", logger="airflow_provider_bos"):
        run = run_info()
        counts = write(writer, day2(), run, reconcile=ReconcileOptions(sync_mode="full", adopt_unscoped_rows=True))
    for column in ("retired", "superseded", "scope", "_bos_deleted_at", "_bos_superseded_by"):
        assert f"Added the {column} column" in caplog.text
    assert (counts.superseded, counts.retired) == (2, 1)  # the old rows were adopted explicitly
    assert (reader.get_run(run.run_id)["retired"], reader.get_run(run.run_id)["superseded"]) == (1, 2)


@pytest.mark.parametrize(("unchanged", "changed", "gone", "retired"), [
    (6, 0, 4, 4),   # 40 %: retired, though the run itself wrote nothing of the scope
    (4, 3, 3, 3),   # 30 %: retired
    (4, 0, 6, 0),   # 60 %: withheld, though the 4 returned rows are no write of this run
    (0, 5, 5, 5),   # exactly the fraction: retired
])
def test_the_guard_weighs_the_scope_rows_a_run_left_unchanged(make_writer, engine, unchanged, changed, gone,
                                                              retired) -> None:
    writer = make_writer()
    write(writer, day1(), reconcile=FULL)
    batch = [person(i) for i in range(1, unchanged + 1)]
    batch += [person(i, T2, name="Changed") for i in range(unchanged + 1, unchanged + changed + 1)]
    counts = write(writer, batch, reconcile=FULL)
    assert (counts.unchanged, counts.updated) == (unchanged, changed)
    assert (counts.retired, counts.retire_withheld) == (retired, 0 if retired else gone)
    assert len(current(engine, writer.table)) == 10 - retired


@pytest.mark.parametrize("mode", ["incremental", "full"])
def test_an_entry_claimed_by_several_records_of_a_result_supersedes_nothing_through_it(make_writer, engine,
                                                                                        mode: str) -> None:
    """A result in which one provenance entry belongs to several records contradicts itself (BOS
    merges a source's record into ONE final record): nothing is superseded through that entry, the
    lineage stays linear in the result (a hostile server's R records on one entry would otherwise
    write R x R rows under the writers' lock), and the run says so. Other merges of the run proceed."""
    writer = make_writer()
    options = ReconcileOptions(sync_mode=mode, max_retire_fraction=None)
    hostile = 40
    # Day 1: 40 records claiming crm/999, and two people 1 and 2.
    write(writer, [person(i, keys=[999]) for i in range(100, 100 + hostile)] + [person(1), person(2)],
          reconcile=options)
    # Day 2: 40 other records claiming crm/999 again, and 1 and 2 merged: a merge that holds.
    day2 = [person(i, T2, keys=[999]) for i in range(200, 200 + hostile)] + [person(0, T2, keys=[1, 2], ref="m:1-2")]
    run = run_info()
    counts = write(writer, day2, run, reconcile=options)
    assert lineage(engine, writer.table) == {(make_record(1)["record_ref"], "m:1-2"),
                                             (make_record(2)["record_ref"], "m:1-2")}
    assert counts.superseded == 2
    note = audit_of(engine, writer, run)["notes"]
    assert "1 provenance entry" in note and "several records" in note

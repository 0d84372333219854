"""WarehouseWriter on every dialect: exact counts, guards, duplicates, chunking, rollback."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from whhelpers import T0, T1, T2, dump, make_record, rows_by_ref, run_info, write

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse import AuditReader, UpsertCounts, record_to_row, records_table
from airflow_provider_bos.warehouse.dialects import staging_table_name
from airflow_provider_bos.warehouse.run import file_load


def _decode(value):
    return json.loads(value) if isinstance(value, str) else value


def test_counts_are_exact_and_guards_hold(writer, engine):
    first = run_info()
    assert write(writer, [make_record(i) for i in range(10)], first) == UpsertCounts(inserted=10)

    batch = (
        [make_record(i) for i in range(10, 13)]  # new
        + [make_record(i, T2, name=f"Renamed {i}") for i in range(3)]  # newer and changed
        + [make_record(i) for i in range(3, 5)]  # identical
        + [make_record(i, T0, name=f"Old {i}") for i in range(5, 7)]  # observed earlier: stale
        + [make_record(7, T1, name="Same time, new content")]  # equal observed_at, changed: written
    )
    second = run_info()
    counts = write(writer, batch, second)
    assert counts == UpsertCounts(inserted=3, updated=4, unchanged=2, skipped_stale=2, duplicates=0)

    rows = rows_by_ref(engine, writer.table)
    assert len(rows) == 13
    assert rows["bos:person:000000"]["display_name"] == "Renamed 0"
    assert rows["bos:person:000000"]["_bos_run_id"] == second.run_id
    assert rows["bos:person:000007"]["display_name"] == "Same time, new content"
    # unchanged and stale rows keep the first run's content and metadata
    for i in (3, 4, 5, 6, 8, 9):
        assert rows[f"bos:person:{i:06d}"]["_bos_run_id"] == first.run_id
        assert rows[f"bos:person:{i:06d}"]["display_name"] == f"Person {i}"
    assert rows["bos:person:000010"]["_bos_record_hash"] == record_to_row(make_record(10)).record_hash
    observed = rows["bos:person:000000"]["_bos_observed_at"]
    observed = observed.replace(tzinfo=UTC) if observed.tzinfo is None else observed
    assert observed == datetime(2026, 10, 9, 12, tzinfo=UTC)

    audit = AuditReader(engine, table=writer.audit_table).get_run(second.run_id)
    assert (audit["inserted"], audit["updated"], audit["unchanged"], audit["skipped_stale"], audit["duplicates"]) == (
        3, 4, 2, 2, 0,
    )
    assert audit["status"] == "complete" and audit["destination_table"] == writer.table


def test_identical_second_run_rewrites_nothing(writer, engine):
    records = [make_record(i) for i in range(50)]
    write(writer, records)
    before = dump(engine, writer.table)
    counts = write(writer, records, run_info())
    assert counts == UpsertCounts(unchanged=50)
    # _bos_synced_at and _bos_run_id untouched: the rows were not rewritten
    assert dump(engine, writer.table) == before


def test_older_observation_never_overwrites_newer(writer, engine):
    write(writer, [make_record(1, T2, name="new")])
    counts = write(writer, [make_record(1, T1, name="older")])
    assert counts == UpsertCounts(skipped_stale=1)
    counts = write(writer, [make_record(1, T0, name="oldest")])
    assert counts == UpsertCounts(skipped_stale=1)
    assert rows_by_ref(engine, writer.table)["bos:person:000001"]["display_name"] == "new"


def test_observed_at_is_latest_source_and_falls_back_to_the_read(writer, engine):
    two_sources = make_record(1)
    two_sources["sources"].append({**two_sources["sources"][0], "source_identity": "hr",
                                   "observed_at": "2026-10-09T14:00:00+02:00"})
    no_stamp = make_record(2)
    del no_stamp["sources"][0]["observed_at"]
    write(writer, [two_sources, no_stamp], default_observed_at="2026-10-05T00:00:00Z")
    # 14:00+02:00 is 12:00Z on the 9th: newer than T1 (8th), so a T1 copy of record 1 is stale
    assert write(writer, [make_record(1, "2026-10-09T11:59:59Z")]) == UpsertCounts(skipped_stale=1)
    # record 2 was stamped with the read's observed_at (5th): a T1 (8th) copy is newer, not stale; its
    # content is the same (only its stamp moved), so it is unchanged; with a change it is written.
    assert write(writer, [make_record(2, T1)]) == UpsertCounts(unchanged=1)
    assert write(writer, [make_record(2, T1, name="Renamed")]) == UpsertCounts(updated=1)


def test_duplicates_in_one_result_are_resolved_deterministically(writer, engine):
    batch = [
        make_record(1, T1, name="a-first"),
        make_record(2, T1, name="b-first"),
        make_record(1, T2, name="a-latest"),  # latest observed_at wins
        make_record(2, T1, name="b-last"),  # tie: last occurrence wins
        make_record(1, T1, name="a-after"),
        make_record(3),
    ]
    counts = write(writer, batch)
    assert counts == UpsertCounts(inserted=3, duplicates=3)
    rows = rows_by_ref(engine, writer.table)
    assert rows["bos:person:000001"]["display_name"] == "a-latest"
    assert rows["bos:person:000002"]["display_name"] == "b-last"

    # against stored rows: the winner is then classified once
    counts = write(writer, [make_record(3, T2, name="x"), make_record(3, T0, name="y"), make_record(1, T0)])
    assert counts == UpsertCounts(updated=1, skipped_stale=1, duplicates=1)
    assert rows_by_ref(engine, writer.table)["bos:person:000003"]["display_name"] == "x"


def test_existing_table_with_extra_columns_keeps_working(make_writer, engine, unique_table):
    metadata = sa.MetaData()
    table = records_table(metadata, engine.dialect.name, unique_table)
    table.append_column(sa.Column("note", sa.String(50), nullable=True, server_default="fresh"))
    metadata.create_all(engine)
    writer = make_writer()
    write(writer, [make_record(1)])
    with engine.begin() as conn:
        conn.execute(table.update().values(note="kept"))
    counts = write(writer, [make_record(1, T2, name="changed"), make_record(2)])
    assert counts == UpsertCounts(inserted=1, updated=1)
    rows = rows_by_ref(engine, unique_table)
    assert rows["bos:person:000001"]["note"] == "kept"
    assert rows["bos:person:000001"]["display_name"] == "changed"
    assert rows["bos:person:000002"]["note"] == "fresh"


def test_existing_table_missing_our_columns_is_a_clear_error(make_writer, engine, unique_table):
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {unique_table} (record_ref VARCHAR(512) PRIMARY KEY, display_name TEXT)")
    writer = make_writer()
    with pytest.raises(BosWarehouseError, match="_bos_record_hash"):
        writer.ensure_tables()


def test_many_chunks(make_writer, engine):
    writer = make_writer(batch_size=1000)
    records = [make_record(i) for i in range(12_000)]
    assert write(writer, iter(records)) == UpsertCounts(inserted=12_000)
    changed = [make_record(i, T2, name="v2") if i % 3 == 0 else make_record(i) for i in range(12_000)]
    changed += [make_record(i) for i in range(12_000, 12_500)]
    assert write(writer, iter(changed)) == UpsertCounts(inserted=500, updated=4000, unchanged=8000)
    with engine.connect() as conn:
        assert conn.exec_driver_sql(f"SELECT COUNT(*) FROM {writer.table}").scalar_one() == 12_500


def test_unicode_and_nested_json_round_trip(writer, engine):
    record = make_record(
        "bos:person:ünï-😀-名前",
        name="Zoë Ñúñez 😀 أحمد 山田",
        email="zoë@exämple.com",
        lifecycle={"state": "active", "since": "2020-01-01", "flags": [True, False, None]},
        identity_match={"score": 0.97, "method": "email", "candidates": [{"ref": "x", "w": 1}]},
        attributes={"ключ": "значение", "nested": {"deep": {"list": [1, 2.5, "three", {"four": None}]}}, "big": 2**53},
    )
    write(writer, [record])
    row = rows_by_ref(engine, writer.table)["bos:person:ünï-😀-名前"]
    assert row["display_name"] == record["display_name"]
    assert row["email"] == record["email"]
    for field in ("lifecycle", "identity_match", "attributes", "sources"):
        assert _decode(row[field]) == record[field]
    assert row["phone"] is None
    # a JSON null is stored as SQL NULL, not the text 'null'
    assert write(writer, [make_record(9, lifecycle=None)]).inserted == 1
    assert rows_by_ref(engine, writer.table)["bos:person:000009"]["lifecycle"] is None


def test_record_refs_differing_in_case_are_distinct(writer, engine):
    assert write(writer, [make_record("bos:person:Abc"), make_record("bos:person:abc")]) == UpsertCounts(inserted=2)


# --- failure and rollback ------------------------------------------------------------------


def _audit_ids(engine, writer):
    with engine.connect() as conn:
        return {r[0] for r in conn.exec_driver_sql(f"SELECT run_id FROM {writer.audit_table}")}


def _assert_staging_gone(engine, run):
    for name in (staging_table_name(run.run_id), staging_table_name(run.run_id, "_d")):
        prefix = "temp." if engine.dialect.name == "sqlite" else ""
        with engine.connect() as conn, pytest.raises(sa.exc.DBAPIError):
            conn.exec_driver_sql(f"SELECT 1 FROM {prefix}{name}")


def test_database_error_in_the_merge_rolls_everything_back(make_writer, engine, unique_table):
    metadata = sa.MetaData()
    table = records_table(metadata, engine.dialect.name, unique_table)
    table.append_constraint(sa.CheckConstraint("display_name IS NULL OR display_name <> 'BOOM'", name="no_boom"))
    metadata.create_all(engine)
    writer = make_writer(batch_size=7)
    write(writer, [make_record(i) for i in range(30)])
    before, audits = dump(engine, unique_table), _audit_ids(engine, writer)

    failing = run_info()
    batch = [make_record(i, T2, name="v2") for i in range(30)] + [make_record(i) for i in range(30, 60)]
    batch.append(make_record(99, name="BOOM"))
    with pytest.raises(BosWarehouseError, match="rolled back"):
        write(writer, batch, failing)
    assert dump(engine, unique_table) == before
    assert _audit_ids(engine, writer) == audits
    _assert_staging_gone(engine, failing)


def test_error_after_the_merge_leaves_no_trace(writer, engine):
    write(writer, [make_record(i) for i in range(20)])
    before, audits = dump(engine, writer.table), _audit_ids(engine, writer)

    def fail_on_audit_insert(conn, cursor, statement, parameters, context, executemany):
        if statement.startswith("INSERT INTO") and writer.audit_table in statement:
            raise RuntimeError("injected failure after the merge")

    sa.event.listen(engine, "before_cursor_execute", fail_on_audit_insert)
    failing = run_info()
    try:
        with pytest.raises(RuntimeError, match="injected"):
            write(writer, [make_record(i, T2, name="v2") for i in range(40)], failing)
    finally:
        sa.event.remove(engine, "before_cursor_execute", fail_on_audit_insert)
    assert dump(engine, writer.table) == before
    assert _audit_ids(engine, writer) == audits
    _assert_staging_gone(engine, failing)


def test_error_after_the_first_staging_chunk_rolls_back(make_writer, engine, monkeypatch):
    writer = make_writer(batch_size=10, use_copy=False)
    monkeypatch.setattr(file_load, "FILE_BLOCK_ROWS", 10)  # the staged file's blocks (DuckDB)
    by_file = writer.staging_method == "staged_file"
    write(writer, [make_record(i) for i in range(5)])
    before = dump(engine, writer.table)
    stage_inserts = []

    def fail_on_second_chunk(conn, cursor, statement, parameters, context, executemany):
        if statement.startswith("INSERT INTO") and "bos_stage_" in statement and (executemany or by_file):
            stage_inserts.append(statement)
            if len(stage_inserts) == 2:
                raise sa.exc.OperationalError(statement, None, RuntimeError("injected disk full"))

    sa.event.listen(engine, "before_cursor_execute", fail_on_second_chunk)
    try:
        with pytest.raises(BosWarehouseError, match="injected disk full"):
            write(writer, [make_record(i, T2, name="v2") for i in range(50)])
    finally:
        sa.event.remove(engine, "before_cursor_execute", fail_on_second_chunk)
    assert len(stage_inserts) == 2
    assert dump(engine, writer.table) == before


class StreamBroke(Exception):
    pass


def test_records_iterator_failing_midway_rolls_back_and_propagates(writer, engine):
    write(writer, [make_record(i) for i in range(5)])
    before, audits = dump(engine, writer.table), _audit_ids(engine, writer)

    def records():
        for i in range(10):
            yield make_record(i, T2, name="v2")
        raise StreamBroke("EOF before the final frame ended")

    run = run_info()
    with pytest.raises(StreamBroke):
        write(writer, records(), run)
    assert dump(engine, writer.table) == before
    assert _audit_ids(engine, writer) == audits
    _assert_staging_gone(engine, run)


def test_invalid_record_is_a_typed_error_and_nothing_is_written(writer, engine):
    write(writer, [make_record(1)])
    before = dump(engine, writer.table)
    bad = make_record(2)
    del bad["record_ref"]
    with pytest.raises(BosWarehouseError, match="record_ref"):
        write(writer, [make_record(3), bad])
    with pytest.raises(BosWarehouseError, match="at most 512"):
        write(writer, [make_record("x" * 513)])
    with pytest.raises(BosWarehouseError, match="ISO 8601"):
        write(writer, [make_record(4, "yesterday")])
    assert dump(engine, writer.table) == before


def test_a_failed_write_then_record_failure_leaves_one_failed_row(writer, engine):
    # What run_sync does when write_run raises: the run's failure is audited in its own transaction.
    write(writer, [make_record(1)])
    run = run_info()
    bad = make_record(2)
    bad["sources"] = "not a list"
    with pytest.raises(BosWarehouseError) as raised:
        write(writer, [bad], run)
    writer.record_failure(run, error=str(raised.value))
    row = AuditReader(engine, table=writer.audit_table).get_run(run.run_id)
    assert row["status"] == "failed" and "sources" in row["error_message"]
    assert row["inserted"] is None

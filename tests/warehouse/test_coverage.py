"""The audit row's ``coverage``: how many of the rows a run returned had a value in each watched column.

A user charts it over time and alerts on it (``BosCompletenessSensor(min_coverage=...)``), so it must
count the rows the run returned, whatever way they arrived: decoded, or as claims of unchanged
records that are never decoded (an unchanged re-run must report the same coverage as the first run).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from whhelpers import T2, drop_columns, make_record, run_info, write

from airflow_provider_bos.exceptions import BosIdentifierError, BosWarehouseError
from airflow_provider_bos.warehouse import AuditReader, SyncRunInfo, WarehouseWriter
from airflow_provider_bos.wire import KnownRecord, ReconcileOptions, WireRecord

FULL = ReconcileOptions(sync_mode="full")


def person(i: int, **fields: Any) -> WireRecord:
    """Record ``i`` with the hash of its wire bytes (so the next run can claim it): email missing for
    1-3, an empty display_name for 4, a phone for 0-4."""
    values: dict[str, Any] = {"email": None if i in (1, 2, 3) else f"p{i}@example.com",
                              "phone": f"+49 30 {i:04d}" if i < 5 else None}
    if i == 4:
        values["name"] = ""
    values.update(fields)
    record = WireRecord(make_record(i, **values))
    record.wire_hash = hashlib.sha256(json.dumps(dict(record), separators=(",", ":")).encode()).hexdigest()
    return record


def people(refs: range | list[int]) -> list[WireRecord]:
    return [person(i) for i in refs]


def claims(records: list[WireRecord], known: Any) -> list[KnownRecord]:
    """The records as an unchanged re-run hands them over: claims matched in ``known``, never decoded."""
    return [KnownRecord(r["record_ref"], r.wire_hash, known, known.position(r.wire_hash)) for r in records]


def coverage(engine: sa.Engine, writer: WarehouseWriter, run: SyncRunInfo) -> Any:
    row = AuditReader(engine, table=writer.audit_table).get_run(run.run_id)
    assert row is not None
    return row["coverage"]


def expected(refs: range | list[int]) -> dict[str, Any]:
    """The coverage of ``people(refs)``, counted here in Python."""
    records = people(refs)
    return {"records": len(records), "columns": {
        column: sum(1 for r in records if r[column] not in (None, "")) for column in ("display_name", "email", "phone")
    }}


def test_the_audit_row_counts_the_rows_with_a_value(writer, engine) -> None:
    run = run_info()
    write(writer, people(range(10)), run)
    assert coverage(engine, writer, run) == {"records": 10, "columns": {"display_name": 9, "email": 7, "phone": 5}}


def test_an_unchanged_rerun_whose_records_are_all_claims_counts_the_same(writer, engine) -> None:
    first, again = run_info(), run_info()
    write(writer, people(range(10)), first)
    known = writer.known_wire_hashes()
    counts = write(writer, claims(people(range(10)), known), again, known=known)
    assert counts.unchanged == 10 and counts.inserted == counts.updated == 0
    assert coverage(engine, writer, again) == coverage(engine, writer, first) == expected(range(10))


@pytest.mark.parametrize("returned", [3, 7])  # claims staged again (few) / the rows not returned found (many)
def test_a_rerun_returning_some_rows_counts_only_those(writer, engine, returned: int) -> None:
    write(writer, people(range(10)), run_info())
    known = writer.known_wire_hashes()
    run = run_info()
    write(writer, claims(people(range(returned)), known), run, known=known)
    assert coverage(engine, writer, run) == expected(range(returned))


def test_decoded_changes_beside_claims_count_their_new_values(writer, engine) -> None:
    write(writer, people(range(10)), run_info())
    known = writer.known_wire_hashes()
    emptied = [person(i, observed_at=T2, email=None, phone=None) for i in (0, 5, 6)]  # filled before, empty now
    run = run_info()
    counts = write(writer, [*claims(people(range(7, 10)), known), *emptied, *claims([person(4)], known)], run,
                   known=known)
    assert (counts.updated, counts.unchanged) == (3, 4)
    # rows 0, 4, 5, 6, 7, 8, 9: email only for 4 and 7-9; phone only for 4; display_name empty for 4
    assert coverage(engine, writer, run) == {"records": 7, "columns": {"display_name": 6, "email": 4, "phone": 1}}


def test_a_partial_run_counts_the_rows_it_returned(writer, engine) -> None:
    write(writer, people(range(10)), run_info())
    run = run_info()
    write(writer, people(range(4)), run, status="partial", completeness="partial")
    assert coverage(engine, writer, run) == expected(range(4))


@pytest.mark.parametrize("returned", [3, 7])
def test_a_partial_rerun_of_claims_counts_the_rows_it_returned(writer, engine, returned: int) -> None:
    write(writer, people(range(10)), run_info())
    known = writer.known_wire_hashes()
    run = run_info()
    write(writer, claims(people(range(returned)), known), run, known=known, status="partial", completeness="partial")
    assert coverage(engine, writer, run) == expected(range(returned))


def test_a_complete_full_read_counts_what_it_returned_not_what_it_retired(writer, engine) -> None:
    write(writer, people(range(10)), run_info(), reconcile=FULL)
    run = run_info()
    counts = write(writer, people(range(2, 10)), run, reconcile=FULL)
    assert counts.retired == 2
    assert coverage(engine, writer, run) == expected(range(2, 10))


@pytest.mark.parametrize("status", ["complete", "partial"])
def test_a_run_that_wrote_every_record_it_returned_counts_only_those(writer, engine, status: str) -> None:
    """New people and changed ones, none unchanged, beside rows the run did not return: the rows it
    wrote are its rows (the other rows' values must not count)."""
    write(writer, people(range(10)), run_info())
    run = run_info()
    changed = [person(i, observed_at=T2, email=None) for i in (0, 5)]  # email filled before, empty now
    counts = write(writer, [*changed, *people(range(10, 14))], run, reconcile=FULL,
                   status=status, completeness=status)
    assert (counts.inserted, counts.updated, counts.unchanged) == (4, 2, 0)
    assert coverage(engine, writer, run) == {"records": 6, "columns": {"display_name": 6, "email": 4, "phone": 1}}


def test_a_stale_record_beside_written_ones_is_counted_as_returned(writer, engine) -> None:
    """A record older than the stored row is not written, yet the run returned it: it counts with
    the stored row's values."""
    write(writer, [person(0, observed_at=T2, email=None), *(person(i, observed_at=T2) for i in (1, 2))], run_info())
    run = run_info()
    counts = write(writer, [person(0), *people(range(10, 12))], run)  # 0 with an email, observed before
    assert (counts.inserted, counts.skipped_stale, counts.unchanged) == (2, 1, 0)
    assert coverage(engine, writer, run) == {"records": 3, "columns": {"display_name": 3, "email": 2, "phone": 1}}


def test_a_failed_run_records_no_coverage(writer, engine) -> None:
    run = run_info()
    writer.record_failure(run, error="BosTransportError: the server went away")
    assert coverage(engine, writer, run) is None


def test_an_audit_table_made_before_coverage_gets_the_column_in_place(make_writer, engine, caplog) -> None:
    first = make_writer()
    old = run_info()
    write(first, people(range(3)), old)
    drop_columns(engine, first.audit_table, ("coverage",))
    reader = AuditReader(engine, table=first.audit_table)
    assert reader.get_run(old.run_id)["coverage"] is None  # read without the column
    run = run_info()
    with caplog.at_level("INFO", logger="airflow_provider_bos"):
        write(make_writer(), people(range(5)), run)
    assert "Added the coverage column" in caplog.text
    assert reader.get_run(run.run_id)["coverage"] == expected(range(5))


def _add_columns(engine: sa.Engine, table: str) -> None:
    """Two columns of the records table the writer does not fill (as another process would):
    department with 6 values and an empty string, level with 3 values (a zero among them)."""
    with engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN department VARCHAR(100)")
        conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN level BIGINT")
        for i in range(8):
            values = {"ref": f"bos:person:{i:06d}", "department": "" if i == 6 else "eng" if i < 6 else None,
                      "level": i if i < 3 else None}
            conn.execute(sa.text(f"UPDATE {table} SET department = :department, level = :level "
                                 "WHERE record_ref = :ref"), values)


def test_coverage_columns_are_counted_too(writer, engine) -> None:
    write(writer, people(range(10)), run_info())
    _add_columns(engine, writer.table)
    known = writer.known_wire_hashes()
    run = run_info()
    write(writer, claims(people(range(10)), known), run, known=known, coverage_columns=("department", "level"))
    assert coverage(engine, writer, run)["columns"] == {
        "display_name": 9, "email": 7, "phone": 5, "department": 6, "level": 3,
    }


@pytest.mark.parametrize(("columns", "error", "says"), [
    (("dept; DROP TABLE x",), BosIdentifierError, "Invalid coverage column name"),
    (("no_such_column",), BosWarehouseError, "no_such_column"),
    ("email", BosWarehouseError, "tuple of column names"),
])
def test_bad_coverage_columns_are_refused_and_nothing_is_written(make_writer, engine, columns, error,
                                                                 says: str) -> None:
    writer = make_writer()
    writer.ensure_tables()
    with pytest.raises(error, match=says):
        write(writer, people(range(3)), coverage_columns=columns)
    with engine.connect() as conn:
        assert conn.exec_driver_sql(f"SELECT COUNT(*) FROM {writer.table}").scalar() == 0
        assert conn.exec_driver_sql(f"SELECT COUNT(*) FROM {writer.audit_table}").scalar() == 0


def test_a_field_the_personal_data_policy_drops_is_not_counted(make_writer: Callable[..., WarehouseWriter],
                                                               engine) -> None:
    from tests.warehouse.pii_helpers import KEY, STRICT, write_under

    writer = make_writer()
    plan = STRICT.plan(KEY)  # drops display_name, hashes email and phone
    # (named again as a coverage column: still left out)
    write_under(writer, plan, [make_record(i, phone=f"+49 {i}") for i in range(4)], coverage_columns=("display_name",))
    row = AuditReader(engine, table=writer.audit_table).latest_run(None, None, None)
    assert row["coverage"] == {"records": 4, "columns": {"email": 4, "phone": 4}}


def test_a_sync_rerun_whose_records_arrive_undecoded_counts_them_and_its_coverage_columns(
    bos_server_factory: Callable[..., Any], make_writer: Callable[..., WarehouseWriter], engine: sa.Engine,
) -> None:
    """Through the reference server and run_sync: the re-run's records arrive byte-identical and are
    never decoded, yet its coverage equals the first run's, plus the coverage column asked for."""
    import uuid

    import httpx

    from airflow_provider_bos.mcp import McpSession
    from airflow_provider_bos.sync import run_sync
    from airflow_provider_bos.testing.scenario import large_scenario

    server = bos_server_factory(scenario=large_scenario(300, sources=3, page_size=50))
    writer = make_writer()

    def sync(**options: Any) -> tuple[Any, Any]:
        token = server.mint_grant()["access_token"]
        client = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30.0)
        with client, McpSession(server.mcp_url, http_client=client, timeout=30.0,
                                stream_threshold_bytes=4096) as session:
            run = SyncRunInfo(run_id=str(uuid.uuid4()), conn_id="e2e", tool_name="people.search")
            outcome = run_sync(session.federated_read, writer, run, tool_name="people.search", arguments={},
                               via="execute", stream=True, **options)
            return outcome, coverage(engine, writer, run)

    first, before = sync()
    assert first.counts.inserted == 300
    with engine.begin() as conn:  # a column the writer does not fill, set by someone else for 40 rows
        conn.exec_driver_sql(f"ALTER TABLE {writer.table} ADD COLUMN department VARCHAR(100)")
        refs = [r for (r,) in conn.exec_driver_sql(f"SELECT record_ref FROM {writer.table} ORDER BY record_ref")][:40]
        for ref in refs:
            conn.execute(sa.text(f"UPDATE {writer.table} SET department = 'eng' WHERE record_ref = :ref"), {"ref": ref})
    again, after = sync(coverage_columns=("department",))

    assert again.result.known_records == 300 and again.counts.unchanged == 300  # none decoded
    assert before["records"] == 300 and 0 < before["columns"]["email"] < 300 and 0 < before["columns"]["phone"] < 300
    assert after == {"records": 300, "columns": {**before["columns"], "department": 40}}

"""invalid_records: one record the table cannot store fails the run ("fail") or is quarantined.

Every dialect (PostgreSQL and MariaDB with CI=true), on both paths a run can take: an empty
target (PostgreSQL's direct COPY load) and a target with rows (staging).
"""

from __future__ import annotations

import json
import math
import uuid

import pytest
import sqlalchemy as sa
from whhelpers import drop_columns, dump, make_record, rows_by_ref, run_info, write

from airflow_provider_bos.exceptions import BosConfigurationError, BosWarehouseError
from airflow_provider_bos.testing.whole_values import nested
from airflow_provider_bos.warehouse import AuditReader, UpsertCounts
from airflow_provider_bos.warehouse.run.catalog import column_names
from airflow_provider_bos.warehouse.run.rejects import MAX_REJECT_BYTES, Rejects
from airflow_provider_bos.warehouse.tables.records import MAX_ENTRY_TEXT_LENGTH, MAX_RECORD_REF_LENGTH
from airflow_provider_bos.warehouse.tables.schema import rejects_table_name
from airflow_provider_bos.wire import WireRecord, WriteOptions

LONG_REF = "bos:person:" + "x" * MAX_RECORD_REF_LENGTH


def bad_records() -> list[dict]:
    """One too-long record_ref, one non-finite number, one shape the table cannot store."""
    return [
        make_record(LONG_REF),
        make_record("bos:person:nan", attributes={"score": math.inf}),
        make_record("bos:person:shape", name={"first": "Ada"}),  # display_name must be text
    ]


def mixed(start: int, wire: bool) -> list:
    good = [make_record(i) for i in range(start, start + 5)]
    records: list = good[:2] + bad_records() + good[2:]
    # The scanner's records (orjson fast path) cannot hold a non-finite number: that one stays a dict.
    return [WireRecord(r) if wire and r["record_ref"] != "bos:person:nan" else r for r in records]


def rejects_rows(engine: sa.Engine, table: str) -> list[dict]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT * FROM {rejects_table_name(table)} ORDER BY reason")).mappings()
        return [dict(r) for r in rows]


@pytest.mark.parametrize("wire", [False, True], ids=["dicts", "wire"])
@pytest.mark.parametrize("target", ["empty", "with_rows"])
def test_fail_rolls_the_run_back(writer, engine, wire, target) -> None:
    writer.ensure_tables()
    if target == "with_rows":
        write(writer, [make_record(i) for i in range(100, 103)])
    before = dump(engine, writer.table)
    run = run_info()
    with pytest.raises(BosWarehouseError):
        write(writer, mixed(0, wire), run)  # invalid_records="fail" is the default
    assert dump(engine, writer.table) == before
    assert AuditReader(engine, table=writer.audit_table).get_run(run.run_id) is None  # the caller audits failed
    assert not sa.inspect(engine).has_table(rejects_table_name(writer.table))


@pytest.mark.parametrize("wire", [False, True], ids=["dicts", "wire"])
@pytest.mark.parametrize("target", ["empty", "with_rows"])
def test_quarantine_lands_the_rest_and_keeps_the_rejects(writer, engine, wire, target) -> None:
    kept = 3 if target == "with_rows" else 0
    if kept:
        write(writer, [make_record(i) for i in range(100, 100 + kept)])
    run = run_info()

    counts = write(writer, mixed(0, wire), run, invalid_records="quarantine")

    assert counts == UpsertCounts(inserted=5, rejected=3)
    kept_refs = {f"bos:person:{i:06d}" for i in [*range(5), *range(100, 100 + kept)]}
    assert set(rows_by_ref(engine, writer.table)) == kept_refs
    rejects = rejects_rows(engine, writer.table)
    assert len(rejects) == 3 and {r["run_id"] for r in rejects} == {run.run_id}
    by_ref = {r["record_ref"]: r for r in rejects}
    assert set(by_ref) == {LONG_REF, "bos:person:nan", "bos:person:shape"}
    assert "at most 512" in by_ref[LONG_REF]["reason"]
    assert "not JSON" in by_ref["bos:person:nan"]["reason"]
    assert "display_name" in by_ref["bos:person:shape"]["reason"]
    for reject in rejects:  # nothing is lost: the record's bytes are kept
        assert not reject["truncated"]
        assert json.loads(bytes(reject["record"]))["record_ref"] == reject["record_ref"]
    audit = AuditReader(engine, table=writer.audit_table).get_run(run.run_id)
    assert audit["status"] == "partial" and (audit["inserted"], audit["rejected"]) == (5, 3)
    assert audit["error_message"].startswith("3 record(s) quarantined in " + rejects_table_name(writer.table))


def test_quarantine_without_invalid_records_is_complete_and_creates_the_rejects_table(writer, engine) -> None:
    run = run_info()
    assert write(writer, [make_record(1)], run, invalid_records="quarantine") == UpsertCounts(inserted=1)
    assert rejects_rows(engine, writer.table) == []
    audit = AuditReader(engine, table=writer.audit_table).get_run(run.run_id)
    assert (audit["status"], audit["rejected"]) == ("complete", 0)


def _audit_table_made_before_the_rejected_column(make_writer, engine) -> None:
    first = make_writer()
    first.ensure_tables()
    drop_columns(engine, first.audit_table, ("rejected",))


def test_an_audit_table_made_before_the_rejected_column_gets_it(make_writer, engine, caplog) -> None:
    _audit_table_made_before_the_rejected_column(make_writer, engine)
    writer = make_writer()  # a writer that meets the older audit table
    run = run_info()
    with caplog.at_level("INFO", logger="airflow_provider_bos"):
        assert write(writer, mixed(0, True), run, invalid_records="quarantine") == UpsertCounts(inserted=5, rejected=3)
    assert f"Added the rejected column to {writer.audit_table}" in caplog.text
    assert AuditReader(engine, table=writer.audit_table).get_run(run.run_id)["rejected"] == 3
    assert "rejected" in column_names(engine, writer.dialect, writer.audit_table, None)


def test_an_audit_table_that_cannot_be_altered_is_written_and_read_without_the_column(
    make_writer, engine, caplog,
) -> None:
    _audit_table_made_before_the_rejected_column(make_writer, engine)

    def no_alter_privilege(conn, cursor, statement, *args) -> None:
        if statement.lstrip().upper().startswith("ALTER TABLE"):
            raise sa.exc.OperationalError(statement, {}, Exception("permission denied to alter the table"))

    sa.event.listen(engine, "before_cursor_execute", no_alter_privilege)
    try:
        writer = make_writer()
        run = run_info()
        with caplog.at_level("INFO", logger="airflow_provider_bos"):
            counts = write(writer, mixed(0, True), run, invalid_records="quarantine")
    finally:
        sa.event.remove(engine, "before_cursor_execute", no_alter_privilege)
    assert counts == UpsertCounts(inserted=5, rejected=3)
    assert "could not be added now (permission denied" in caplog.text and "sql/" in caplog.text
    reader = AuditReader(engine, table=writer.audit_table)
    audit = reader.get_run(run.run_id)
    assert (audit["status"], audit["rejected"]) == ("partial", None)
    assert audit["error_message"].startswith("3 record(s) quarantined")  # the count is still recorded
    assert reader.latest_run(None, None, None)["run_id"] == run.run_id
    failed = run_info()
    writer.record_failure(failed, error="boom")
    assert reader.get_run(failed.run_id)["status"] == "failed"


def test_adding_the_rejected_column_gives_up_soon_behind_an_open_reader(
    make_writer, engine, monkeypatch, caplog,
) -> None:
    # An open transaction that read the audit table (a BI query) holds it; an ALTER waiting for it
    # would hang the task and queue every other writer's audit INSERT behind it.
    if engine.dialect.name == "sqlite":
        pytest.skip("SQLite: the ALTER waits the connection's busy timeout, as every write does")
    if engine.dialect.name == "duckdb":
        pytest.skip("DuckDB: an open reader does not hold the table (its catalog is versioned); the ALTER runs")
    from airflow_provider_bos.warehouse import writer as upsert

    monkeypatch.setattr(upsert, "ADD_COLUMN_TIMEOUT_S", 1.0)
    _audit_table_made_before_the_rejected_column(make_writer, engine)
    reader = sa.create_engine(engine.url)
    try:
        with reader.connect() as holder:
            holder.exec_driver_sql(f"SELECT COUNT(*) FROM {make_writer().audit_table}").all()  # still open
            writer = make_writer()
            with caplog.at_level("WARNING", logger="airflow_provider_bos"):
                writer.ensure_tables()  # returns: it does not wait for the reader to finish
            assert not writer.audit_rejected_column and "could not be added now" in caplog.text
            holder.rollback()
        run = run_info()
        assert write(writer, [make_record(1)], run) == UpsertCounts(inserted=1)  # audited without the column
        assert AuditReader(engine, table=writer.audit_table).get_run(run.run_id)["status"] == "complete"
        later = make_writer()
        later.ensure_tables()
        assert later.audit_rejected_column  # a later writer adds it
        assert "rejected" in column_names(engine, later.dialect, later.audit_table, None)
    finally:
        reader.dispose()


def test_a_table_name_too_long_for_the_suffix_quarantines_into_a_hashed_rejects_table(make_writer, engine) -> None:
    table = "t_" + "q" * 53 + uuid.uuid4().hex[:8]  # 63 characters: valid, but "<table>_rejects" is not
    writer = make_writer(table=table, audit_table=f"{table[:50]}_runs")
    counts = write(writer, mixed(0, True), invalid_records="quarantine")
    assert counts == UpsertCounts(inserted=5, rejected=3)
    rejects = rejects_table_name(table)
    assert len(rejects) == 63 and rejects.startswith(table[:38]) and rejects.endswith("_rejects")
    assert len(rejects_rows(engine, table)) == 3
    assert rejects_table_name(table[:-1] + "x") != rejects  # one per table


def test_a_huge_rejected_record_is_bounded_and_flagged(writer, engine) -> None:
    huge = make_record(LONG_REF, attributes={"blob": "y" * (2 * MAX_REJECT_BYTES)})
    write(writer, [huge, make_record(1)], invalid_records="quarantine")
    [reject] = rejects_rows(engine, writer.table)
    assert reject["truncated"] and len(bytes(reject["record"])) == MAX_REJECT_BYTES


@pytest.mark.parametrize("mode", ["skip", "", None, "QUARANTINE"])
def test_unknown_invalid_records_mode_is_refused_before_anything_is_read(writer, mode) -> None:
    def records():
        raise AssertionError("read")
        yield

    with pytest.raises(BosConfigurationError, match="invalid_records"):
        writer.write_run(run_info(), records(), WriteOptions(audit={"status": "complete"}, invalid_records=mode))


def test_rejects_keep_what_cannot_be_serialised_as_json() -> None:
    rejects = Rejects()
    rejects.add({"record_ref": 7, "x": math.nan, "y": object()}, BosWarehouseError("no ref"))
    [row] = rejects.rows
    assert row["record_ref"] is None and b"NaN" in row["record"] and row["reason"] == "no ref"


def with_version(i: int, version: object) -> dict:
    record = make_record(i)
    record["sources"][0]["version"] = version
    return record


@pytest.mark.parametrize("wire", [False, True], ids=["dicts", "wire"])
def test_an_entry_value_too_long_as_the_database_renders_it_is_quarantined(writer, engine, wire) -> None:
    """A provenance entry's value other than a string goes into the provenance table as the database
    renders its JSON (PostgreSQL: a space after every comma, every number positional), which may be
    longer than the compact JSON BOS sent: refused like any record the table cannot store, on every
    destination alike, instead of failing the run; a value that fits either way is stored."""
    spaced = with_version(1, [1] * 200)  # 401 characters compact, 599 with the spaces
    positional = with_version(2, [1e-300, 1e-300])  # 15 compact; each number 302 characters written out
    fits = with_version(3, [1] * 120)  # 359 characters with the spaces
    records = [spaced, positional, fits, make_record(4)]
    run = run_info()

    counts = write(writer, [WireRecord(r) if wire else r for r in records], run, invalid_records="quarantine")

    assert counts == UpsertCounts(inserted=2, rejected=2)
    assert set(rows_by_ref(engine, writer.table)) == {"bos:person:000003", "bos:person:000004"}
    reasons = {r["record_ref"]: r["reason"] for r in rejects_rows(engine, writer.table)}
    assert set(reasons) == {"bos:person:000001", "bos:person:000002"}
    for reason in reasons.values():
        assert "sources[0].version" in reason and "at most 512" in reason, reason


ENTRY_VALUES = [[1] * 200, {"a": [1, 2], "b": {"c": None}}, [1e-300], [1e16, 1.5, -0.0, 12345678901234567890, 1e22],
                ['é\n"\\', True, False], [[[]], {}, [{}]], 2.5e-7, {"": "", "k": [None]}]


def test_an_entry_value_is_measured_at_least_as_long_as_postgresql_stores_it(engine) -> None:
    """The measure the refusal above takes is never shorter than the text PostgreSQL's provenance
    table gets (``->>`` of the stored jsonb) nor than the compact JSON, as far as a column holds."""
    if engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's rendering of a jsonb value")
    from airflow_provider_bos.warehouse.tables.records import _rendered_length, canonical_json

    with engine.connect() as conn:
        for value in ENTRY_VALUES:
            compact = canonical_json({"v": value})
            stored = conn.execute(sa.text("SELECT length(CAST(:doc AS jsonb)->>'v')"), {"doc": compact}).scalar_one()
            longest = max(stored, len(canonical_json(value)))
            measured = _rendered_length(value)  # it stops counting once past what a column holds
            assert measured >= min(longest, MAX_ENTRY_TEXT_LENGTH + 1), value


@pytest.mark.parametrize("wire", [False, True], ids=["dicts", "wire"])
def test_a_value_nested_deeper_than_mariadb_validates_is_quarantined_there_and_stored_elsewhere(
        writer, engine, wire) -> None:
    """Any JSON value may come where the contract names no type, at any depth; MariaDB's JSON columns
    validate at most 31 levels (its ``JSON_VALID``). There a deeper record is refused like any record
    the table cannot store, naming the limit (it failed the whole run, quarantine or not); every other
    destination stores it as sent."""
    deep = [make_record(1, attributes={"tree": nested(31, "core")}),  # 32 levels in the column
            make_record(2, lifecycle=nested(32, "core")),
            make_record(3, identity_match={"why": nested(40, "core")})]
    extra = make_record(4)
    extra["sources"][0]["meta"] = nested(31, "core")
    at_the_limit = make_record(5, attributes={"tree": nested(30, "core")})  # 31 levels: stored everywhere
    records = [*deep, extra, at_the_limit, make_record(6)]
    run = run_info()

    counts = write(writer, [WireRecord(r) if wire else r for r in records], run, invalid_records="quarantine")

    stored = rows_by_ref(engine, writer.table)
    if engine.dialect.name == "mysql":
        assert counts == UpsertCounts(inserted=2, rejected=4)
        assert set(stored) == {"bos:person:000005", "bos:person:000006"}
        reasons = [r["reason"] for r in rejects_rows(engine, writer.table)]
        assert len(reasons) == 4 and all("31 levels" in reason for reason in reasons), reasons
        with pytest.raises(BosWarehouseError, match="attributes nests 32 levels deep"):  # invalid_records="fail"
            write(writer, [deep[0]])
    else:
        assert counts == UpsertCounts(inserted=6)
        attributes = stored["bos:person:000001"]["attributes"]
        assert (json.loads(attributes) if isinstance(attributes, str) else attributes)["tree"] == nested(31, "core")


def test_a_value_nested_deeper_than_the_encoder_follows_is_refused_not_a_crash(writer, engine) -> None:
    """A value nested past what the JSON encoders follow (about a thousand levels: a record handed to
    the writer in Python may hold any) is refused like any record the table cannot store, with a
    BosError saying so, not a RecursionError that ends the run whatever ``invalid_records`` says."""
    deep = make_record(1)
    deep["attributes"] = {"deep": nested(1100, "core")}  # (make_record's deep copy would not follow it either)

    with pytest.raises(BosWarehouseError, match="nested too deep"):
        write(writer, [deep, make_record(2)])
    counts = write(writer, [deep, make_record(2)], run_info(), invalid_records="quarantine")

    assert counts == UpsertCounts(inserted=1, rejected=1)
    assert set(rows_by_ref(engine, writer.table)) == {"bos:person:000002"}
    (reject,) = rejects_rows(engine, writer.table)
    assert "nested too deep" in reject["reason"] and reject["record_ref"] == "bos:person:000001"

"""After an erasure nothing the provider controls still names the person: audit text, the database
files, the dead row versions a database keeps until it is vacuumed."""

from __future__ import annotations

import os
import re
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from whhelpers import T2, make_record, run_info, write

from airflow_provider_bos.sensors.verdict import judge
from airflow_provider_bos.warehouse import AuditReader
from airflow_provider_bos.warehouse.tables.records import MAX_RECORD_REF_LENGTH
from airflow_provider_bos.warehouse.tables.schema import companion_table_name, rejects_table_name
from airflow_provider_bos.warehouse.upkeep.erase import erase_records
from airflow_provider_bos.wire import ReconcileOptions

HISTORY = ReconcileOptions(history=True)
# The erased person: values found nowhere else in the warehouse.
REF = "bos:person:erase-me-0042"
NAME = "Zelda Quarantinova"
EMAIL = "zelda.q.0042@erase.example"
NEW_EMAIL = "zelda.new.0042@erase.example"


def person(email: str = EMAIL, observed_at: str = "2026-10-08T12:00:00Z", **fields) -> dict:
    return make_record(REF, observed_at, name=NAME, email=email, **fields)


def others(n: int = 200) -> list[dict]:
    return [make_record(i) for i in range(n)]


def traces(text: str) -> list[str]:
    """Which of the erased person's values ``text`` holds."""
    return [value for value in (REF, NAME, EMAIL, NEW_EMAIL) if value in text]


def file_traces(path: Path) -> list[str]:
    found: list[str] = []
    for candidate in (path, *path.parent.glob(path.name + "*")):  # the file, its WAL or journal
        if candidate.is_file():
            data = candidate.read_bytes()
            found += [f"{candidate.name}: {v}" for v in (REF, NAME, EMAIL, NEW_EMAIL) if v.encode() in data]
    return sorted(set(found))


def test_the_quarantine_note_names_no_record(writer, engine) -> None:
    """The audit row (and so the sensor's verdict and every alert built from it) says how many
    records were quarantined and why, never whose: the rejects table holds each ref and reason, and
    an erasure deletes them there."""
    run = run_info()
    write(writer, [*others(3), person(display_name={"first": "Zelda"})], run, invalid_records="quarantine")
    audit = AuditReader(engine, table=writer.audit_table).get_run(run.run_id)
    assert audit["rejected"] == 1 and audit["error_message"].startswith("1 record(s) quarantined in ")
    assert "display_name" in audit["error_message"]  # the reason is kept
    assert traces(audit["error_message"]) == []
    assert traces(judge(audit).message) == []


def test_an_over_long_quarantined_ref_can_be_erased(writer, engine) -> None:
    """A ref too long for the records table is exactly what lands in the rejects table: erasure finds it there."""
    long_ref = "bos:person:" + "z" * MAX_RECORD_REF_LENGTH
    write(writer, [*others(3), make_record(long_ref, email=EMAIL)], invalid_records="quarantine")
    erased = erase_records(engine, table=writer.table, audit_table=writer.audit_table, record_refs=[long_ref])
    assert (erased.records, erased.rejects) == (0, 1)
    with engine.connect() as conn:
        left = conn.execute(sa.text(f"SELECT record_ref FROM {rejects_table_name(writer.table)}")).all()
    assert left == []


def test_erasure_scrubs_the_ref_from_every_audit_text(writer, engine) -> None:
    """A failed run's error (invalid_records="fail" names the record it refused) and a note written
    before notes named no refs: after the erasure neither the audit table nor a verdict on it names the ref."""
    write(writer, [*others(3), person()])
    failed = run_info()
    writer.record_failure(failed, error=f"BosWarehouseError: Record {REF!r}: 'sources' must be a list.")
    older = run_info()
    write(writer, others(3), older, error_message=f"1 record(s) quarantined in x_rejects: Record {REF!r}: bad")
    erase_records(engine, table=writer.table, audit_table=writer.audit_table, record_refs=[REF])
    reader = AuditReader(engine, table=writer.audit_table)
    for run in (failed, older):
        audit = reader.get_run(run.run_id)
        assert traces(audit["error_message"]) == [] and "[erased record_ref]" in audit["error_message"]
        assert traces(judge(audit).message) == []
    assert reader.get_run(failed.run_id)["error_message"].endswith("'sources' must be a list.")


def test_a_failed_sources_words_stored_before_are_reduced_to_the_contracts_fields(writer, engine) -> None:
    """Runs used to keep whatever a server put beside a source error's code; such a message can quote
    the person. An erasure leaves every audit row's source_errors as runs write them now: the source
    and the code."""
    write(writer, [*others(3), person()])
    older = run_info()
    source = {"source_type": "hr", "source_identity": "hr-main"}
    said = {"source": {**source, "region": "eu"}, "error": {"code": "source_timeout", "message": f"{NAME} <{EMAIL}>"}}
    # A final's code was not checked then: a server's text there was stored as the code itself.
    coded = {"source": source, "error": {"code": f"locked: {EMAIL}"}}
    write(writer, others(3), older, completeness="partial", status="partial", source_errors=[said, coded])
    erased = erase_records(engine, table=writer.table, audit_table=writer.audit_table, record_refs=[REF])
    audit = AuditReader(engine, table=writer.audit_table).get_run(older.run_id)
    assert audit["source_errors"] == [{"source": source, "error": {"code": "source_timeout"}},
                                      {"source": source, "error": {"code": "unknown"}}]
    assert erased.audit_source_errors == 1


@pytest.mark.parametrize("ref", ["bos:person:dom\\zelda-0042", "bos:person:tab\tzelda-0042",
                                 "bos:person:o'ne\"il-0042"], ids=["backslash", "tab", "both-quotes"])
def test_a_ref_that_messages_quote_escaped_is_kept_out_of_audit_text_too(writer, engine, ref: str) -> None:
    """Messages quote a ref as Python's repr does (a backslash, a control character or a quote
    escaped): the quarantine note names such a ref in neither form, and an erasure scrubs both from
    a failed run's error."""
    escaped = repr(ref)[1:-1]
    assert escaped != ref
    refused = make_record(ref, email=EMAIL)
    refused["display_name"] = {"first": "Zelda"}
    run = run_info()
    write(writer, [*others(3), refused], run, invalid_records="quarantine")
    reader = AuditReader(engine, table=writer.audit_table)
    note = reader.get_run(run.run_id)["error_message"]
    assert note.startswith("1 record(s) quarantined in ") and ref not in note and escaped not in note
    failed = run_info()
    writer.record_failure(failed, error=f"BosWarehouseError: Record {ref!r}: 'sources' must be a list.")

    erased = erase_records(engine, table=writer.table, audit_table=writer.audit_table, record_refs=[ref])

    assert (erased.rejects, erased.audit_messages) == (1, 1)
    error = reader.get_run(failed.run_id)["error_message"]
    assert ref not in error and escaped not in error and "[erased record_ref]" in error


def test_a_long_ref_is_kept_out_of_the_quarantine_note(writer, engine) -> None:
    """The note keeps the first 200 characters of a reason, cut after its ref is taken out: a cut
    inside a long ref would leave its start in the note."""
    ref = "bos:person:" + "q" * 300  # a ref the records table could hold
    refused = make_record(ref, email=EMAIL)
    refused["display_name"] = {"first": "Zelda"}
    run = run_info()
    write(writer, [*others(3), refused], run, invalid_records="quarantine")
    note = AuditReader(engine, table=writer.audit_table).get_run(run.run_id)["error_message"]
    assert "display_name" in note and "q" * 20 not in note


def test_erasing_a_merged_record_erases_the_records_merged_into_it(writer, engine) -> None:
    """BOS merged two records of one person into a new ref: erasing that ref erases the two earlier
    ones too (their rows hold the same person and name the erased ref as their successor), from every
    table, and the people merged into nobody stay."""
    full = ReconcileOptions(sync_mode="full", history=True)
    first = [make_record(i, name=f"Person {i}") for i in range(1, 8)]
    for i, email in ((1, EMAIL), (2, NEW_EMAIL)):
        first[i - 1] = make_record(i, name=NAME, email=email)
    write(writer, first, reconcile=full)
    merged = make_record(REF, T2, name=NAME, email=EMAIL)
    merged["sources"] = [{**first[0]["sources"][0], "observed_at": T2},
                         {**first[1]["sources"][0], "observed_at": T2}]
    write(writer, [merged, *first[2:]], reconcile=full)
    earlier = [first[0]["record_ref"], first[1]["record_ref"]]

    erased = erase_records(engine, table=writer.table, audit_table=writer.audit_table, record_refs=[REF])

    tables = [writer.table, *(companion_table_name(writer.table, kind) for kind in ("history", "sources", "lineage"))]
    with engine.connect() as conn:
        for table in tables:
            text = repr(conn.exec_driver_sql(f"SELECT * FROM {table}").all())
            assert traces(text) == [] and not [ref for ref in earlier if ref in text], table
        left = conn.exec_driver_sql(f"SELECT record_ref FROM {writer.table}").scalars().all()
    assert sorted(left) == sorted(r["record_ref"] for r in first[2:])
    assert (erased.merged, erased.records) == (2, 3)


@pytest.mark.parametrize("database", ["sqlite", "sqlite-wal", "duckdb"])
def test_the_database_file_keeps_no_byte_of_an_erased_person(database, tmp_path, unique_table) -> None:
    """The file (and its WAL or journal) after the erasure and the engine's close holds neither the
    person's current row nor the versions an update replaced (freed pages, free blocks)."""
    dialect = database.partition("-")[0]
    path = tmp_path / ("warehouse.duckdb" if dialect == "duckdb" else "warehouse.db")

    def sqlite_pragmas(conn, _) -> None:
        # As python.org's and most non-Debian builds: SQLite without SECURE_DELETE keeps freed cells.
        conn.execute("PRAGMA secure_delete = OFF")
        if database == "sqlite-wal":
            conn.execute("PRAGMA journal_mode = WAL")

    def open_engine() -> sa.Engine:
        engine = sa.create_engine(f"{dialect}:///{path}")
        if dialect == "sqlite":
            sa.event.listen(engine, "connect", sqlite_pragmas)
        return engine

    from airflow_provider_bos.warehouse import WarehouseWriter

    engine = open_engine()

    writer = WarehouseWriter(engine, table=unique_table, audit_table=f"{unique_table}_runs")
    write(writer, [*others(), person()], reconcile=HISTORY)
    write(writer, [*others(), person(NEW_EMAIL, T2)], reconcile=HISTORY)  # the first version is replaced
    engine.dispose()
    assert file_traces(path)  # the values are there before
    engine = open_engine()
    erased = erase_records(engine, table=unique_table, audit_table=f"{unique_table}_runs", record_refs=[REF])
    assert (erased.records, erased.history) == (1, 2)
    engine.dispose()
    assert file_traces(path) == []
    engine = open_engine()  # the rest is intact
    with engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT count(*) FROM {unique_table}")).scalar() == 200
    engine.dispose()


@pytest.mark.postgres
def test_postgres_vacuums_every_table_the_erasure_touched(postgres_url, unique_table) -> None:
    """Deleted rows stay in the table's pages as dead tuples until VACUUM: the erasure runs it (after
    its commit, outside a transaction) on the tables it deleted from and the audit table it scrubbed."""
    engine = sa.create_engine(postgres_url)
    from airflow_provider_bos.warehouse import WarehouseWriter

    writer = WarehouseWriter(engine, table=unique_table, audit_table=f"{unique_table}_runs")
    touched = [unique_table, f"{unique_table}_runs", *(companion_table_name(unique_table, s)
                                                       for s in ("history", "lineage", "sources", "rejects"))]
    try:
        write(writer, [*others(20), person()], reconcile=HISTORY, invalid_records="quarantine")
        write(writer, [*others(20), person(NEW_EMAIL, T2)], reconcile=HISTORY, invalid_records="quarantine")
        started = datetime.now(UTC)
        erase_records(engine, table=unique_table, audit_table=f"{unique_table}_runs", record_refs=[REF])
        with engine.connect() as conn:
            stats = {r.relname: r for r in conn.execute(sa.text(
                "SELECT relname, last_vacuum FROM pg_stat_user_tables WHERE relname = ANY(:names)"),
                {"names": touched})}
        assert sorted(stats) == sorted(touched)
        assert all(s.last_vacuum is not None and s.last_vacuum >= started for s in stats.values()), stats
    finally:
        with engine.begin() as conn:
            for name in touched:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
        engine.dispose()


@pytest.mark.mysql
def test_mariadb_rebuilds_every_table_the_erasure_touched(mysql_url, unique_table) -> None:
    """InnoDB keeps a deleted row in its page (delete-marked, then purged into free space): the
    erasure rebuilds the tables it touched (OPTIMIZE TABLE), so their files hold only live rows."""
    engine = sa.create_engine(mysql_url)
    from airflow_provider_bos.warehouse import WarehouseWriter

    writer = WarehouseWriter(engine, table=unique_table, audit_table=f"{unique_table}_runs")
    touched = [unique_table, f"{unique_table}_runs", *(companion_table_name(unique_table, s)
                                                       for s in ("history", "lineage", "sources", "rejects"))]
    seen: list[str] = []
    try:
        write(writer, [*others(20), person()], reconcile=HISTORY, invalid_records="quarantine")

        def spy(conn, cursor, statement, *args) -> None:
            seen.append(statement)

        sa.event.listen(engine, "before_cursor_execute", spy)
        erase_records(engine, table=unique_table, audit_table=f"{unique_table}_runs", record_refs=[REF])
        sa.event.remove(engine, "before_cursor_execute", spy)
        optimized = {m for s in seen for m in re.findall(r"OPTIMIZE TABLE .*?`?(\w+)`?\s*$", s.strip())}
        assert optimized == set(touched), seen[-8:]
    finally:
        with engine.begin() as conn:
            for name in touched:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
        engine.dispose()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="changing a file's owner needs root")
def test_a_rewritten_duckdb_file_keeps_its_owner_and_mode(tmp_path, unique_table) -> None:
    """An operator who erases as root must not leave the worker a database file it cannot open."""
    path = tmp_path / "warehouse.duckdb"
    engine = sa.create_engine(f"duckdb:///{path}")
    from airflow_provider_bos.warehouse import WarehouseWriter

    write(WarehouseWriter(engine, table=unique_table, audit_table=f"{unique_table}_runs"), [*others(3), person()])
    engine.dispose()
    os.chown(path, 65534, 65534)
    path.chmod(0o640)
    erase_records(sa.create_engine(f"duckdb:///{path}"), table=unique_table, audit_table=f"{unique_table}_runs",
                  record_refs=[REF])
    info = path.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (65534, 65534, 0o640)
    assert file_traces(path) == []

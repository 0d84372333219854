"""Destination schema (PostgreSQL schema / MySQL database) and concurrent writers."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import sqlalchemy as sa
from whhelpers import make_record, rows_by_ref, run_info, write

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse import AuditReader, UpsertCounts, WarehouseWriter


def test_writes_into_a_named_schema(warehouse_url):
    engine = sa.create_engine(warehouse_url)
    dialect = engine.dialect.name
    if dialect == "sqlite":
        pytest.skip("SQLite has no schemas to write to (see test_identifiers)")
    schema = f"bos_schema_{uuid.uuid4().hex[:10]}"
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE {'DATABASE' if dialect == 'mysql' else 'SCHEMA'} {schema}")
    try:
        writer = WarehouseWriter(engine, schema=schema)
        run = run_info()
        assert write(writer, [make_record(1), make_record(2)], run) == UpsertCounts(inserted=2)
        assert write(writer, [make_record(1), make_record(2)]) == UpsertCounts(unchanged=2)
        assert set(rows_by_ref(engine, "bos_records", schema)) == {"bos:person:000001", "bos:person:000002"}
        row = AuditReader(engine, schema=schema).get_run(run.run_id)
        assert row["destination_table"] == f"{schema}.bos_records"
        with pytest.raises(sa.exc.NoSuchTableError):  # nothing landed in the default schema
            rows_by_ref(engine, "bos_records")
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"DROP DATABASE {schema}" if dialect == "mysql" else f"DROP SCHEMA {schema} CASCADE"
            )
        engine.dispose()


def test_concurrent_writers_get_exact_counts(warehouse_url, unique_table):
    engines = [sa.create_engine(warehouse_url) for _ in range(2)]
    writers = [WarehouseWriter(e, table=unique_table, audit_table=f"{unique_table}_runs") for e in engines]
    writers[0].ensure_tables()
    results: list[UpsertCounts] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def work(writer, refs):
        try:
            barrier.wait(timeout=30)
            results.append(write(writer, [make_record(i) for i in refs]))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=work, args=(writers[0], range(1500))),
        threading.Thread(target=work, args=(writers[1], range(1000, 2500))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    try:
        assert not errors, errors
        assert sum(r.inserted for r in results) == 2500
        assert sum(r.unchanged for r in results) == 500
        assert all(r.updated == r.skipped_stale == 0 for r in results)
    finally:
        if engines[0].dialect.name != "sqlite":
            with engines[0].begin() as conn:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {unique_table}")
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {unique_table}_runs")
        for e in engines:
            e.dispose()


def test_a_second_writer_waits_for_the_first_and_gives_up_cleanly(warehouse_url, unique_table):
    """Writers of one table are serialised (so counts stay exact); a held lock times out clearly."""
    holder_engine = sa.create_engine(warehouse_url)
    engine = sa.create_engine(warehouse_url)
    # No sqlite_busy_timeout_s: on SQLite the busy timeout IS the writers' lock wait, so it
    # follows lock_timeout_s (it once stayed at 30 s whatever lock_timeout_s said).
    writer = WarehouseWriter(engine, table=unique_table, audit_table=f"{unique_table}_runs", lock_timeout_s=1)
    writer.ensure_tables()
    d = writer.dialect
    if d.process_lock("", "") is not None:
        pytest.skip("DuckDB has no lock statement to hold: tests/warehouse/test_duckdb.py holds its locks")
    holder = holder_engine.connect()
    try:
        # the holder takes the very lock a writer takes (BEGIN IMMEDIATE / LOCK TABLE / GET_LOCK)
        for statement in d.begin() + d.lock(d.table_ref(unique_table, None), timeout_s=0):
            holder.exec_driver_sql(statement.sql, statement.params or ())
        run = run_info()
        started = time.monotonic()
        with pytest.raises(BosWarehouseError, match=r"(?i)another writer held|lock"):
            write(writer, [make_record(1)], run)
        assert time.monotonic() - started < 15  # gave up after about lock_timeout_s
        holder.rollback()
        if d.name == "mysql":
            holder.exec_driver_sql("SELECT RELEASE_LOCK(%s)", d.unlock(d.table_ref(unique_table, None)).params)
        assert AuditReader(engine, table=f"{unique_table}_runs").get_run(run.run_id) is None
        assert write(writer, [make_record(1)]) == UpsertCounts(inserted=1)
    finally:
        holder.close()
        if engine.dialect.name != "sqlite":
            with engine.begin() as conn:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {unique_table}")
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {unique_table}_runs")
        engine.dispose()
        holder_engine.dispose()

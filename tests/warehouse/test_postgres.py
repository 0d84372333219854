"""PostgreSQL specifics: SIGKILL mid-upsert, COPY vs executemany staging."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa
from whhelpers import T2, dump, make_record, write

from airflow_provider_bos.warehouse import AuditReader, UpsertCounts, WarehouseWriter

pytestmark = pytest.mark.postgres

CHILD = textwrap.dedent(
    """
    import sys, time
    import sqlalchemy as sa
    sys.path.insert(0, sys.argv[4])
    from whhelpers import T2, make_record, run_info, write
    from airflow_provider_bos.warehouse import WarehouseWriter

    url, table, run_id = sys.argv[1:4]
    engine = sa.create_engine(url)
    writer = WarehouseWriter(engine, table=table, audit_table=table + "_runs")

    def hold_before_commit(conn, cursor, statement, parameters, context, executemany):
        # The merge has run (uncommitted); stop right before the audit row and the commit.
        if statement.startswith("INSERT INTO") and table + "_runs" in statement:
            print("MERGED", flush=True)
            time.sleep(120)

    sa.event.listen(engine, "before_cursor_execute", hold_before_commit)
    records = [make_record(i, T2, name="from the killed run") for i in range(3000)]
    write(writer, records, run_info(run_id=run_id))
    """
)


@pytest.fixture()
def pg_engine(postgres_url):
    engine = sa.create_engine(postgres_url)
    yield engine
    engine.dispose()


@pytest.fixture()
def pg_table(pg_engine, unique_table):
    yield unique_table
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {unique_table}, {unique_table}_runs")


def test_sigkill_during_the_upsert_leaves_the_old_state(pg_engine, pg_table, postgres_url, tmp_path):
    writer = WarehouseWriter(pg_engine, table=pg_table, audit_table=f"{pg_table}_runs", lock_timeout_s=30)
    write(writer, [make_record(i) for i in range(2000)])
    before = dump(pg_engine, pg_table)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    run_id = "killed-run"
    child = subprocess.Popen(
        [sys.executable, str(script), postgres_url, pg_table, run_id, str(Path(__file__).parent)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "MERGED"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL

    assert dump(pg_engine, pg_table) == before
    assert AuditReader(pg_engine, table=f"{pg_table}_runs").get_run(run_id) is None
    # the killed transaction's lock is gone: the next run proceeds and sees the old rows
    counts = write(writer, [make_record(i, T2, name="next") for i in range(3000)])
    assert counts == UpsertCounts(inserted=1000, updated=2000)


def test_copy_and_executemany_stage_the_same_rows(pg_engine, unique_table):
    tables = [f"{unique_table}_c", f"{unique_table}_e"]
    try:
        copy_writer = WarehouseWriter(pg_engine, table=tables[0], audit_table=f"{unique_table}_runs")
        many_writer = WarehouseWriter(pg_engine, table=tables[1], audit_table=f"{unique_table}_runs", use_copy=False,
                                      batch_size=333)
        assert (copy_writer.staging_method, many_writer.staging_method) == ("copy", "executemany")
        records = [make_record(i, name=f"Ñame\t{i}\n\\ \"q\"") for i in range(1000)]
        records += [make_record(5, T2, name="dup wins")]
        for writer in (copy_writer, many_writer):
            assert write(writer, records) == UpsertCounts(inserted=1000, duplicates=1)

        def content(table):  # everything but the per-run metadata
            return [row[:9] + row[11:] for row in dump(pg_engine, table)]

        assert content(tables[0]) == content(tables[1])
    finally:
        with pg_engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {tables[0]}, {tables[1]}, {unique_table}_runs")

"""DuckDB: rows staged through a file, one writer process per database file, writers of one table in turn."""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from whhelpers import T2, dump, make_record, run_info, statements, write

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse import AuditReader, UpsertCounts, WarehouseWriter
from airflow_provider_bos.warehouse.run import file_load

pytest.importorskip("duckdb_engine")

# Holds the database file open read-write (DuckDB's lock on it) until a line arrives on stdin.
HOLDER = (
    "import duckdb, sys\n"
    "conn = duckdb.connect(sys.argv[1])\n"
    "print('held', flush=True)\n"
    "sys.stdin.readline()\n"
    "conn.close()\n"
)


@pytest.fixture()
def warehouse_url(duckdb_url: str) -> str:
    return duckdb_url


@pytest.fixture()
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "warehouse.duckdb"


@pytest.fixture()
def holder(db_path: Path):
    """Another process holding the database file; ``holder.release()`` lets it go."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(db_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)

    class Holder:
        def release(self) -> None:
            if proc.poll() is None:
                proc.stdin.write("go\n")
                proc.stdin.flush()
                proc.wait(timeout=30)

    try:
        assert proc.stdout.readline().strip() == "held"
        yield Holder()
    finally:
        Holder().release()


def _writer(db_path: Path, **kwargs) -> WarehouseWriter:
    engine = sa.create_engine(f"duckdb:///{db_path}")
    return WarehouseWriter(engine, table="people", audit_table="people_runs", **kwargs)


def test_rows_are_staged_by_a_file_in_blocks_not_a_statement_per_row(writer, engine, monkeypatch, stage_base):
    monkeypatch.setattr(file_load, "FILE_BLOCK_ROWS", 10)
    write(writer, [make_record(1000)])  # a table with rows: the records are staged, then merged
    staged_before = set(Path(tempfile.gettempdir()).glob("bos-stage/*/*.ndjson"))
    with statements(engine) as seen:
        counts = write(writer, [make_record(i) for i in range(25)])
    assert counts == UpsertCounts(inserted=25)
    assert writer.staging_method == "staged_file"
    loads = [sql for sql in seen if "read_json" in sql]
    assert len(loads) == 3 and all("bos_stage_" in sql for sql in loads)  # 10 + 10 + 5 rows
    assert not [sql for sql in seen if sql.lstrip().upper().startswith("INSERT") and "VALUES" in sql
                and "bos_stage_" in sql]
    assert set(Path(tempfile.gettempdir()).glob("bos-stage/*/*.ndjson")) == staged_before  # the file is gone
    assert len(dump(engine, writer.table)) == 26


def test_an_empty_table_is_loaded_from_the_file_straight_into_the_table(writer, engine, monkeypatch,
                                                                         stage_base):
    """The first sync: each block of the file is read into the table itself (no staging table and no
    second pass); a record_ref seen again goes through staging and the later copy wins."""
    monkeypatch.setattr(file_load, "FILE_BLOCK_ROWS", 10)
    staged_before = set(Path(tempfile.gettempdir()).glob("bos-stage/*/*.ndjson"))
    records = [make_record(i) for i in range(25)] + [make_record(3, T2, name="later copy")]
    with statements(engine) as seen:
        counts = write(writer, records)
    assert counts == UpsertCounts(inserted=25, duplicates=1)
    loads = [sql for sql in seen if "read_json" in sql]
    into_table = [sql for sql in loads if "bos_stage_" not in sql.split("SELECT")[0]]
    assert len(into_table) == 3  # 10 + 10 + 5 rows
    assert len(loads) - len(into_table) == 1  # the later copy, staged
    assert set(Path(tempfile.gettempdir()).glob("bos-stage/*/*.ndjson")) == staged_before
    rows = {r[0]: r for r in dump(engine, writer.table)}
    assert len(rows) == 25 and repr("later copy") in rows[repr(make_record(3)["record_ref"])]


@pytest.mark.parametrize("seeded", [False, True], ids=["direct", "staged"])
def test_the_next_block_is_read_while_the_last_one_loads(writer, engine, monkeypatch, seeded):
    """DuckDB runs in the task's process: a block of the file is loaded while the records of the
    next one are still being read and encoded, so the two use both cores instead of taking turns."""
    monkeypatch.setattr(file_load, "FILE_BLOCK_ROWS", 10)
    if seeded:
        write(writer, [make_record(1000)])
    reached = threading.Event()
    overlapped: list[bool] = []

    def first_load_waits_for_the_reader(conn, cursor, statement, *args):
        if "read_json" in statement and not overlapped:
            # If loads ran in the reader's thread, record 15 could never come while this one runs.
            overlapped.append(reached.wait(timeout=60))

    def records():
        for i in range(25):
            if i == 15:
                reached.set()
            yield make_record(i)

    sa.event.listen(engine, "before_cursor_execute", first_load_waits_for_the_reader)
    try:
        counts = write(writer, records())
    finally:
        sa.event.remove(engine, "before_cursor_execute", first_load_waits_for_the_reader)
    assert overlapped == [True]
    assert counts == UpsertCounts(inserted=25)
    assert len(dump(engine, writer.table)) == 25 + seeded


@pytest.mark.parametrize("seeded", [False, True], ids=["direct", "staged"])
def test_a_read_failing_while_a_block_loads_leaves_nothing_behind(writer, engine, monkeypatch, seeded,
                                                                  stage_base):
    """The read fails after two blocks were handed to the loading thread: the run waits for the load,
    rolls everything back and removes its files."""
    monkeypatch.setattr(file_load, "FILE_BLOCK_ROWS", 10)
    writer.ensure_tables()
    if seeded:
        write(writer, [make_record(1000)])
    before = dump(engine, writer.table)
    staged_before = set(Path(tempfile.gettempdir()).glob("bos-stage/*/*.ndjson"))

    def records():
        for i in range(25):
            yield make_record(i)
        raise BosWarehouseError("the stream broke")

    with pytest.raises(BosWarehouseError, match="the stream broke"):
        write(writer, records())
    assert dump(engine, writer.table) == before
    assert set(Path(tempfile.gettempdir()).glob("bos-stage/*/*.ndjson")) == staged_before
    assert not [t for t in threading.enumerate() if t.name.startswith("bos-file-load")]


@pytest.mark.parametrize("seeded", [False, True], ids=["direct", "staged"])
def test_a_database_under_a_small_memory_limit_is_written(db_path, seeded):
    """``read_json`` holds a buffer of twice ``maximum_object_size`` per thread, inside DuckDB's
    ``memory_limit``: the writer asks for no more than the block's longest line needs, so a worker
    that caps DuckDB at 128 MB can still sync."""
    engine = sa.create_engine(f"duckdb:///{db_path}", connect_args={"config": {"memory_limit": "128MB"}})
    writer = WarehouseWriter(engine, table="people", audit_table="people_runs")
    if seeded:
        write(writer, [make_record(1000)])
    counts = write(writer, [make_record(i) for i in range(30)])
    assert counts == UpsertCounts(inserted=30)
    assert len(dump(engine, writer.table)) == 30 + seeded


@pytest.mark.parametrize("seeded", [False, True], ids=["direct", "staged"])
def test_a_record_longer_than_duckdbs_default_object_size_is_loaded(writer, engine, seeded):
    """With its default ``maximum_object_size`` (16 MiB) DuckDB's ``read_json`` refuses a line over
    twice that: a block holding such a record asks for its length."""
    if seeded:
        write(writer, [make_record(1000)])
    note = "x" * (40 * 1024 * 1024)
    counts = write(writer, [make_record(1), make_record(2, attributes={"note": note}), make_record(3)])
    assert counts == UpsertCounts(inserted=3)
    with engine.connect() as conn:
        length = conn.exec_driver_sql(
            f"SELECT length(attributes->>'$.note') FROM {writer.table} WHERE record_ref = ?",
            (make_record(2)["record_ref"],)).scalar_one()
    assert length == len(note)


def test_json_and_timestamps_are_duckdb_types(writer, engine):
    write(writer, [make_record(1, T2, attributes={"dept": "eng", "tags": ["a", "é"], "n": 1.5})])
    with engine.connect() as conn:
        types = dict(conn.exec_driver_sql(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ?", (writer.table,),
        ).all())
        attributes, observed = conn.exec_driver_sql(
            f"SELECT attributes->>'$.tags[1]', _bos_observed_at FROM {writer.table}").one()
    assert types["attributes"] == "JSON" and types["_bos_observed_at"] == "TIMESTAMP WITH TIME ZONE"
    assert attributes == "é" and observed.utcoffset() is not None and observed.isoformat().startswith("2026-10-09T12")


def test_a_second_process_on_the_file_makes_the_writer_wait_then_fail_clearly(db_path, holder):
    writer = _writer(db_path, lock_timeout_s=1)
    with pytest.raises(BosWarehouseError, match="one writer process at a time") as raised:
        write(writer, [make_record(1)])
    assert str(db_path) in str(raised.value)
    holder.release()
    assert write(writer, [make_record(1)]) == UpsertCounts(inserted=1)  # nothing of the refused run was left


def test_a_writer_waiting_for_another_process_goes_on_when_it_lets_go(db_path, holder, caplog):
    waiting = threading.Event()

    class Waiting(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "waiting up to" in record.getMessage():
                waiting.set()

    handler = Waiting()
    logging.getLogger("airflow_provider_bos").addHandler(handler)
    logging.getLogger("airflow_provider_bos").setLevel(logging.INFO)
    results: list[object] = []
    writer = _writer(db_path, lock_timeout_s=120)
    thread = threading.Thread(target=lambda: results.append(write(writer, [make_record(1), make_record(2)])))
    try:
        thread.start()
        assert waiting.wait(timeout=60), "the writer never met the other process's lock"
        holder.release()
        thread.join(timeout=120)
    finally:
        logging.getLogger("airflow_provider_bos").removeHandler(handler)
    assert results == [UpsertCounts(inserted=2)]


def test_writers_of_one_table_in_one_process_take_turns(db_path):
    first, second = _writer(db_path), _writer(db_path, lock_timeout_s=1)
    first.ensure_tables()
    records_started = threading.Event()
    release = threading.Event()

    def slow_records():
        yield make_record(1)
        records_started.set()
        assert release.wait(timeout=60)
        yield make_record(2)

    results: list[object] = []
    thread = threading.Thread(target=lambda: results.append(write(first, slow_records())))
    thread.start()
    try:
        assert records_started.wait(timeout=60)
        run = run_info()
        with pytest.raises(BosWarehouseError, match="Another writer in this process held people"):
            write(second, [make_record(1)], run)
    finally:
        release.set()
        thread.join(timeout=60)
    assert results == [UpsertCounts(inserted=2)]
    assert AuditReader(second.engine, table="people_runs").get_run(run.run_id) is None
    assert write(second, [make_record(1), make_record(3)]) == UpsertCounts(inserted=1, unchanged=1)

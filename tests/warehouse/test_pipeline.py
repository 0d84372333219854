"""The load pipeline: records read and encoded on a producer thread while the caller writes.

What a user relies on: a failure of the read (a cut stream, a restarted frame) surfaces as the same
exception and nothing is committed; a failure of the write stops the read; memory stays bounded
(the producer never runs more than ``depth`` lists ahead); no thread outlives a load; a load can
be run again after a failure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from whhelpers import T2, make_record, rows_by_ref, write

from airflow_provider_bos.warehouse import WarehouseWriter, file_load, loads
from airflow_provider_bos.warehouse.pipeline import Pipeline
from airflow_provider_bos.wire import WireRecord


class Restarted(BaseException):  # like the stream's restart signal, not an Exception
    """Stands for the read's restart signal (a BaseException: no ``except Exception`` may eat it)."""


class Counting:
    """An iterator over ``n`` items that counts how many were pulled, and from which threads."""

    def __init__(self, n: int, fail_at: int | None = None, error: BaseException | None = None) -> None:
        self.n, self.fail_at, self.error = n, fail_at, error
        self.pulled = 0
        self.threads: set[int] = set()

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            self.threads.add(threading.get_ident())
            if i == self.fail_at:
                assert self.error is not None
                raise self.error
            self.pulled += 1
            yield i


def _load_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "bos-load"]


# --- the pipeline alone ---------------------------------------------------------------------------


def test_items_come_in_order_in_lists_of_the_batch_size() -> None:
    with Pipeline(range(10), batch=3, depth=2) as pipe:
        assert list(pipe) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert not _load_threads()


def test_the_source_is_pulled_by_one_thread_only_and_not_the_callers() -> None:
    source = Counting(1000)
    with Pipeline(source, batch=7, depth=2) as pipe:
        assert sum(len(b) for b in pipe) == 1000
    assert len(source.threads) == 1
    assert threading.get_ident() not in source.threads


def test_a_source_error_surfaces_as_the_same_object_after_the_items_before_it() -> None:
    error = Restarted("frame restarted")
    source = Counting(100, fail_at=25, error=error)
    received: list[int] = []
    with pytest.raises(Restarted) as raised, Pipeline(source, batch=10, depth=2) as pipe:
        for batch in pipe:
            received += batch
    assert raised.value is error
    assert received == list(range(25))
    assert not _load_threads(), "the producer must have ended when the error surfaces"


def test_the_producer_never_runs_more_than_depth_lists_ahead() -> None:
    """Memory is bounded by the queue: holding the first list, the writer lets the producer pull at
    most ``depth`` more lists and the item it is adding (an upper bound, whatever the timing)."""
    source = Counting(100_000)
    batch, depth = 50, 3
    with Pipeline(source, batch=batch, depth=depth) as pipe:
        for first in pipe:
            assert first == list(range(batch))
            break
    assert source.pulled <= batch * (depth + 1) + 1
    assert not _load_threads()


def test_a_writer_failure_stops_the_producer_and_joins_it() -> None:
    source = Counting(1_000_000)
    with pytest.raises(RuntimeError, match="COPY failed"), Pipeline(source, batch=100, depth=2) as pipe:
        for n, _ in enumerate(pipe):
            if n == 3:
                raise RuntimeError("COPY failed")
    assert not _load_threads(), "no thread outlives the load"
    assert source.pulled <= 100 * (4 + 2) + 1  # 4 lists written, 2 queued, 1 item being added
    assert source.pulled < 1_000_000


# --- in a writer's run, every dialect --------------------------------------------------------------


def _records(n: int, fail_at: int | None = None, error: BaseException | None = None) -> Iterator[Any]:
    for i in range(n):
        if i == fail_at:
            assert error is not None
            raise error
        yield WireRecord(make_record(i))


def _count(engine: sa.Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.exec_driver_sql(f"SELECT COUNT(*) FROM {table}").scalar_one())


@pytest.mark.parametrize("depth", [0, 2], ids=["no-thread", "pipelined"])
@pytest.mark.parametrize("target", ["empty", "holding-rows"])
def test_a_read_failure_mid_load_surfaces_unchanged_commits_nothing_and_the_load_runs_again(
    make_writer: Callable[..., WarehouseWriter], engine: sa.Engine, monkeypatch: pytest.MonkeyPatch,
    depth: int, target: str,
) -> None:
    """Several blocks in (past the COPY block and the executemany chunk), the records iterator raises:
    the same exception object reaches the caller, the table and the audit table are unchanged, and
    the writer loads the same records on a second call (the restarted frame's case)."""
    monkeypatch.setattr(loads, "PIPELINE_DEPTH", depth)
    writer = make_writer(batch_size=500)
    writer.ensure_tables()
    if target == "holding-rows":
        write(writer, [make_record("bos:person:other")])
    before = _count(engine, writer.table), _count(engine, writer.audit_table)
    error = Restarted("restart")
    with pytest.raises(Restarted) as raised:
        write(writer, _records(6000, fail_at=5000, error=error))
    assert raised.value is error
    assert (_count(engine, writer.table), _count(engine, writer.audit_table)) == before
    assert not _load_threads()
    counts = write(writer, _records(6000))
    assert counts.inserted == 6000
    assert _count(engine, writer.table) == before[0] + 6000


def test_a_database_failure_stops_the_read(
    make_writer: Callable[..., WarehouseWriter], engine: sa.Engine, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The write fails after the first block: the producer stops pulling records and is joined."""
    monkeypatch.setattr(loads, "PIPELINE_DEPTH", 2)
    monkeypatch.setattr(file_load, "FILE_BLOCK_ROWS", 500)  # DuckDB's staged-file blocks
    writer = make_writer(batch_size=500)
    writer.ensure_tables()
    source = Counting(1_000_000)
    original = loads._send

    def failing_send(copy: Any, lines: list[bytes]) -> int:
        raise RuntimeError("connection lost")

    def records() -> Iterator[Any]:
        for i in source:
            yield WireRecord(make_record(i))

    if writer.use_copy:
        monkeypatch.setattr(loads, "_send", failing_send)
    else:
        real = sa.engine.Connection.exec_driver_sql

        def failing_exec(self: Any, statement: str, *args: Any, **kwargs: Any) -> Any:
            if "INSERT" in statement and args and (isinstance(args[0], list) or "read_json" in statement):
                raise RuntimeError("connection lost")
            return real(self, statement, *args, **kwargs)

        monkeypatch.setattr(sa.engine.Connection, "exec_driver_sql", failing_exec)
    with pytest.raises(RuntimeError, match="connection lost"):
        write(writer, records())
    monkeypatch.setattr(loads, "_send", original)
    assert not _load_threads()
    block = max(loads._COPY_BLOCK, 500)
    assert source.pulled <= block * (1 + 2 + 1) + 1
    assert _count(engine, writer.table) == 0


def test_a_pipelined_load_with_repeated_refs_stores_what_the_one_thread_load_stores(
    make_writer: Callable[..., WarehouseWriter], engine: sa.Engine, unique_table: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Repeated record_refs (a later, newer copy) take the direct load's staging detour, also from a
    producer thread: same counts and same rows as the load without one."""
    records = [make_record(i) for i in range(5000)]
    records += [make_record(i, T2, name=f"newer {i}") for i in range(0, 5000, 7)]
    results = []
    for depth, table in ((0, f"{unique_table}_a"), (2, f"{unique_table}_b")):
        monkeypatch.setattr(loads, "PIPELINE_DEPTH", depth)
        writer = make_writer(table=table, audit_table=f"{table}_runs")
        counts = write(writer, [WireRecord(r) for r in records])
        rows = {ref: (row["display_name"], row["_bos_record_hash"]) for ref, row in rows_by_ref(engine, table).items()}
        results.append((counts, rows))
    assert results[0] == results[1]
    counts, rows = results[1]
    assert (counts.inserted, counts.updated + counts.duplicates) == (5000, len(records) - 5000)
    assert rows["bos:person:000007"][0] == "newer 7"

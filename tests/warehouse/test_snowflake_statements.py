"""A Snowflake sync sends O(batches) statements, not O(records) (counted at the connector)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from fakesnow_support import fakesnow_server, snowflake_url  # noqa: F401 - fixtures
from whhelpers import make_record, run_info, write

from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.dialects.snowflake import SnowflakeDialect

pytestmark = pytest.mark.snowflake


@contextmanager
def sent_statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every statement the connector sends to the server (executemany's multi-row INSERT is one)."""
    from snowflake.connector.cursor import SnowflakeCursor

    sent: list[str] = []
    execute = SnowflakeCursor.execute

    def counting(self, command, *args, **kwargs):  # type: ignore[no-untyped-def]
        sent.append(command)
        return execute(self, command, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(SnowflakeCursor, "execute", counting)
        yield sent


def _unmatched(more: list[str], fewer: list[str]) -> str:
    """The statements one list has beyond the other's, table and stage names left out (for a failure)."""
    name = re.compile(r'"?\b(?:t|bos_stage)_[0-9a-z_]+"?', re.IGNORECASE)

    def shapes(sent: list[str]) -> Counter[str]:
        return Counter(name.sub("<name>", " ".join(s.split()))[:120] for s in sent)
    beyond, missing = shapes(more) - shapes(fewer), shapes(fewer) - shapes(more)
    return f"beyond: {sorted(beyond.elements())}; missing: {sorted(missing.elements())}"


_SUSPECTS_LOOKUP = re.compile(r"^\s*SELECT record_ref, COUNT\(\*\) FROM ", re.IGNORECASE)


def _counted(sent: list[str]) -> list[str]:
    """``sent`` without the one look-up of the staged keys that found their Bloom-filter bit set
    (``loads.SeenKeys``): its false positives follow Python's per-process salted str hash, so a run
    sends that look-up or not, whatever its size. At most one a run."""
    lookups = [s for s in sent if _SUSPECTS_LOOKUP.match(s)]
    assert len(lookups) <= 1, lookups
    return [s for s in sent if not _SUSPECTS_LOOKUP.match(s)]


def _sync(engine: sa.Engine, table: str, n: int, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[str]]:
    writer = WarehouseWriter(engine, table=table, audit_table=f"{table}_runs")
    writer.ensure_tables()  # DDL and inspection are counted apart from the run
    records = [make_record(i) for i in range(n)]
    try:
        with sent_statements(monkeypatch) as first:
            assert write(writer, records).inserted == n
        with sent_statements(monkeypatch) as rerun:
            assert write(writer, records, run=run_info()).unchanged == n
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}_runs")
    return _counted(first), _counted(rerun)


def test_statements_grow_with_batches_not_records(snowflake_url: str, unique_table: str,  # noqa: F811
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    engine = sa.create_engine(snowflake_url, pool_size=1, max_overflow=0)
    batch = SnowflakeDialect.capabilities.max_batch_rows
    small_first, small_rerun = _sync(engine, unique_table, 2 * batch, monkeypatch)
    large_first, large_rerun = _sync(engine, f"{unique_table}_l", 6 * batch, monkeypatch)
    engine.dispose()

    inserts = [s for s in large_first if s.lstrip().upper().startswith("INSERT INTO BOS_STAGE_") and ") VALUES (" in s]
    assert len(inserts) == 6  # one multi-row INSERT per batch of staged rows
    # Three times the records: exactly the four extra staging batches, on the first run and the re-run.
    assert len(large_first) - len(small_first) == 4, _unmatched(large_first, small_first)
    assert len(large_rerun) - len(small_rerun) == 4, _unmatched(large_rerun, small_rerun)
    # Everything else is a constant handful: the run's temporary tables made and dropped, classify,
    # merge, supersession's look-up, the scope's newest confirmation, the one-row look at whether the
    # table's hashes need re-hashing, the provenance table's look, whether the table holds a row of
    # another run, and the written rows' entries, the writer's one look for <table>_columns (promoted
    # attributes), the coverage count, audit row, commit.
    assert len(large_first) <= 6 + 33

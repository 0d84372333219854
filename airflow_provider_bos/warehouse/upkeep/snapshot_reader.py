"""A second connection that reads what a transaction sees, while that transaction writes (PostgreSQL).

``pii-apply`` reads a round of rows, changes it here and updates the round before; on its one
connection a read waits for the last round's updates. The transaction exports its snapshot
(``pg_export_snapshot``) and a second connection begins a read-only ``REPEATABLE READ`` transaction
that imports it (``SET TRANSACTION SNAPSHOT``): it sees the tables as the first transaction saw
them at the export, whatever that one writes after, and reads the next rounds meanwhile. So it may
read only rows the writes have not reached yet, with the writers' lock keeping other writers out
(the rounds: disjoint ranges of refs, each read before it is updated).

The second connection comes from a pool of its own made as the engine's (``Pool.recreate``: the same
connect arguments and pool events): the transaction holds one of the engine's connections, and a
pool of one would make the reader wait for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import sqlalchemy as sa

from airflow_provider_bos.warehouse.dialects.base import WarehouseDialect
from airflow_provider_bos.warehouse.dialects.upkeep_sql import export_snapshot, import_snapshot
from airflow_provider_bos.warehouse.run.db_calls import execute

__all__ = ["reader_on_snapshot"]


@contextlib.contextmanager
def reader_on_snapshot(conn: sa.Connection, dialect: WarehouseDialect) -> Iterator[sa.Connection]:
    """A connection whose transaction sees what ``conn``'s saw when this was entered (``conn`` must be
    in a transaction, which outlives the reader); closed, with its pool, on leaving."""
    snapshot = execute(conn, export_snapshot(dialect)).scalar_one()
    engine = sa.create_engine(conn.engine.url, pool=conn.engine.pool.recreate())
    try:
        with engine.connect() as reader:
            for statement in import_snapshot(dialect, snapshot):
                execute(reader, statement)
            yield reader
            reader.rollback()  # it read only
    finally:
        engine.dispose()

"""A second connection that reads what a transaction sees, while that transaction writes (PostgreSQL).

``pii-apply`` reads a round of rows, changes it here and updates the round before; on its one
connection a read waits for the last round's updates. The transaction exports its snapshot
(``pg_export_snapshot``) and a second connection begins a read-only ``REPEATABLE READ`` transaction
that imports it (``SET TRANSACTION SNAPSHOT``): it sees the tables as committed when the snapshot
was exported, never what the first transaction writes, and reads the next rounds meanwhile. So it
serves only where the first transaction has not written the tables before the export and reads
only rows its writes have not reached, with the writers' lock keeping other writers out (the
rounds: disjoint ranges of refs, each read before it is updated).

The reader takes its share locks on the tables it reads at once, without waiting: a lock request
queued behind the transaction's own lock (an ``ALTER TABLE`` issued meanwhile) would wait for the
transaction, which waits for the reader in this process, where the server's deadlock detection
cannot see it. A refused lock fails the reader's set-up instead, as a refused connection does.

The second connection comes from a pool of its own made as the engine's (``Pool.recreate``: the same
connect arguments and pool events): the transaction holds one of the engine's connections, and a
pool of one would make the reader wait for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import sqlalchemy as sa

from airflow_provider_bos.warehouse.dialects.base import WarehouseDialect
from airflow_provider_bos.warehouse.dialects.upkeep_sql import export_snapshot, import_snapshot, lock_to_read
from airflow_provider_bos.warehouse.run.db_calls import execute

__all__ = ["exported_snapshot", "reader_on_snapshot"]


def exported_snapshot(conn: sa.Connection, dialect: WarehouseDialect) -> str:
    """The id of ``conn``'s transaction's snapshot, importable while that transaction is open."""
    return str(execute(conn, export_snapshot(dialect)).scalar_one())


@contextlib.contextmanager
def reader_on_snapshot(engine: sa.Engine, dialect: WarehouseDialect, snapshot: str, *,
                       tables: Sequence[tuple[str, str | None]]) -> Iterator[sa.Connection]:
    """A connection to ``engine``'s database in a read-only transaction on ``snapshot``, holding a
    share lock on each of ``tables`` (``(name, schema)``); closed, with its pool, on leaving.

    :raises sqlalchemy.exc.DBAPIError: the connection, the snapshot or a lock was refused.
    """
    reader_engine = sa.create_engine(engine.url, pool=engine.pool.recreate())
    try:
        # Whatever the engine's own isolation level (AUTOCOMMIT too): a snapshot is imported only at
        # the start of a REPEATABLE READ transaction.
        with reader_engine.connect().execution_options(isolation_level="REPEATABLE READ") as reader:
            for statement in (*import_snapshot(dialect, snapshot), lock_to_read(dialect, tables)):
                execute(reader, statement)
            yield reader
            reader.rollback()  # it read only
    finally:
        reader_engine.dispose()

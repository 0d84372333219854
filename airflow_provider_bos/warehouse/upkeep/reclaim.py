"""After an erasure: give back the space the deleted rows held, so the database files no longer keep their bytes.

A ``DELETE`` removes rows from what SQL can read, not from the files: PostgreSQL keeps them as dead
tuples until VACUUM, InnoDB keeps them delete-marked until purge and then as free space in their
pages, SQLite (unless built with SECURE_DELETE) keeps freed cells and pages, DuckDB keeps freed
blocks in the file. :func:`reclaim_space` runs, after the erasure committed, what each database
offers (it cannot run in the erasure's transaction):

* SQLite: ``VACUUM`` (the file is rebuilt from its live rows) and a WAL checkpoint that truncates the WAL.
* DuckDB: ``CHECKPOINT``, then the database is copied (``COPY FROM DATABASE``) into a new file that
  replaces it: a DuckDB file never zeroes a freed block, so only a rewrite leaves none.
* PostgreSQL: ``VACUUM`` of each table (the dead tuples are removed, the space marked free).
* MariaDB/MySQL: ``OPTIMIZE TABLE`` of each table (InnoDB rebuilds the table from its live rows).
* Snowflake: nothing can be run: Time Travel and Fail-safe keep the deleted rows (docs/security.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse.dialects import WarehouseDialect
from airflow_provider_bos.warehouse.run.transaction import db_detail

__all__ = ["reclaim_space", "reclaim_statements"]

log = logging.getLogger(__name__)


def reclaim_statements(dialect: WarehouseDialect, tables: Sequence[str], schema: str | None) -> list[str]:
    """What :func:`reclaim_space` runs on ``tables``, as SQL an operator can run by hand."""
    refs = [dialect.table_ref(t, schema) for t in tables]
    if dialect.name == "sqlite":
        return [f"VACUUM {dialect.quote(schema)}" if schema else "VACUUM", "PRAGMA wal_checkpoint(TRUNCATE)"]
    if dialect.name == "duckdb":
        return ["CHECKPOINT", "ATTACH '<new file>' AS fresh", "COPY FROM DATABASE <database> TO fresh",
                "DETACH fresh", "(then the new file replaces the old one)"]
    if dialect.name == "postgresql":
        return [f"VACUUM {ref}" for ref in refs]
    if dialect.name == "mysql":
        return [f"OPTIMIZE TABLE {ref}" for ref in refs]
    return []


def reclaim_space(engine: sa.Engine, dialect: WarehouseDialect, tables: Sequence[str], schema: str | None) -> str:
    """Reclaim the space of deleted rows of ``tables`` (committed already); return what was done.

    :raises BosWarehouseError: the database refused (the erasure itself stays committed); the
        message names what to run by hand.
    """
    try:
        if dialect.name == "duckdb":
            return _rewrite_duckdb_file(engine)
        statements = reclaim_statements(dialect, tables, schema)
        if not statements:
            return f"nothing: {dialect.name} offers no way to purge deleted rows (see docs/security.md)"
        with (engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn,
              _postgres_warnings(conn, dialect.name == "postgresql") as warnings):
            for statement in statements:
                result = conn.exec_driver_sql(statement)
                if dialect.name == "mysql":  # OPTIMIZE reports a failure as a row, not an error
                    errors = [row for row in result.all() if str(row[2]).lower() == "error"]
                    if errors:
                        raise BosWarehouseError(f"{statement}: {errors[0][3]}")
                if warnings:  # VACUUM skips a table it may not vacuum with a WARNING, not an error
                    raise BosWarehouseError(f"{statement}: {warnings[0]}")
        return "; ".join(statements)
    except (sa.exc.SQLAlchemyError, OSError, BosWarehouseError) as exc:
        detail = db_detail(exc) if isinstance(exc, sa.exc.SQLAlchemyError) else str(exc)
        raise BosWarehouseError(
            f"The erasure is committed, but the space the deleted rows held could not be reclaimed, so the "
            f"database files may still hold their bytes: {detail}. Run the erasure again (it deletes nothing "
            f"more and reclaims again), or run: {'; '.join(reclaim_statements(dialect, tables, schema))}"
        ) from exc


@contextlib.contextmanager
def _postgres_warnings(conn: sa.Connection, enabled: bool) -> Iterator[list[str]]:
    """The WARNINGs the server sends on ``conn`` inside the block (psycopg 3's notice handler)."""
    warnings: list[str] = []
    driver: Any = conn.connection.driver_connection
    if not enabled or not hasattr(driver, "add_notice_handler"):
        yield warnings
        return

    def handler(diag: Any) -> None:
        if diag.severity_nonlocalized == "WARNING":
            warnings.append(str(diag.message_primary))

    driver.add_notice_handler(handler)
    try:
        yield warnings
    finally:
        driver.remove_notice_handler(handler)


def _rewrite_duckdb_file(engine: sa.Engine) -> str:
    """Copy the DuckDB database into a new file that replaces it; return what was done.

    The copy is made and put in place while this process still holds the old file (DuckDB's lock), so
    another process that waits for the file opens the new one; no other connection of this process
    may have it open (it would go on writing to the replaced file).
    """
    path = engine.url.database
    if not path or path == ":memory:" or ":" in path.split("/")[0]:  # in memory, MotherDuck (md:)
        return f"nothing: {path or ':memory:'} is not a local database file"
    engine.dispose()  # this engine's idle connections: the copy must be the only one
    raw = engine.raw_connection()
    try:
        duck: Any = raw.driver_connection
        holders = duck.execute("SELECT * FROM duckdb_connection_count()").fetchone()[0]
        if holders != 1:
            raise BosWarehouseError(
                f"{holders - 1} other connection(s) of this process have {path} open; close them first"
            )
        database = duck.execute("SELECT current_database()").fetchone()[0]
        duck.execute("CHECKPOINT")
        fresh = f"{path}.bos-rewrite-{uuid.uuid4().hex}"
        try:
            duck.execute("ATTACH '{}' AS bos_rewrite".format(fresh.replace("'", "''")))
            duck.execute('COPY FROM DATABASE "{}" TO bos_rewrite'.format(database.replace('"', '""')))
            duck.execute("DETACH bos_rewrite")
            old = os.stat(path)
            os.chmod(fresh, stat.S_IMODE(old.st_mode))
            if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):  # e.g. erased by root: the worker's file
                os.chown(fresh, old.st_uid, old.st_gid)
            os.replace(fresh, path)
        finally:
            for leftover in (fresh, f"{fresh}.wal"):
                if os.path.exists(leftover):
                    os.unlink(leftover)
    finally:
        raw.close()
        engine.dispose()
    log.info("Rewrote the DuckDB file %s from its live rows (an erasure's freed blocks are gone).", path)
    return f"rewrote {path} from its live rows (CHECKPOINT; COPY FROM DATABASE into a new file that replaced it)"

"""Baselines: the same final records loaded the fastest raw way, and the naive SQLAlchemy way.

Rows are built in memory from the scenario BEFORE the timer starts; only the load (and its
commit) is timed. Each baseline loads into an EMPTY table with a primary key that it creates and
drops itself. Per dialect:

- ``raw``: PostgreSQL ``COPY ... FROM STDIN`` (psycopg 3, text format, ``write_row``);
  SQLite stdlib ``executemany``; MySQL PyMySQL ``executemany`` (which batches into multi-row INSERTs);
  DuckDB: the rows written as newline-delimited JSON and loaded by one ``INSERT ... SELECT FROM
  read_json`` (``bench.duckdb_load.raw``: writing the file and the load are timed).
  All in one transaction.
- ``stage-merge`` (PostgreSQL): the table first holds ``records`` OTHER rows (untimed prefill),
  then the records are COPYed into a temporary stage and merged with one
  ``INSERT ... SELECT ... ON CONFLICT DO UPDATE``: the raw way to load into a non-empty table.
- ``naive`` (not DuckDB): SQLAlchemy Core upsert (``on_conflict_do_update`` / ``on_duplicate_key_update``)
  ``execute(stmt, list_of_dicts)`` in 5,000-row chunks in one transaction; JSON values are handed
  over as Python objects and serialised by SQLAlchemy, as naive user code would.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.dialects import sqlite as sqlite_dialect

from bench.data import COLUMNS, JSON_COLUMNS, ScenarioParams, build_rows

__all__ = ["BASELINES", "run_baseline"]

NAIVE_CHUNK = 5000


def _table(metadata: sa.MetaData, name: str, dialect: str) -> sa.Table:
    if dialect == "postgresql":
        key, text, js, ts = sa.Text(), sa.Text(), postgresql.JSONB(), sa.DateTime(timezone=True)
    elif dialect == "mysql":
        key, text, js, ts = sa.String(512), mysql.LONGTEXT(), mysql.JSON(), mysql.DATETIME(fsp=6)
    else:
        key, text, js, ts = sa.Text(), sa.Text(), sa.JSON(), sa.DateTime()
    kwargs = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
    return sa.Table(
        name,
        metadata,
        sa.Column("record_ref", key, primary_key=True),
        sa.Column("display_name", text),
        sa.Column("email", text),
        sa.Column("phone", text),
        *(sa.Column(c, js) for c in JSON_COLUMNS),
        sa.Column("_bos_observed_at", ts, nullable=False),
        sa.Column("_bos_synced_at", ts, nullable=False),
        sa.Column("_bos_run_id", sa.String(64), nullable=False),
        sa.Column("_bos_record_hash", sa.String(64), nullable=False),
        **(kwargs if dialect == "mysql" else {}),
    )


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _naive_utc(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(tzinfo=None)


def _count(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def _with_table(url: str, name: str, load: Callable[[sa.Engine, sa.Table], float]) -> tuple[float, int]:
    """Create the empty table, run ``load`` (returns its timed seconds), count, always drop."""
    engine = sa.create_engine(url)
    metadata = sa.MetaData()
    table = _table(metadata, name, engine.dialect.name)
    try:
        metadata.drop_all(engine, checkfirst=True)
        metadata.create_all(engine)
        seconds = load(engine, table)
        return seconds, _count(engine, table)
    finally:
        metadata.drop_all(engine, checkfirst=True)
        engine.dispose()


# --- raw ---------------------------------------------------------------------------------------


def _raw_postgres(url: str, table_name: str, params: ScenarioParams) -> dict[str, Any]:
    import psycopg

    rows = build_rows(params)
    dsn = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)

    def load(engine: sa.Engine, table: sa.Table) -> float:
        with psycopg.connect(dsn) as conn:
            start = time.perf_counter()
            with conn.cursor() as cur, cur.copy(f'COPY "{table.name}" ({", ".join(COLUMNS)}) FROM STDIN') as copy:
                for row in rows.tuples:
                    copy.write_row(row)
            conn.commit()
            return time.perf_counter() - start

    seconds, count = _with_table(url, table_name, load)
    return {"records": len(rows.tuples), "loaded": count, "seconds": seconds, "payload_bytes": rows.payload_bytes}


def _raw_sqlite(url: str, table_name: str, params: ScenarioParams) -> dict[str, Any]:
    built = build_rows(params)
    rows = [(*r[:8], _naive_utc(r[8]).isoformat(" "), _naive_utc(r[9]).isoformat(" "), *r[10:]) for r in built.tuples]
    path = sa.make_url(url).database
    sql = f'INSERT INTO "{table_name}" ({", ".join(COLUMNS)}) VALUES ({", ".join("?" * len(COLUMNS))})'

    def load(engine: sa.Engine, table: sa.Table) -> float:
        conn = sqlite3.connect(path)
        try:
            start = time.perf_counter()
            conn.executemany(sql, rows)
            conn.commit()
            return time.perf_counter() - start
        finally:
            conn.close()

    seconds, count = _with_table(url, table_name, load)
    return {"records": len(rows), "loaded": count, "seconds": seconds, "payload_bytes": built.payload_bytes}


def _raw_mysql(url: str, table_name: str, params: ScenarioParams) -> dict[str, Any]:
    built = build_rows(params)
    rows = [(*r[:8], _naive_utc(r[8]), _naive_utc(r[9]), *r[10:]) for r in built.tuples]
    sql = f"INSERT INTO `{table_name}` ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))})"

    def load(engine: sa.Engine, table: sa.Table) -> float:
        raw = engine.raw_connection()  # PyMySQL connection (autocommit off)
        try:
            start = time.perf_counter()
            with raw.cursor() as cur:
                cur.executemany(sql, rows)
            raw.commit()
            return time.perf_counter() - start
        finally:
            raw.close()

    seconds, count = _with_table(url, table_name, load)
    return {"records": len(rows), "loaded": count, "seconds": seconds, "payload_bytes": built.payload_bytes}


def _raw_duckdb(url: str, table_name: str, params: ScenarioParams) -> dict[str, Any]:
    """``bench.duckdb_load.raw``: its own database file and keyed table in a temporary directory
    beside the bench's database file (``table_name`` is not used: the file holds one table)."""
    import os
    import tempfile

    from bench.duckdb_load import raw

    rows = build_rows(params)
    database = sa.make_url(url).database
    beside = os.path.dirname(os.path.abspath(database)) if database and database != ":memory:" else None
    with tempfile.TemporaryDirectory(prefix="bench-duckdb-raw-", dir=beside) as workdir:
        seconds = raw(rows.tuples, workdir)  # asserts every row is in the table
    return {"records": len(rows.tuples), "loaded": len(rows.tuples), "seconds": seconds,
            "payload_bytes": rows.payload_bytes}


def other_rows(rows: list[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    """``rows`` as other people: under other record_refs and other provenance (external ids), the rows
    a table already holds before a load of ``rows`` (with the same provenance they would be records
    BOS merged into the new ones, and a complete read would supersede them all)."""
    sources = COLUMNS.index("sources")
    for row in rows:
        other = list(row)
        other[0] = "other:" + row[0]
        other[sources] = row[sources].replace('"external_id":"', '"external_id":"other:')
        yield tuple(other)


def copy_rows(conn: Any, table: str, columns: tuple[str, ...], rows: Iterable[tuple[Any, ...]]) -> None:
    """COPY ``rows`` (psycopg 3) into ``table``; no commit."""
    with conn.cursor() as cur, cur.copy(f'COPY "{table}" ({", ".join(columns)}) FROM STDIN') as copy:
        for row in rows:
            copy.write_row(row)


def vacuum(dsn: str, table: str) -> None:
    """VACUUM ANALYZE ``table`` (after a prefill: no autovacuum of it during the timed part)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'VACUUM ANALYZE "{table}"')


def _stage_merge_postgres(url: str, table_name: str, params: ScenarioParams) -> dict[str, Any]:
    import psycopg

    rows = build_rows(params)
    dsn = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in COLUMNS if c != "record_ref")

    def load(engine: sa.Engine, table: sa.Table) -> float:
        with psycopg.connect(dsn) as conn:
            copy_rows(conn, table.name, COLUMNS, other_rows(rows.tuples))
            conn.commit()
        vacuum(dsn, table.name)
        with psycopg.connect(dsn) as conn:
            start = time.perf_counter()
            conn.execute(f'CREATE TEMP TABLE bench_stage (LIKE "{table.name}") ON COMMIT DROP')
            copy_rows(conn, "bench_stage", COLUMNS, rows.tuples)
            conn.execute(f'INSERT INTO "{table.name}" SELECT * FROM bench_stage '
                         f"ON CONFLICT (record_ref) DO UPDATE SET {updates}")
            conn.commit()
            return time.perf_counter() - start

    seconds, count = _with_table(url, table_name, load)
    return {"records": len(rows.tuples), "loaded": count - len(rows.tuples), "seconds": seconds,
            "payload_bytes": rows.payload_bytes, "prefilled": len(rows.tuples)}


# --- naive -------------------------------------------------------------------------------------


def _naive(url: str, table_name: str, params: ScenarioParams) -> dict[str, Any]:
    built = build_rows(params, python_json=True)

    def load(engine: sa.Engine, table: sa.Table) -> float:
        name = engine.dialect.name
        tz = name == "postgresql"
        dicts = [
            {c: (v if tz or not isinstance(v, datetime) else _naive_utc(v)) for c, v in zip(COLUMNS, row, strict=True)}
            for row in built.tuples
        ]
        updates = [c for c in COLUMNS if c != "record_ref"]
        if name == "postgresql":
            ins = postgresql.insert(table)
            stmt = ins.on_conflict_do_update(index_elements=[table.c.record_ref],
                                             set_={c: ins.excluded[c] for c in updates})
        elif name == "sqlite":
            ins = sqlite_dialect.insert(table)
            stmt = ins.on_conflict_do_update(index_elements=[table.c.record_ref],
                                             set_={c: ins.excluded[c] for c in updates})
        else:
            ins = mysql.insert(table)
            stmt = ins.on_duplicate_key_update({c: ins.inserted[c] for c in updates})
        start = time.perf_counter()
        with engine.begin() as conn:
            for chunk in _chunks(dicts, NAIVE_CHUNK):
                conn.execute(stmt, chunk)
        return time.perf_counter() - start

    seconds, count = _with_table(url, table_name, load)
    return {"records": len(built.tuples), "loaded": count, "seconds": seconds, "payload_bytes": built.payload_bytes}


BASELINES: dict[tuple[str, str], Callable[[str, str, ScenarioParams], dict[str, Any]]] = {
    ("postgres", "raw"): _raw_postgres,
    ("sqlite", "raw"): _raw_sqlite,
    ("mysql", "raw"): _raw_mysql,
    ("duckdb", "raw"): _raw_duckdb,
    ("postgres", "stage-merge"): _stage_merge_postgres,
    ("postgres", "naive"): _naive,
    ("sqlite", "naive"): _naive,
    ("mysql", "naive"): _naive,
}


def run_baseline(dialect: str, kind: str, url: str, table_name: str, params: ScenarioParams) -> dict[str, Any]:
    """Run one baseline; returns ``records``, ``loaded`` (rows in the table after), ``seconds``, ``payload_bytes``."""
    return BASELINES[(dialect, kind)](url, table_name, params)

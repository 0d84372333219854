"""First runs in parallel: many writers creating the shared audit table at once never fail.

A DAG that maps reads over several tables starts them together against a new warehouse: every
task calls ``ensure_tables`` for its own records table and the one audit table they share. Here N
processes wait at a barrier and then do exactly that, for several rounds, on every dialect.

Rounds of a race (marker ``repeats``): SQLite in the fast tier, every dialect in the full tier. The
DDL each dialect runs for a first run is proven in the fast tier by test_ddl.py and test_schema.py.
"""

from __future__ import annotations

import multiprocessing
import traceback
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_bos.warehouse import WarehouseWriter

pytestmark = pytest.mark.repeats

PROCESSES = 8
ROUNDS = 6


def _create_tables(url: str, table: str, audit_table: str, barrier: Any, failures: Any) -> None:
    """One task's first run: wait for the others, then ensure its records table and the audit table."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        writer = WarehouseWriter(engine, table=table, audit_table=audit_table)
        barrier.wait(timeout=60)
        writer.ensure_tables()
        inspector = sa.inspect(engine)
        for name in (table, audit_table):
            if not inspector.has_table(name):
                failures.put(f"{table}: {name} missing after ensure_tables()")
    except BaseException:  # noqa: BLE001 - any failure is the finding: report it whole
        failures.put(f"{table}: {traceback.format_exc()}")
    finally:
        engine.dispose()


def _drop(url: str, tables: list[str]) -> None:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            for name in tables:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
    finally:
        engine.dispose()


def test_parallel_first_runs_create_every_table_without_failing(warehouse_url: str) -> None:
    # fork: each child builds its own engine (nothing pooled is inherited) and can run this module's function.
    ctx = multiprocessing.get_context("fork")
    failures_seen: list[str] = []
    for _ in range(ROUNDS):
        prefix = f"c_{uuid.uuid4().hex[:10]}"
        audit_table = f"{prefix}_runs"
        tables = [f"{prefix}_t{i}" for i in range(PROCESSES)]
        barrier = ctx.Barrier(PROCESSES)
        failures = ctx.Queue()
        workers = [ctx.Process(target=_create_tables, args=(warehouse_url, t, audit_table, barrier, failures))
                   for t in tables]
        try:
            for w in workers:
                w.start()
            for w in workers:
                w.join(timeout=120)
            assert all(w.exitcode == 0 for w in workers), [w.exitcode for w in workers]
            while not failures.empty():
                failures_seen.append(failures.get())
            if failures_seen:
                print(failures_seen[0])
        finally:
            for w in workers:
                if w.is_alive():
                    w.kill()
            _drop(warehouse_url, [*tables, audit_table])
    # The last line of each traceback says what failed (the whole first one is in the log above).
    summary = [f.strip().splitlines()[-1] for f in failures_seen]
    assert summary == [], f"{len(summary)} of {ROUNDS * PROCESSES} first runs failed"


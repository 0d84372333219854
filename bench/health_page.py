"""The sync-health page's render time over big audit tables: ``python -m bench.health_page``.

Per dialect (SQLite file, PostgreSQL), one audit table holds ``--rows`` runs (default 10,000) of each
of two destination tables, spread evenly over the last 90 days (90 % complete, 7 % partial with a
source error, 3 % failed; coverage on every complete and partial run, the email column going empty
in the last 10 days), and each records table 2,000 rows (1,800 current). The first runs of each
table are the real WarehouseWriter's; the rest are inserted in bulk through the same audit table
definition (writing 20,000 runs one by one would take most of an hour and measure the writer).

Timed, ``--repeat`` times each (median, and the range): what one page view does after sign-in, on
the destination and in Python, without the HTTP layer and the auth manager:

- ``table page, N days``: open the destination, read the table's health in the window (every
  aggregate in SQL: runs per day and status, counts and coverage per run or per day, source
  failures, the latest runs, COUNT(*) of the rows) and render its HTML;
- ``overview, N days``: both tables' latest runs and runs per day (read in parallel), and the HTML.

Each view connects anew (the page keeps no pool), as a page view does.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
SOURCES = [("crm", "crm-eu"), ("hr", "hr-main"), ("erp", "erp-de")]
CODES = ["source_timeout", "source_unavailable", "rate_limited"]


def _people(count: int) -> list[dict[str, Any]]:
    return [{
        "record_ref": f"bos:person:{i:07d}", "display_name": f"Bench Person {i}", "email": f"b{i}@bench.example",
        "phone": None, "lifecycle": {"state": "active"}, "identity_match": None, "attributes": {"dept": "eng"},
        "sources": [{"source_type": "crm", "source_identity": "crm-eu", "external_id": str(i), "record_type": "person",
                     "observed_at": "2026-10-01T00:00:00Z", "capabilities": ["read"], "version": None}],
    } for i in range(count)]


def _prepare(url: str, rows: int, now: datetime) -> tuple[sa.Engine, str, list[str]]:
    """The audit table with ``rows`` runs of each of two tables (see the module docstring)."""
    from airflow_provider_bos.warehouse import SyncRunInfo, WarehouseWriter, audit_table, dialect_for
    from airflow_provider_bos.wire import ReconcileOptions, WriteOptions

    engine = sa.create_engine(url)
    suffix = uuid.uuid4().hex[:8]
    audit, tables = f"bench_health_runs_{suffix}", [f"bench_health_a_{suffix}", f"bench_health_b_{suffix}"]
    full = ReconcileOptions(sync_mode="full", max_retire_fraction=None)
    for table in tables:  # real runs: the tables, 2,000 rows, 200 of them retired
        writer = WarehouseWriter(engine, table=table, audit_table=audit)
        for records in (_people(2000), _people(1800)):
            writer.write_run(SyncRunInfo(dag_id="bench_dag", task_id="sync", airflow_run_id="manual__bench"),
                             records, WriteOptions(audit={"status": "complete", "completeness": "complete",
                                                          "result_count": len(records)}, reconcile=full))
    t = audit_table(sa.MetaData(), dialect_for(engine).name, audit)
    as_text = isinstance(t.c.coverage.type, sa.Text)
    mysql = engine.dialect.name == "mysql"

    def json_value(value: Any) -> Any:
        return json.dumps(value) if as_text else value

    def stamp(moment: datetime) -> datetime:
        return moment.replace(tzinfo=None) if mysql else moment

    rng = random.Random(20261206)  # noqa: S311 - the bench's reproducible data, not a secret
    step = timedelta(days=90) / rows
    for table in tables:
        batch = []
        for i in range(rows - 2):
            finished = now - timedelta(days=90) + step * (i + 1)
            roll = rng.random()
            status = "complete" if roll < 0.90 else "partial" if roll < 0.97 else "failed"
            records = 1800 + rng.randint(-20, 20)
            emailed = 0 if finished > now - timedelta(days=10) else records - rng.randint(0, 40)
            source, code = rng.choice(SOURCES), rng.choice(CODES)
            batch.append({
                "run_id": str(uuid.uuid4()), "dag_id": "bench_dag", "task_id": "sync",
                "airflow_run_id": f"scheduled__{finished.isoformat()}", "conn_id": "bos_default",
                "context_handle": "ctx", "tool_name": "people.search", "arguments_hash": "0" * 64,
                "started_at": stamp(finished - timedelta(seconds=rng.randint(20, 90))), "finished_at": stamp(finished),
                "status": status, "completeness": None if status == "failed" else status,
                "result_count": None if status == "failed" else records,
                **(dict.fromkeys(("inserted", "updated", "unchanged", "retired", "superseded", "withheld",
                                  "rejected", "skipped_stale", "duplicates")) if status == "failed" else {
                    "inserted": rng.randint(0, 5), "updated": rng.randint(0, 30), "unchanged": records - 30,
                    "retired": rng.randint(0, 2), "superseded": rng.randint(0, 1), "withheld": 0, "rejected": 0,
                    "skipped_stale": 0, "duplicates": 0}),
                "coverage": None if status == "failed" else json_value(
                    {"records": records, "columns": {"display_name": records, "email": emailed,
                                                     "phone": records // 2}}),
                "source_errors": json_value([] if status == "complete" else [
                    {"source": {"source_type": source[0], "source_identity": source[1]}, "error": {"code": code}}]),
                "source_summary": json_value([]), "provisional_records": 0, "provisional_pages": 0,
                "error_message": "the final result never arrived" if status == "failed" else None,
                "destination_table": table,
            })
        with engine.begin() as conn:
            for start in range(0, len(batch), 2000):
                conn.execute(t.insert(), batch[start:start + 2000])
    return engine, audit, tables


def _drop(engine: sa.Engine, audit: str, tables: list[str]) -> None:
    with engine.begin() as conn:
        for name in [audit, *tables, *(f"{t}_sources" for t in tables)]:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
    engine.dispose()


def _timed(work: Callable[[], Any], repeat: int) -> tuple[float, float, float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), max(times), result


def measure(url: str, label: str, rows: int, repeat: int) -> list[dict[str, Any]]:
    from airflow.timetables.trigger import CronTriggerTimetable

    from airflow_provider_bos.plugins.health_discovery import DagInfo, Read
    from airflow_provider_bos.plugins.health_pages import Links, overview_page, table_page
    from airflow_provider_bos.plugins.health_queries import Window
    from airflow_provider_bos.plugins.health_views import HealthService

    now = datetime.now(UTC)
    started = time.perf_counter()
    engine, audit, tables = _prepare(url, rows, now)
    prepared_s = time.perf_counter() - started
    results = []
    try:
        dag = DagInfo("bench_dag", tuple(Read("bench_dag", "sync", "bench_wh", (t,), None, audit) for t in tables),
                      CronTriggerTimetable("*/13 * * * *", timezone="UTC"), datetime(2026, 1, 1, tzinfo=UTC))

        def service() -> HealthService:
            # Each view connects anew, as the page does (its engines keep no pool).
            return HealthService([dag], [], viewer=None, now=now,
                                 engine_for=lambda _conn: sa.create_engine(url, poolclass=sa.pool.NullPool))

        for days in (7, 30, 90):
            window = Window(days, now)
            links = Links("/bos/", "", days)

            def table_view(window: Window = window, links: Links = links) -> str:
                with service() as health:
                    destination = health.destinations()[0]
                    return table_page(health.table(destination, window), window=window, links=links)

            def overview(window: Window = window, links: Links = links) -> str:
                with service() as health:
                    return overview_page(health.overview(window), window=window, links=links)

            for name, work in ((f"table page, {days} days", table_view), (f"overview, {days} days", overview)):
                median, low, high, html = _timed(work, repeat)
                assert "Unreachable" not in html and "BOS sync health" in html
                results.append({"dialect": label, "view": name, "median_ms": median * 1000, "min_ms": low * 1000,
                                "max_ms": high * 1000, "html_kb": len(html.encode()) / 1024})
    finally:
        _drop(engine, audit, tables)
    print(f"{label}: {rows} audit rows per table written in {prepared_s:.1f} s", file=sys.stderr)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.health_page", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000, help="audit rows per destination table (default 10000)")
    parser.add_argument("--repeat", type=int, default=5, help="timed views per row of the table (default 5)")
    parser.add_argument("--dialects", default="sqlite,postgres", help="sqlite and/or postgres (default both)")
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-health-") as tmp:
        urls = {"sqlite": f"sqlite:///{Path(tmp) / 'warehouse.db'}", "postgres": args.pg_url}
        for dialect in [d.strip() for d in args.dialects.split(",") if d.strip()]:
            rows += measure(urls[dialect], dialect, args.rows, args.repeat)
    print(f"| dialect | view ({args.rows} audit rows per table) | median | range | HTML |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dialect']} | {r['view']} | {r['median_ms']:.0f} ms | {r['min_ms']:.0f}-{r['max_ms']:.0f} ms "
              f"| {r['html_kb']:.0f} KiB |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

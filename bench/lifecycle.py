"""The warehouse's side of a full sync, timed: retire, supersede and history against raw COPY.

    python -m bench.lifecycle [--records 200000] [--rounds 3] [--pg-url URL]

No HTTP: the records of the bench scenario are built once, in memory, as the read hands them to
the writer (wire records carrying their wire hash; on a re-run, every unchanged record as a
:class:`~airflow_provider_bos.wire.KnownRecord` claim matched against the table's stored hashes,
as the streamed read does). Each round, interleaved so a slow phase of the machine hits every
measurement alike, times on new tables:

- ``raw COPY``: psycopg 3 COPY of the same rows into an empty keyed table (baselines.py);
- ``full first sync`` / ``incremental first sync`` / ``history first sync``: ``write_run`` of
  every record into an empty table;
- ``full re-run, unchanged``: every record a claim; must rewrite and retire 0 rows;
- ``full re-run, 1% changed + 1% gone``: 1 % of the records changed (observed later), 1 % left
  out, the rest claims; must update and retire exactly that 1 %.

Each row is the median of the rounds; ratios are of medians from this one run. The re-run ratio
is measured without the read, which costs the same in both runs: end to end it can only be closer
to 1.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import sqlalchemy as sa

from airflow_provider_bos.warehouse import SyncRunInfo, WarehouseWriter
from airflow_provider_bos.wire import KnownRecord, ReconcileOptions, WireRecord, WriteOptions
from bench.baselines import run_baseline
from bench.data import ScenarioParams, iter_final_records

_AUDIT = {"status": "complete", "completeness": "complete", "source_errors": [], "source_summary": []}


def _wire(record: dict[str, Any]) -> WireRecord:
    wire = WireRecord(record)
    wire.wire_hash = hashlib.sha256(orjson.dumps(record)).hexdigest()
    return wire


def _changed(record: WireRecord) -> WireRecord:
    data = dict(record)
    data["phone"] = "+1 555 0100"
    data["sources"] = [{**s, "observed_at": "2030-01-01T00:00:00Z"} for s in record["sources"]]
    return _wire(data)


class Tables:
    """Fresh table names on one database, dropped at the end (with the tables beside them)."""

    def __init__(self, url: str) -> None:
        self.engine = sa.create_engine(url)
        self.names: list[str] = []

    def new(self, role: str) -> str:
        name = f"bench_{role}_{uuid.uuid4().hex[:10]}"
        self.names.append(name)
        return name

    def drop(self) -> None:
        with self.engine.begin() as conn:
            for name in self.names:
                for table in (name, f"{name}_runs", f"{name}_lineage", f"{name}_history"):
                    conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{table}"')
        self.engine.dispose()


def _write(tables: Tables, table: str, records: list[Any], options: ReconcileOptions, known: Any = None) -> tuple[float, Any]:
    writer = WarehouseWriter(tables.engine, table=table, audit_table=f"{table}_runs")
    writer.ensure_tables()
    if options.history:
        writer.ensure_history_table()
    start = time.perf_counter()
    counts = writer.write_run(SyncRunInfo(conn_id="bench", tool_name="people.search", arguments_hash="0" * 64),
                              iter(records), WriteOptions(audit=_AUDIT, known=known, reconcile=options))
    return time.perf_counter() - start, counts


def _claims(writer: WarehouseWriter, records: list[WireRecord]) -> tuple[Any, list[Any]]:
    known = writer.known_wire_hashes()
    return known, [KnownRecord(r["record_ref"], r.wire_hash, known, known.match(r.wire_hash)) for r in records]


def run(url: str, records: int, rounds: int) -> int:
    params = ScenarioParams(records=records)
    print(f"building {records} records ...", flush=True)
    base = [_wire(r) for r in iter_final_records(params)]
    step = 100  # 1 %
    gone = {i for i in range(0, len(base), step)}
    changed = {i for i in range(1, len(base), step)}
    full = ReconcileOptions(sync_mode="full")
    times: dict[str, list[float]] = {}
    problems: list[str] = []
    tables = Tables(url)

    def timed(label: str, fn: Callable[[], float]) -> None:
        times.setdefault(label, []).append(fn())

    try:
        for round_no in range(1, rounds + 1):
            print(f"round {round_no}/{rounds}", flush=True)
            timed("raw COPY", lambda: run_baseline("postgres", "raw", url, tables.new("raw"), params)["seconds"])
            table = tables.new("full")
            times.setdefault("full first sync", []).append(_write(tables, table, base, full)[0])
            writer = WarehouseWriter(tables.engine, table=table, audit_table=f"{table}_runs")
            known, claims = _claims(writer, base)
            seconds, counts = _write(tables, table, claims, full, known)
            if counts.written or counts.retired or counts.superseded:
                problems.append(f"unchanged re-run wrote {counts.written}, retired {counts.retired}")
            times.setdefault("full re-run, unchanged", []).append(seconds)
            known, claims = _claims(writer, base)
            mixed = [(_changed(r) if i in changed else claims[i]) for i, r in enumerate(base) if i not in gone]
            seconds, counts = _write(tables, table, mixed, full, known)
            if (counts.updated, counts.retired) != (len(changed), len(gone)):
                problems.append(f"1% re-run updated {counts.updated}, retired {counts.retired}, "
                                f"expected {len(changed)} and {len(gone)}")
            times.setdefault("full re-run, 1% changed + 1% gone", []).append(seconds)
            timed("incremental first sync", lambda: _write(tables, tables.new("inc"), base, ReconcileOptions())[0])
            timed("history first sync", lambda: _write(
                tables, tables.new("hist"), base, ReconcileOptions(sync_mode="full", history=True))[0])
    finally:
        tables.drop()
    median = {label: statistics.median(values) for label, values in times.items()}
    raw = median["raw COPY"]
    print(f"\nPostgreSQL, {records} records, medians of {rounds} interleaved rounds (seconds, every round in brackets)")
    for label, values in times.items():
        ratio = f"{raw / median[label]:.2f}x raw COPY" if label.endswith("first sync") else ""
        print(f"  {label:<38} {median[label]:7.2f} s  {ratio:<18} [{', '.join(f'{v:.2f}' for v in values)}]")
    first, unchanged = median["full first sync"], median["full re-run, unchanged"]
    mixed_s = median["full re-run, 1% changed + 1% gone"]
    print(f"  full first sync / unchanged re-run: {first / unchanged:.2f}x (goal >= 2x)")
    print(f"  1% re-run / unchanged re-run: {mixed_s / unchanged:.2f}x (goal <= 1.3x)")
    for problem in problems:
        print("  PROBLEM:", problem)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lifecycle", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = parser.parse_args(argv)
    return run(args.pg_url, args.records, args.rounds)


if __name__ == "__main__":
    sys.exit(main())

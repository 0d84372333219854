"""DuckDB: the writer's first sync and unchanged re-run against DuckDB's own best bulk load (no HTTP).

``python -m bench.duckdb_load [--records N] [--repeat R]``. Rows are built in memory before any
timer starts. Interleaved rounds, medians printed with every round's time:

- ``raw``: the pre-built rows written as newline-delimited JSON and loaded with one
  ``INSERT ... SELECT FROM read_json`` into an empty keyed table, one transaction (faster than
  ``executemany`` and multi-row ``VALUES``, and than an Arrow table, on this machine: see README);
- ``first``: ``WarehouseWriter.write_run`` of the final records into new tables;
- ``rerun``: the same records again (decoded: the read's wire-hash claims are not part of this
  measurement), which must rewrite 0 rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid

import orjson
import sqlalchemy as sa

from airflow_provider_bos.warehouse import SyncRunInfo, WarehouseWriter
from airflow_provider_bos.wire import WriteOptions
from bench.data import ScenarioParams, build_rows, iter_final_records

DDL = """CREATE TABLE t (record_ref VARCHAR PRIMARY KEY, display_name VARCHAR, email VARCHAR, phone VARCHAR,
 lifecycle JSON, identity_match JSON, attributes JSON NOT NULL, sources JSON NOT NULL,
 _bos_observed_at TIMESTAMPTZ NOT NULL, _bos_synced_at TIMESTAMPTZ NOT NULL, _bos_run_id VARCHAR NOT NULL,
 _bos_record_hash VARCHAR NOT NULL)"""
NAMES = ("record_ref", "display_name", "email", "phone", "lifecycle", "identity_match", "attributes", "sources")


def raw(rows: list[tuple], workdir: str) -> float:
    import duckdb

    conn = duckdb.connect(os.path.join(workdir, f"raw-{uuid.uuid4().hex}.duckdb"))
    conn.execute(DDL)
    path = os.path.join(workdir, "raw.ndjson")
    started = time.perf_counter()
    with open(path, "wb") as out:
        for r in rows:
            pairs = enumerate(zip(NAMES, r[:len(NAMES)], strict=True))  # the content columns; provenance below
            doc = {n: (orjson.Fragment(v) if i >= 4 and v is not None else v) for i, (n, v) in pairs}
            doc.update({"o": r[8].isoformat(), "s": r[9].isoformat(), "run": r[10], "h": r[11]})
            out.write(orjson.dumps(doc) + b"\n")
    conn.execute("BEGIN")
    conn.execute(
        "INSERT INTO t SELECT * FROM read_json(?, format='newline_delimited', columns={record_ref: 'VARCHAR', "
        "display_name: 'VARCHAR', email: 'VARCHAR', phone: 'VARCHAR', lifecycle: 'JSON', "
        "identity_match: 'JSON', attributes: 'JSON', sources: 'JSON', o: 'TIMESTAMPTZ', s: 'TIMESTAMPTZ', "
        "run: 'VARCHAR', h: 'VARCHAR'})",
        [path],
    )
    conn.execute("COMMIT")
    elapsed = time.perf_counter() - started
    assert conn.execute("SELECT COUNT(*) FROM t").fetchone()[0] == len(rows)
    conn.close()
    return elapsed


def sync(records: list[dict], writer: WarehouseWriter) -> tuple[float, int]:
    started = time.perf_counter()
    counts = writer.write_run(SyncRunInfo(run_id=str(uuid.uuid4())), iter(records),
                              WriteOptions(audit={"status": "complete"}))
    return time.perf_counter() - started, counts.written


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    params = ScenarioParams(records=args.records)
    rows = build_rows(params).tuples
    records = list(iter_final_records(params))
    times: dict[str, list[float]] = {"raw": [], "first": [], "rerun": []}
    with tempfile.TemporaryDirectory() as workdir:
        for _ in range(args.repeat):
            times["raw"].append(raw(rows, workdir))
            engine = sa.create_engine(f"duckdb:///{os.path.join(workdir, uuid.uuid4().hex + '.duckdb')}")
            writer = WarehouseWriter(engine)
            first, written = sync(records, writer)
            assert written == len(records)
            rerun, rewritten = sync(records, writer)
            assert rewritten == 0, rewritten
            times["first"].append(first)
            times["rerun"].append(rerun)
            engine.dispose()
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:6s} median {med[k]:.2f} s  rounds {', '.join(f'{x:.2f}' for x in v)}")
    print(f"first sync vs raw: {med['raw'] / med['first']:.2f}x (goal >= 0.5x); "
          f"re-run faster than first: {med['first'] / med['rerun']:.2f}x (goal >= 2x), 0 rows rewritten")


if __name__ == "__main__":
    main()

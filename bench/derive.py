"""Who should derive a record's columns and hash, the client or PostgreSQL? ``python -m bench.derive``.

PostgreSQL can derive what it can (columns from a staged JSON document, the hash with its
built-in ``sha256()``); whichever is faster end to end is kept. This measures both on the
same records (the scenario's final records as the reference server puts them on the wire),
without HTTP, so only the split of the work differs:

- **client derives** (what a first sync does): each record's wire bytes are decoded,
  checked and encoded by ``json_column_values`` into the target's COPY line (canonical JSON columns,
  the canonical record hash); ``COPY`` into the records table itself.
- **PostgreSQL derives**: the client sends each record's wire bytes untouched (plus its wire hash);
  ``COPY`` into a JSONB staging table, then one ``INSERT ... SELECT`` derives every column, the
  latest ``sources[].observed_at`` and a SHA-256 of the content (of PostgreSQL's JSONB text, so NOT
  the canonical hash the other paths store: adopting it would rewrite every stored row once).

The COPY runs beside the read in a real sync; the ``INSERT ... SELECT`` can only start after the
last record. So the end-to-end estimate is max(client, COPY) for the first, and max(client, stage
COPY) + INSERT ... SELECT for the second (the read itself, common to both, is left out).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import UTC, datetime
from hashlib import sha256
from typing import Any

import orjson
import sqlalchemy as sa

from bench.data import ScenarioParams, iter_final_records
from bench.ours import _postgres_cpu_s

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
_BLOCK = 2048

# Every column from the staged document; the hash over the content fields (JSONB text).
_DERIVE = """
INSERT INTO {target} ({columns})
SELECT d->>'record_ref', d->>'display_name', d->>'email', d->>'phone', d->'lifecycle', d->'identity_match',
       COALESCE(d->'attributes', '{{}}'::jsonb), d->'sources',
       (SELECT max((s->>'observed_at')::timestamptz) FROM jsonb_array_elements(d->'sources') s),
       %s, %s,
       encode(sha256(convert_to(jsonb_build_object(
           'attributes', COALESCE(d->'attributes', '{{}}'::jsonb), 'display_name', d->'display_name',
           'email', d->'email', 'identity_match', d->'identity_match', 'lifecycle', d->'lifecycle',
           'phone', d->'phone', 'record_ref', d->'record_ref', 'sources', d->'sources')::text, 'UTF8')), 'hex'),
       wire_hash
FROM {stage}
"""


def _wire_pieces(records: int) -> list[bytes]:
    """The final records' bytes, compact and in the server's key order (as the scanner cuts them)."""
    return [orjson.dumps(r) for r in iter_final_records(ScenarioParams(records=records))]


def _blocks(lines: list[bytes]) -> list[bytes]:
    return [b"".join(lines[i : i + _BLOCK]) for i in range(0, len(lines), _BLOCK)]


def client_derives(conn: Any, writer: Any, pieces: list[bytes]) -> dict[str, float]:
    from airflow_provider_bos.warehouse.tables.records import json_column_values
    from airflow_provider_bos.wire import WireRecord

    start = time.process_time()
    line = writer.dialect.target_lines(synced_at=datetime.now(UTC), run_id="bench").line
    lines = []
    for piece in pieces:
        record = WireRecord(orjson.loads(piece))
        _, parts, observed, record_hash, document = json_column_values(record, None)
        lines.append(line(parts, document, observed, record_hash, sha256(piece).hexdigest()))
    client = time.process_time() - start
    pg, wall = _postgres_cpu_s(), time.perf_counter()
    with conn.cursor() as cur, cur.copy(writer.dialect.copy_target(writer.table, None)) as copy:
        for block in _blocks(lines):
            copy.write(block)
    conn.commit()
    return {"client_cpu_s": client, "copy_s": time.perf_counter() - wall, "copy_pg_cpu_s": _postgres_cpu_s() - pg,
            "derive_s": 0.0, "derive_pg_cpu_s": 0.0}


def postgres_derives(conn: Any, writer: Any, pieces: list[bytes]) -> dict[str, float]:
    start = time.process_time()
    lines = []
    for piece in pieces:
        body = piece.replace(b"\\", b"\\\\") if b"\\" in piece else piece  # COPY text: only backslashes
        lines.append(b"%b\t%b\n" % (body, sha256(piece).hexdigest().encode()))
    client = time.process_time() - start
    stage = f"bench_derive_stage_{uuid.uuid4().hex[:8]}"
    columns = ", ".join(f'"{c}"' for c in writer.dialect.written_columns)
    pg, wall = _postgres_cpu_s(), time.perf_counter()
    with conn.cursor() as cur:
        cur.execute(f"CREATE TEMP TABLE {stage} (d jsonb, wire_hash text) ON COMMIT DROP")
        with cur.copy(f"COPY {stage} FROM STDIN") as copy:
            for block in _blocks(lines):
                copy.write(block)
        copied, pg_copied = time.perf_counter(), _postgres_cpu_s()
        cur.execute(_DERIVE.format(target=writer.table, columns=columns, stage=stage), (datetime.now(UTC), "bench"))
        assert cur.rowcount == len(pieces)
    conn.commit()
    return {"client_cpu_s": client, "copy_s": copied - wall, "copy_pg_cpu_s": pg_copied - pg,
            "derive_s": time.perf_counter() - copied, "derive_pg_cpu_s": _postgres_cpu_s() - pg_copied}


def main(argv: list[str] | None = None) -> int:
    import psycopg

    from airflow_provider_bos.warehouse import WarehouseWriter

    parser = argparse.ArgumentParser(prog="python -m bench.derive", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    args = parser.parse_args(argv)

    pieces = _wire_pieces(args.records)
    engine = sa.create_engine(args.pg_url)
    dsn = sa.make_url(args.pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    ways = {"client derives": client_derives, "PostgreSQL derives": postgres_derives}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in ways}
    print(f"bench.derive {datetime.now(UTC):%Y-%m-%d %H:%M}Z  {args.records:,} records  "
          f"{args.repeat} interleaved rounds")
    try:
        for _ in range(args.repeat):
            for name, way in ways.items():
                table = f"bench_derive_{uuid.uuid4().hex[:8]}"
                writer = WarehouseWriter(engine, table=table, audit_table=f"{table}_runs")
                writer.ensure_tables()
                try:
                    with psycopg.connect(dsn) as conn:
                        results[name].append(way(conn, writer, pieces))
                finally:
                    with engine.begin() as conn:
                        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
                        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}_runs")
    finally:
        engine.dispose()
    print(f"{'way':20s} {'client cpu s':>12s} {'COPY s':>8s} {'COPY pg cpu':>11s} {'INSERT..SELECT s':>16s} "
          f"{'its pg cpu':>10s} {'end to end s (est.)':>20s}")
    for name, rounds in results.items():
        med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        estimate = max(med["client_cpu_s"], med["copy_s"]) + med["derive_s"]
        print(f"{name:20s} {med['client_cpu_s']:12.2f} {med['copy_s']:8.2f} {med['copy_pg_cpu_s']:11.2f} "
              f"{med['derive_s']:16.2f} {med['derive_pg_cpu_s']:10.2f} {estimate:20.2f}")
    print("medians; end to end = max(client, COPY) + INSERT ... SELECT (the read, common to both, left out)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

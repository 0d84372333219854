"""A resumed read vs an uninterrupted one: ``python -m bench.resume``.

Two reference servers (live, 2025-11-25 session era, so the stream carries event ids and can be
resumed; the replay feed cannot resume) serve the same 200k-record read. One of them ends the POST
response halfway through the final frame's ``structuredContent`` (``close_mid_records_bytes``):
the client resumes with ``GET`` + ``Last-Event-ID``, the frame comes again from its start, and the
writer discards the half it had loaded (``ROLLBACK TO SAVEPOINT``). Each sync lands the read into
a new, empty PostgreSQL table (the direct COPY load). The two kinds of sync are interleaved,
``--repeat`` times each; the table prints the median and the spread of each and their ratio.

Expected: the resumed sync costs about the re-sent half of the final frame on top (the pages
are not sent again: they precede the final's event id), i.e. well under 2x.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from bench.grant import BearerAuth, mint_access_token
from bench.procs import ReferenceServerProcess

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _structured_bytes(scenario: Any) -> int:
    """Bytes of the final's records array in ``structuredContent`` (compact JSON)."""
    from airflow_provider_bos.testing.federation import plan_read

    read = plan_read(scenario, request_id="x", context={"context_handle": "x"}, arguments={})
    return sum(len(json.dumps(r, separators=(",", ":"), ensure_ascii=False).encode()) + 1
               for r in read.iter_final_records())


def _sync(mcp_url: str, token: str, db_url: str) -> dict[str, Any]:
    from airflow_provider_bos.mcp import McpSession
    from airflow_provider_bos.sync import run_sync
    from airflow_provider_bos.warehouse import SyncRunInfo, WarehouseWriter

    table = f"bench_resume_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(db_url)
    client = httpx.Client(timeout=httpx.Timeout(120.0), follow_redirects=False)
    try:
        writer = WarehouseWriter(engine, table=table, audit_table=f"{table}_runs")
        run = SyncRunInfo(run_id=str(uuid.uuid4()), conn_id="bench", tool_name="people.search", arguments_hash="0")
        start, cpu = time.perf_counter(), time.process_time()
        with McpSession(mcp_url, auth=BearerAuth(token), http_client=client, era="2025-11-25",
                        timeout=120.0) as session:
            outcome = run_sync(session.federated_read, writer, run, tool_name="people.search", arguments={},
                               via="execute", stream=True)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
        return {"seconds": seconds, "cpu_seconds": cpu_seconds, "inserted": outcome.counts.inserted,
                "resumptions": outcome.result.observations.stream_resumptions, "status": outcome.status}
    finally:
        client.close()
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}_runs")
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.resume", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    args = parser.parse_args(argv)

    from airflow_provider_bos.testing.scenario import FaultSpec, large_scenario

    clean = large_scenario(args.records, sources=4)
    clean.faults = FaultSpec(sse_retry_ms=10)
    cut_at = _structured_bytes(clean) // 2
    resumed = clean.model_copy(update={"faults": FaultSpec(sse_retry_ms=10, close_mid_records_bytes=cut_at)})
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        servers = {}
        try:
            for name, sc in (("uninterrupted", clean), ("resumed", resumed)):
                workdir = Path(tmp) / name
                workdir.mkdir()
                servers[name] = ReferenceServerProcess(sc.model_dump_json(), workdir)
                servers[name].start()
            tokens = {name: mint_access_token(s.mcp_url) for name, s in servers.items()}
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
            for i in range(args.repeat):
                for name, server in servers.items():
                    result = _sync(server.mcp_url, tokens[name], args.pg_url)
                    runs[name].append(result)
                    print(f"  {name} #{i + 1}: {result['seconds']:.2f} s (cpu {result['cpu_seconds']:.2f} s), "
                          f"inserted {result['inserted']}, resumptions {result['resumptions']}", file=sys.stderr)
        finally:
            for server in servers.values():
                server.stop()

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    print(f"\n{args.records:,} records, PostgreSQL, live reference server (2025-11-25), median of {args.repeat}; "
          f"cut {cut_at:,} bytes into structuredContent")
    print("| sync | median s | spread s | cpu s (median) | inserted | resumptions |")
    print("|---|---|---|---|---|---|")
    for name in runs:
        times = [r["seconds"] for r in runs[name]]
        print(f"| {name} | {median(name, 'seconds'):.2f} | {min(times):.2f}-{max(times):.2f} | "
              f"{median(name, 'cpu_seconds'):.2f} | {runs[name][0]['inserted']:,} | {runs[name][0]['resumptions']} |")
    ratio = median("resumed", "seconds") / median("uninterrupted", "seconds")
    print(f"\nresumed / uninterrupted = {ratio:.2f}x")
    ok = all(r["inserted"] == args.records and r["status"] == "complete" for rs in runs.values() for r in rs)
    ok = ok and all(r["resumptions"] == 1 for r in runs["resumed"])
    print("every sync landed every record once" + ("" if ok else ": NO (see above)"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

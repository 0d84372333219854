"""Statements a Snowflake sync sends, counted at the connector (``python -m bench.snowflake_statements``).

Runs :class:`~airflow_provider_bos.warehouse.WarehouseWriter` against a fakesnow server (the
connector's own HTTP protocol, DuckDB underneath) for a first sync of N records and an unchanged
re-run, and counts every statement ``SnowflakeCursor.execute`` sends (the connector's multi-row
INSERT rewrite of ``executemany`` is one). Correctness and statement counts only: fakesnow's speed
says nothing about Snowflake's. Needs the ``[snowflake-test]`` venv (.ci/constraints-snowflake.txt).
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.warehouse import SyncRunInfo, WarehouseWriter
from airflow_provider_bos.wire import WriteOptions


def _records(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {
            "record_ref": f"bos:person:{i:07d}", "display_name": f"Person {i}", "email": f"p{i}@example.com",
            "phone": None, "lifecycle": {"state": "active"}, "identity_match": None,
            "attributes": {"dept": "eng", "level": i % 7},
            "sources": [{"source_type": "crm", "source_identity": "crm-eu", "external_id": str(i),
                         "record_type": "person", "observed_at": "2026-10-08T12:00:00Z"}],
        }


def _kind(sql: str) -> str:
    words = sql.split()
    head = " ".join(words[:3]).upper()
    if head.startswith("INSERT INTO BOS_STAGE_") and ") VALUES (" in sql:
        return "INSERT staging (multi-row)"
    return words[0].upper() if words else "?"


def run(sizes: list[int]) -> Iterator[tuple[int, str, int, Counter[str], float]]:
    """(records, run, statements, statements by kind, seconds) of a first sync and a re-run per size,
    all on one fakesnow server (``fakesnow.server()`` can be entered once per process)."""
    import fakesnow
    from snowflake.connector.cursor import SnowflakeCursor

    os.environ["SNOWFLAKE_SQLALCHEMY_LEGACY_URL_PARAMS"] = "1"
    sent: list[str] = []
    execute = SnowflakeCursor.execute

    def counting(self: Any, command: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(command)
        return execute(self, command, *args, **kwargs)

    SnowflakeCursor.execute = counting  # type: ignore[method-assign]
    with fakesnow.server() as kw:
        url = (f"snowflake://{kw['user']}:{kw['password']}@{kw['account']}/bench/public"
               f"?host={kw['host']}&port={kw['port']}&protocol={kw['protocol']}")
        # A long INSERT under load must not time out: the connector would retry it with the same
        # request id, which Snowflake answers once but fakesnow runs again.
        engine = sa.create_engine(url, connect_args={"network_timeout": 3600, "socket_timeout": 3600})
        for n in sizes:
            table = f"bench_{uuid.uuid4().hex[:8]}"
            writer = WarehouseWriter(engine, table=table, audit_table=f"{table}_runs")
            writer.ensure_tables()
            for label in ("first sync", "unchanged re-run"):
                sent.clear()
                started = time.perf_counter()
                counts = writer.write_run(SyncRunInfo(), _records(n), WriteOptions(audit={"status": "complete"}))
                elapsed = time.perf_counter() - started
                assert counts.received == n, counts
                yield n, label, len(sent), Counter(_kind(s) for s in sent), elapsed
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, nargs="+", default=[200_000])
    args = parser.parse_args()
    print("| records | run | statements | of which staging INSERTs | fakesnow wall s |")
    print("|---:|---|---:|---:|---:|")
    for n, label, total, kinds, elapsed in run(args.records):
        print(f"| {n} | {label} | {total} | {kinds['INSERT staging (multi-row)']} | {elapsed:.0f} |", flush=True)
        print(f"<!-- {dict(kinds)} -->", flush=True)


if __name__ == "__main__":
    main()

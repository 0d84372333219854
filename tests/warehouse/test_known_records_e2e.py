"""End to end: reference server over loopback -> McpSession (streamed final frame) -> run_sync -> database.

A re-run on unchanged data lets every record through as a KnownRecord claim (none decoded) and
writes nothing (on PostgreSQL the claims are not even staged: the table's state token confirms
them); after the server's data changes, only the changed records are decoded and written, and the
table ends up exactly as a fresh sync of the new data would leave it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import sqlalchemy as sa
from whhelpers import statements

from airflow_provider_bos.mcp import McpSession
from airflow_provider_bos.sync import run_sync
from airflow_provider_bos.testing.scenario import large_scenario
from airflow_provider_bos.warehouse import SyncRunInfo, WarehouseWriter

RECORDS = 600
CONTENT = ("record_ref", "display_name", "email", "phone", "lifecycle", "identity_match", "attributes", "sources",
           "_bos_observed_at", "_bos_record_hash", "_bos_wire_hash")


def sync(server: Any, writer: WarehouseWriter) -> Any:
    token = server.mint_grant()["access_token"]
    client = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30.0)
    # A small stream threshold: this 600-record frame streams through the scanner like a big one.
    with client, McpSession(server.mcp_url, http_client=client, timeout=30.0, stream_threshold_bytes=4096) as session:
        run = SyncRunInfo(run_id=str(uuid.uuid4()), conn_id="e2e", tool_name="people.search")
        return run_sync(session.federated_read, writer, run, tool_name="people.search", arguments={},
                        via="execute", stream=True)


def unstamped(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``content`` rows without what a re-stamping read moves: the provenance stamps and
    ``_bos_observed_at`` (the record hash is the content's: it stays)."""
    stamp = re.compile(r"""["']observed_at["']: ?["'][^"']*["']""")  # JSON text, or a driver's dict
    return [tuple(stamp.sub("", value) for name, value in zip(CONTENT, row, strict=True)
                  if name != "_bos_observed_at") for row in rows]


def content(engine: sa.Engine, table: str) -> list[tuple[Any, ...]]:
    cols = ", ".join(CONTENT)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(f"SELECT {cols} FROM {table} ORDER BY record_ref")
        return [tuple(map(repr, row)) for row in rows]


def test_reruns_skip_decoding_byte_identical_records(
    bos_server_factory: Callable[..., Any], make_writer: Callable[..., WarehouseWriter], engine: sa.Engine
) -> None:
    server = bos_server_factory(scenario=large_scenario(RECORDS, sources=3, page_size=50))
    writer = make_writer()

    first = sync(server, writer)
    assert (first.counts.inserted, first.result.known_records) == (RECORDS, 0)
    before = content(engine, writer.table)

    with statements(engine) as seen:
        again = sync(server, writer)
    assert again.result.known_records == RECORDS  # not one record decoded
    if engine.dialect.name == "postgresql":  # the claims were confirmed at once, none staged and joined
        assert any("HASHTEXTEXTENDED" in sql for sql in seen)
        # (the catalog look-up for a personal-data policy table joins pg_catalog tables: not claims)
        joined = [sql for sql in seen if re.search(r"\bJOIN\b", sql) and "pg_catalog." not in sql]
        assert not joined, joined
    assert (again.counts.inserted, again.counts.updated, again.counts.unchanged) == (0, 0, RECORDS)
    assert again.status == "complete" and content(engine, writer.table) == before

    server.set_scenario(large_scenario(RECORDS, sources=3, page_size=50, revision=1))
    changed = sync(server, writer)
    decoded = RECORDS - changed.result.known_records
    assert 0 < decoded < RECORDS
    assert (changed.counts.updated, changed.counts.unchanged) == (decoded, RECORDS - decoded)

    fresh = make_writer(table=f"{writer.table}_fresh", audit_table=f"{writer.table}_fresh_runs")
    sync(server, fresh)
    # The same content as a fresh load of the changed read; the rows nobody changed keep the
    # provenance stamps of the read that wrote them (the fresh load's read re-stamped them).
    assert unstamped(content(engine, writer.table)) == unstamped(content(engine, fresh.table))

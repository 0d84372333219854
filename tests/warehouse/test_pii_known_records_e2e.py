"""End to end under a personal-data policy: reference server -> McpSession (streamed final frame) ->
run_sync -> database, on every dialect.

The stored wire hashes are keyed (BLAKE2b of the raw wire hash under a key derived from the policy's:
none equals the hash a run without a policy stores), and a re-run of unchanged data still lets every
record through as a claim, matched through the key and confirmed by the writer: nothing decoded,
nothing written. So does a table whose wire hashes were keyed with HMAC-SHA-256, as before BLAKE2b.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import httpx
import sqlalchemy as sa

from airflow_provider_bos.mcp import McpSession
from airflow_provider_bos.pii import PiiKey, PiiPolicy
from airflow_provider_bos.pii.stream import PolicyRun
from airflow_provider_bos.sync import run_sync
from airflow_provider_bos.testing.scenario import large_scenario
from airflow_provider_bos.warehouse import SyncRunInfo, WarehouseWriter
from airflow_provider_bos.warehouse.tables.schema import companion_table_name
from tests.pii.conftest import hmac_wire_hash, reference_wire_hash

RECORDS = 600
KEY_TEXT = "_PlMrMQzbNMmDslAZ9_9RVz7fk3APlm_CqzhGYaltnY"
POLICY = {"email": "hash", "phone": "hash", "attributes.employment.*": "drop"}


def sync(server: Any, writer: WarehouseWriter, pii: PolicyRun | None) -> Any:
    token = server.mint_grant()["access_token"]
    client = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30.0)
    # A small stream threshold: this 600-record frame streams through the scanner like a big one.
    with client, McpSession(server.mcp_url, http_client=client, timeout=30.0, stream_threshold_bytes=4096) as session:
        run = SyncRunInfo(run_id=str(uuid.uuid4()), conn_id="e2e", tool_name="people.search")
        return run_sync(session.federated_read, writer, run, tool_name="people.search", arguments={},
                        via="execute", stream=True, pii=pii)


def wire_hashes(engine: sa.Engine, table: str) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.exec_driver_sql(f"SELECT record_ref, _bos_wire_hash FROM {table}").all())


def test_a_policy_re_run_skips_decoding_through_the_keyed_wire_hashes(
    bos_server_factory: Callable[..., Any], make_writer: Callable[..., WarehouseWriter], engine: sa.Engine,
) -> None:
    server = bos_server_factory(scenario=large_scenario(RECORDS, sources=3, page_size=50))
    writer, plain = make_writer(), make_writer(table=f"plain_{uuid.uuid4().hex[:8]}")
    pii = PolicyRun.of(PiiPolicy.parse(POLICY), PiiKey.from_text(KEY_TEXT, source="the test"))
    try:
        first = sync(server, writer, pii)
        assert (first.counts.inserted, first.result.known_records) == (RECORDS, 0)
        sync(server, plain, None)
        keyed, raw = wire_hashes(engine, writer.table), wire_hashes(engine, plain.table)
        assert keyed == {ref: reference_wire_hash(KEY_TEXT, h) for ref, h in raw.items()}

        again = sync(server, writer, pii)
        assert again.result.known_records == RECORDS  # not one record decoded
        assert (again.counts.inserted, again.counts.updated, again.counts.unchanged) == (0, 0, RECORDS)
        assert wire_hashes(engine, writer.table) == keyed
    finally:
        with engine.begin() as conn:
            for table in (writer.table, plain.table):
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {companion_table_name(table, 'policy')}")


def test_a_table_with_hmac_keyed_wire_hashes_still_skips_decoding_and_rewrites_nothing(
    bos_server_factory: Callable[..., Any], make_writer: Callable[..., WarehouseWriter], engine: sa.Engine,
) -> None:
    server = bos_server_factory(scenario=large_scenario(RECORDS, sources=3, page_size=50))
    writer, plain = make_writer(), make_writer(table=f"plain_{uuid.uuid4().hex[:8]}")
    pii = PolicyRun.of(PiiPolicy.parse(POLICY), PiiKey.from_text(KEY_TEXT, source="the test"))
    try:
        sync(server, writer, pii)
        sync(server, plain, None)
        # The table as the HMAC-SHA-256 form left it: the same rows, each wire hash keyed that way.
        earlier = {ref: hmac_wire_hash(KEY_TEXT, h) for ref, h in wire_hashes(engine, plain.table).items()}
        with engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {writer.table} SET _bos_wire_hash = :h WHERE record_ref = :ref"),
                         [{"h": h, "ref": ref} for ref, h in earlier.items()])

        again = sync(server, writer, pii)
        assert again.result.known_records == RECORDS  # matched in the earlier form: not one decoded
        assert (again.counts.inserted, again.counts.updated, again.counts.unchanged) == (0, 0, RECORDS)
        assert wire_hashes(engine, writer.table) == earlier
    finally:
        with engine.begin() as conn:
            for table in (writer.table, plain.table):
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {companion_table_name(table, 'policy')}")

"""Shared pieces of the reliability tests: a small fault scenario, expected records, table seeding."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from afhelpers import table_dump

from airflow_provider_bos.testing.federation import plan_read
from airflow_provider_bos.testing.scenario import FaultSpec, Scenario, SourceSpec
from airflow_provider_bos.warehouse import SyncRunInfo, WarehouseWriter
from airflow_provider_bos.wire import WriteOptions

# Small, but with everything that matters: two sources, several pages each, shared people (merged in
# the final), so provisional and final refs differ and a half-written table would be visible.
BASE = Scenario(
    name="fault-matrix",
    seed=7,
    shared_people=6,
    sources=[
        SourceSpec(source_type="crm", source_identity="crm-eu", records=40, page_size=10),
        SourceSpec(source_type="hr", source_identity="hr-main", records=25, page_size=10),
    ],
)


def scenario(*, revision: int = 1, **faults: Any) -> Scenario:
    return BASE.model_copy(update={"revision": revision, "faults": FaultSpec(**faults)})


def final_records(sc: Scenario) -> list[dict[str, Any]]:
    read = plan_read(sc, request_id="expected", context={"context_handle": "x"}, arguments={})
    return list(read.iter_final_records())


def final_refs(sc: Scenario) -> set[str]:
    return {r["record_ref"] for r in final_records(sc)}


def table_refs(engine: sa.Engine, table: str) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.text(f"SELECT record_ref FROM {table}")).scalars())


def audits(engine: sa.Engine, audit_table: str) -> list[dict[str, Any]]:
    if not sa.inspect(engine).has_table(audit_table):
        return []
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT * FROM {audit_table} ORDER BY started_at")).mappings().all()
    return [dict(r) for r in rows]


def seed_table(env: dict[str, Any], records: list[dict[str, Any]] | None = None) -> list[tuple]:
    """Land revision 0 of the scenario directly (no DAG run): the 'old state' faults must preserve."""
    records = final_records(BASE) if records is None else records
    writer = WarehouseWriter(env["engine"], table=env["table"], audit_table=env["audit"])
    writer.ensure_tables()
    run = SyncRunInfo(run_id=str(uuid.uuid4()), dag_id="seed", task_id="seed", airflow_run_id="seed",
                      conn_id="bos_default", context_handle=None, tool_name="people.search",
                      arguments_hash="seed", started_at=datetime.now(UTC))
    audit = {"completeness": "complete", "status": "complete", "result_count": len(records), "source_errors": [],
             "source_summary": [], "provisional_records": 0, "provisional_pages": 0}
    writer.write_run(run, records, WriteOptions(audit=audit, default_observed_at=BASE.observed_at))
    return table_dump(env["engine"], env["table"])

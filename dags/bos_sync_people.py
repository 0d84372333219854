"""Hourly BOS people sync: federated read -> warehouse -> completeness check -> downstream use.

Connections: ``bos_default`` (type bos, see README) and ``bos_warehouse`` (sqlite/postgres/mysql).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG, task

from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator
from airflow_provider_bos.sensors.completeness import BosCompletenessSensor

WAREHOUSE_CONN_ID = "bos_warehouse"
PEOPLE_TABLE = "bos_people"

with DAG(
    dag_id="bos_sync_people",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
    tags=["bos", "example"],
    doc_md=__doc__,
):
    sync_people = BosFederatedReadOperator(
        task_id="sync_people",
        bos_conn_id="bos_default",
        tool_name="people.search",
        # Arguments are templated: each run asks for what changed since its interval began.
        arguments={"updated_since": "{{ data_interval_start.isoformat() }}"},
        destination_conn_id=WAREHOUSE_CONN_ID,
        destination_table=PEOPLE_TABLE,
    )

    check_completeness = BosCompletenessSensor(
        task_id="check_completeness",
        destination_conn_id=WAREHOUSE_CONN_ID,
        sync_task_id="sync_people",
        on_partial="fail",
        # An incremental read (updated_since) is empty in a quiet hour: that is complete, not broken.
        min_records=0,
        mode="reschedule",
        poke_interval=30,
        timeout=600,
    )

    @task
    def summarize_people() -> dict[str, int]:
        """Downstream consumer: reads the synced table (only after the completeness check passed)."""
        from sqlalchemy import text

        from airflow_provider_bos.hooks.connections import engine_for_connection

        engine = engine_for_connection(WAREHOUSE_CONN_ID)
        # Current people only: a record BOS merged into another is kept, retired (docs/sync-modes.md).
        with engine.connect() as conn:
            total = conn.execute(
                text(f"SELECT COUNT(*) FROM {PEOPLE_TABLE} WHERE _bos_deleted_at IS NULL")
            ).scalar_one()
            with_email = conn.execute(
                text(f"SELECT COUNT(*) FROM {PEOPLE_TABLE} WHERE _bos_deleted_at IS NULL AND email IS NOT NULL")
            ).scalar_one()
        print(f"bos_people: {total} people, {with_email} with an email address")
        return {"people": int(total), "with_email": int(with_email)}

    sync_people >> check_completeness >> summarize_people()

"""Deployment-test DAGs: 8 mapped reads into 8 tables then a sensor per table; one read to kill.

The table names and the expected record count come from the environment the test gives every
Airflow component (the DAG processor and the workers must agree on them).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator
from airflow_provider_bos.sensors.completeness import BosCompletenessSensor

PREFIX = os.environ.get("BOS_DEPLOY_TABLE_PREFIX", "bos_deploy")
TABLES = [f"{PREFIX}_t{i}" for i in range(8)]
RECORDS = int(os.environ.get("BOS_DEPLOY_RECORDS", "1"))

with DAG(
    dag_id="bos_deploy_sync",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_tasks=8,
    tags=["bos-test"],
):
    reads = BosFederatedReadOperator.partial(
        task_id="read",
        tool_name="people.search",
        destination_conn_id="bos_warehouse",
        read_deadline=timedelta(minutes=3),
    ).expand(destination_table=TABLES)
    # A mapped sensor pulls the run id of the read with its own map index, i.e. its own table.
    checks = BosCompletenessSensor.partial(
        task_id="check",
        destination_conn_id="bos_warehouse",
        sync_task_id="read",
        poke_interval=1,
        timeout=60,
    ).expand(min_records=[RECORDS] * len(TABLES))
    reads >> checks

with DAG(
    dag_id="bos_deploy_kill",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["bos-test"],
):
    BosFederatedReadOperator(
        task_id="read",
        tool_name="people.search",
        destination_conn_id="bos_warehouse",
        destination_table=f"{PREFIX}_kill",
        read_deadline=timedelta(minutes=3),
        retries=1,
        retry_delay=timedelta(seconds=1),
    )

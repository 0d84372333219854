"""Test DAG for the reliability tests: ONE BOS read task, no sensor, configured by environment.

Variables (read at parse time): BOS_TEST_TABLE, BOS_TEST_AUDIT_TABLE, BOS_TEST_TOOL, BOS_TEST_VIA,
BOS_TEST_STREAM, BOS_TEST_DEADLINE_S, BOS_TEST_CONN_ID, BOS_TEST_BATCH_SIZE.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator

env = os.environ.get

with DAG(
    dag_id="bos_test_faults",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["bos-test"],
):
    BosFederatedReadOperator(
        task_id="sync",
        bos_conn_id=env("BOS_TEST_CONN_ID", "bos_default"),
        tool_name=env("BOS_TEST_TOOL", "people.search"),
        via=env("BOS_TEST_VIA", "auto"),
        arguments={"query": "{{ dag_run.run_id }}"},
        destination_conn_id="bos_warehouse",
        destination_table=env("BOS_TEST_TABLE", "bos_records"),
        audit_table=env("BOS_TEST_AUDIT_TABLE", "bos_sync_runs"),
        stream=env("BOS_TEST_STREAM", "1") == "1",
        batch_size=int(env("BOS_TEST_BATCH_SIZE", "5000")),
        read_deadline=timedelta(seconds=float(env("BOS_TEST_DEADLINE_S", "60"))),
        retries=0,
    )

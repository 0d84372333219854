"""Test DAG: a full read that holds a mass retirement (on_retire_guard="ask") -> a person decides.

Configured by environment variables as bos_test_days.py (``BOS_TEST_TABLE``, ``BOS_TEST_AUDIT_TABLE``,
``BOS_TEST_DELETIONS``, ``BOS_TEST_HISTORY``).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator
from airflow_provider_bos.operators.retirement_approval import retirement_approval

env = os.environ.get

with DAG(
    dag_id="bos_test_retirement_approval",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["bos-test"],
):
    sync = BosFederatedReadOperator(
        task_id="sync",
        tool_name="people.search",
        arguments={},
        destination_conn_id="bos_warehouse",
        destination_table=env("BOS_TEST_TABLE", "bos_records"),
        audit_table=env("BOS_TEST_AUDIT_TABLE", "bos_sync_runs"),
        sync_mode="full",
        deletions=env("BOS_TEST_DELETIONS", "soft"),
        history=env("BOS_TEST_HISTORY", "0") == "1",
        max_retire_fraction=0.5,
        on_retire_guard="ask",
        read_deadline=timedelta(seconds=60),
    )
    retirement_approval(sync, response_timeout=timedelta(minutes=5))

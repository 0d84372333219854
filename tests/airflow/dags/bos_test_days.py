"""Test DAG: one BOS read of a scenario's day -> warehouse (sync mode, history, guard) -> sensor.

Configured by environment variables so each end-to-end test of identities over time can vary it
(``BOS_TEST_PII_POLICY``: the personal-data policy as JSON; ``BOS_TEST_PII_KEY_CONN``: its key's connection;
``BOS_TEST_ATTRIBUTE_COLUMNS``: promoted attributes as JSON; ``BOS_TEST_ATTRIBUTE_TYPE_ERRORS``).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator
from airflow_provider_bos.sensors.completeness import BosCompletenessSensor

env = os.environ.get

with DAG(
    dag_id="bos_test_days",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["bos-test"],
):
    fraction = env("BOS_TEST_MAX_RETIRE_FRACTION", "0.5")
    max_retired = env("BOS_TEST_MAX_RETIRED")
    sync = BosFederatedReadOperator(
        task_id="sync",
        tool_name="people.search",
        arguments={},
        destination_conn_id="bos_warehouse",
        destination_table=env("BOS_TEST_TABLE", "bos_records"),
        audit_table=env("BOS_TEST_AUDIT_TABLE", "bos_sync_runs"),
        sync_mode=env("BOS_TEST_SYNC_MODE", "incremental"),
        deletions=env("BOS_TEST_DELETIONS", "soft"),
        history=env("BOS_TEST_HISTORY", "0") == "1",
        max_retire_fraction=None if fraction == "none" else float(fraction),
        read_deadline=timedelta(seconds=60),
        pii_policy=json.loads(env("BOS_TEST_PII_POLICY", "null")),
        pii_key_conn_id=env("BOS_TEST_PII_KEY_CONN", "bos_pii_key"),
        invalid_records=env("BOS_TEST_INVALID_RECORDS", "fail"),
        attribute_columns=json.loads(env("BOS_TEST_ATTRIBUTE_COLUMNS", "null")),
        attribute_type_errors=env("BOS_TEST_ATTRIBUTE_TYPE_ERRORS", "invalid_records"),
    )
    check = BosCompletenessSensor(
        task_id="check",
        destination_conn_id="bos_warehouse",
        audit_table=env("BOS_TEST_AUDIT_TABLE", "bos_sync_runs"),
        sync_task_id="sync",
        on_partial="fail",
        min_records=0,
        max_retired=int(max_retired) if max_retired else None,
        poke_interval=1,
        timeout=30,
    )
    sync >> check

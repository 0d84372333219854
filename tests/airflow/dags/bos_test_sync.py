"""Test DAG: one BOS read -> warehouse -> completeness sensor -> downstream marker task.

Configured by environment variables so each end-to-end test can vary the read and the sensor.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, task

from airflow_provider_bos.notifiers import BosAlertFileNotifier
from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator
from airflow_provider_bos.sensors.completeness import BosCompletenessSensor

env = os.environ.get

with DAG(
    dag_id="bos_test_sync",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["bos-test"],
    render_template_as_native_obj=env("BOS_TEST_NATIVE", "0") == "1",
):
    sync = BosFederatedReadOperator(
        task_id="sync",
        tool_name=env("BOS_TEST_TOOL", "people.search"),
        via=env("BOS_TEST_VIA", "auto"),
        arguments=json.loads(env("BOS_TEST_ARGUMENTS", '{"query": "{{ dag_run.run_id }}"}')),
        destination_conn_id="bos_warehouse",
        destination_table=env("BOS_TEST_TABLE", "bos_records"),
        stream=env("BOS_TEST_STREAM", "1") == "1",
        fail_on_partial=env("BOS_TEST_FAIL_ON_PARTIAL", "0") == "1",
        read_deadline=timedelta(seconds=float(env("BOS_TEST_DEADLINE_S", "60"))),
        invalid_records=env("BOS_TEST_INVALID_RECORDS", "fail"),
        attribute_columns=json.loads(env("BOS_TEST_ATTRIBUTE_COLUMNS", "null")),
    )

    check = BosCompletenessSensor(
        task_id="check",
        destination_conn_id="bos_warehouse",
        sync_task_id="sync",
        on_partial=env("BOS_TEST_ON_PARTIAL", "fail"),
        min_records=int(env("BOS_TEST_MIN_RECORDS", "1")),
        min_coverage=json.loads(env("BOS_TEST_MIN_COVERAGE", "null")),
        notifiers=[BosAlertFileNotifier(path=env("BOS_TEST_ALERTS_FILE"))] if env("BOS_TEST_ALERTS_FILE") else [],
        poke_interval=1,
        timeout=30,
    )

    @task
    def downstream() -> str:
        marker = env("BOS_TEST_MARKER")
        if marker:
            with open(marker, "a", encoding="utf-8") as fh:
                fh.write("downstream ran\n")
        return "ok"

    sync >> check >> downstream()


with DAG(
    dag_id="bos_test_monitor",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["bos-test"],
):
    watch = BosCompletenessSensor(
        task_id="watch",
        destination_conn_id="bos_warehouse",
        bos_conn_id="bos_default",
        context_handle=env("BOS_TEST_MONITOR_CONTEXT") or None,
        tool_name=env("BOS_TEST_TOOL", "people.search"),
        max_age=timedelta(seconds=float(env("BOS_TEST_MAX_AGE_S", "3600"))),
        on_partial=env("BOS_TEST_ON_PARTIAL", "fail"),
        min_records=int(env("BOS_TEST_MIN_RECORDS", "1")),
        notifiers=[BosAlertFileNotifier(path=env("BOS_TEST_ALERTS_FILE"))] if env("BOS_TEST_ALERTS_FILE") else [],
        poke_interval=1,
        timeout=5,
    )

    @task
    def after_watch() -> str:
        marker = env("BOS_TEST_MARKER")
        if marker:
            with open(marker, "a", encoding="utf-8") as fh:
                fh.write("after_watch ran\n")
        return "ok"

    watch >> after_watch()

"""Watch the latest BOS people sync from outside its DAG: alert on partial, failed or stale data.

Swap ``BosAlertFileNotifier`` for ``SmtpNotifier`` / ``SlackNotifier`` in production.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_bos.notifiers import BosAlertFileNotifier
from airflow_provider_bos.sensors.completeness import BosCompletenessSensor

ALERTS_FILE = os.environ.get("BOS_ALERTS_FILE", "{{ var.value.get('bos_alerts_file', '/tmp/bos_alerts.jsonl') }}")

with DAG(
    dag_id="bos_completeness_monitor",
    schedule="*/30 * * * *",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["bos", "example", "monitoring"],
    doc_md=__doc__,
):
    BosCompletenessSensor(
        task_id="watch_people_sync",
        destination_conn_id="bos_warehouse",
        bos_conn_id="bos_default",
        tool_name="people.search",
        max_age=timedelta(hours=2),
        min_records=1,
        on_partial="alert",
        notifiers=[BosAlertFileNotifier(path=ALERTS_FILE)],
        mode="reschedule",
        poke_interval=60,
        timeout=900,
    )

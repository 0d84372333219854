"""Daily full BOS people sync: the table follows who joined, left, was merged or split (docs/sync-modes.md).

A ``full`` read returns every person of its scope: a complete one retires who is gone
(``_bos_deleted_at``), supersedes records BOS merged or split (``_bos_superseded_by``, and
``bos_people_daily_lineage``), and ``history=True`` keeps every version in
``bos_people_daily_history``. A partial read retires nothing; the guard keeps a suspiciously large
retirement (an empty result, a wrong context) from happening, and the sensor then stops the DAG.

Personal data (docs/personal-data.md): the table stores each person's email and phone only as keyed
hashes (HMAC-SHA-256; join or look a person up with ``airflow-provider-bos pii-hash``) and never
the ``attributes.employment`` subtree; the history table, staged files, XCom, logs and lineage
likewise. The key is the password of the ``bos_pii_key`` connection (any type), read by the task,
never by this file: parsing the DAG needs no key. Create it once, e.g.
``airflow connections add bos_pii_key --conn-type generic --conn-password "$(python -c 'import
secrets; print(secrets.token_urlsafe(48))')"``, and keep it: the table refuses a run under another
key or policy.

Analysts (docs/analytics.md): ``attributes.department`` is kept as a ``department`` column too, and
``bos_people_daily_sources`` holds one row per person per source id.

Alerts (docs/operators.md, "Deadlines and alerts"): a read the sensor judges partial fails it, and a run
not finished within ``SYNC_WINDOW`` of being queued misses its deadline (Airflow 3.1+, the triggerer
runs the callback); both append a line to the alerts file (``BOS_ALERTS_FILE``, default
``/tmp/bos_alerts.jsonl``) through the provider's notifier. Swap it for ``SmtpNotifier`` or
``SlackNotifier`` in production.

Connections: ``bos_default`` (type bos), ``bos_warehouse`` (sqlite/postgres/mysql) and ``bos_pii_key``.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, task
from airflow.sdk.definitions.deadline import AsyncCallback, DeadlineAlert, DeadlineReference  # Airflow 3.1+

from airflow_provider_bos.notifiers import BosAlertFileNotifier
from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator
from airflow_provider_bos.sensors.completeness import BosCompletenessSensor

WAREHOUSE_CONN_ID = "bos_warehouse"
PEOPLE_TABLE = "bos_people_daily"
# What the table may hold of a person: hashed or dropped fields never reach it in clear.
PERSONAL_DATA_POLICY = {"email": "hash", "phone": "hash", "attributes.employment.*": "drop"}
# Read when the file is parsed: the deadline's callback runs in the triggerer, outside any task.
ALERTS_FILE = os.environ.get("BOS_ALERTS_FILE", "/tmp/bos_alerts.jsonl")  # noqa: S108 - a demo default
# How long a run may take from being queued: the read, the sensor and the count, with room for retries.
SYNC_WINDOW = timedelta(hours=2)

with DAG(
    dag_id="bos_sync_people_daily",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
    tags=["bos", "example"],
    doc_md=__doc__,
    deadline=DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=SYNC_WINDOW,
        callback=AsyncCallback(BosAlertFileNotifier, kwargs={"path": ALERTS_FILE}),
    ),
):
    sync_people = BosFederatedReadOperator(
        task_id="sync_people",
        bos_conn_id="bos_default",
        tool_name="people.search",
        arguments={},  # everyone: the same arguments every day, so the same scope
        destination_conn_id=WAREHOUSE_CONN_ID,
        destination_table=PEOPLE_TABLE,
        sync_mode="full",
        history=True,
        max_retire_fraction=0.5,
        pii_policy=PERSONAL_DATA_POLICY,
        pii_key_conn_id="bos_pii_key",
        # A typed column analysts group by (docs/analytics.md); the attributes JSON keeps it too.
        attribute_columns={"department": "attributes.department"},
    )

    check_completeness = BosCompletenessSensor(
        task_id="check_completeness",
        destination_conn_id=WAREHOUSE_CONN_ID,
        sync_task_id="sync_people",
        on_partial="fail",
        max_retired=100,  # more than that in one day deserves a look before anyone uses the table
        mode="reschedule",
        poke_interval=30,
        timeout=600,
        on_failure_callback=BosAlertFileNotifier(path=ALERTS_FILE),  # a partial read alerts, then stops the DAG
    )

    @task
    def count_people() -> dict[str, int]:
        """Downstream consumer: the current people only (retired rows keep their last content)."""
        from sqlalchemy import text

        from airflow_provider_bos.hooks.connections import engine_for_connection

        engine = engine_for_connection(WAREHOUSE_CONN_ID)
        try:
            with engine.connect() as conn:
                current = conn.execute(
                    text(f"SELECT COUNT(*) FROM {PEOPLE_TABLE} WHERE _bos_deleted_at IS NULL")  # noqa: S608 - a constant table name, no user input
                ).scalar_one()
                merged = conn.execute(
                    text(f"SELECT COUNT(*) FROM {PEOPLE_TABLE} WHERE _bos_superseded_by IS NOT NULL")  # noqa: S608 - a constant table name, no user input
                ).scalar_one()
        finally:
            engine.dispose()
        return {"current": int(current), "merged_away": int(merged)}

    sync_people >> check_completeness >> count_people()

"""Daily full BOS people sync whose mass retirement waits for a person (docs/sync-modes.md).

A complete ``full`` read retires the people it no longer returns. When that would be more than
``max_retire_fraction`` of the table (an empty answer, a wrong context, a source that lost its
people), ``on_retire_guard="ask"`` lands the read's inserts and updates, keeps those rows current
and holds their retirement in ``bos_people_approved_pending_retirements``. The task group
``retirement_approval`` then asks a person in Airflow's Required Actions page (Human-in-the-loop,
Airflow 3.1+): how many rows, which share, per source, a sample of refs (never a person's values).
**Approve** retires them, unless a newer read wrote the table since (it decided instead: the
decision task says which run); **Reject** retires nothing. The audit table records either.

Unanswered within ``response_timeout`` the question fails and nothing is retired; the next night
decides again. The timeout stays below the schedule's interval, so tonight's question never keeps
tomorrow's sync waiting (``max_active_runs=1``).

Connections: ``bos_default`` (type bos) and ``bos_warehouse`` (sqlite/postgres/mysql).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator
from airflow_provider_bos.operators.retirement_approval import retirement_approval

with DAG(
    dag_id="bos_sync_people_approved",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
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
        arguments={},  # everyone, every day: one scope
        destination_conn_id="bos_warehouse",
        destination_table="bos_people_approved",
        sync_mode="full",
        max_retire_fraction=0.2,  # more than a fifth of the table gone in one night: a person decides
        on_retire_guard="ask",
    )

    # ask (Approve / Reject, in Required Actions) -> decide (retire, or not; audited). Skipped when
    # the read held nothing.
    retirement_approval(sync_people, response_timeout=timedelta(hours=20), retries=0)

"""Sync people from every BOS context this connection may read, one mapped task per context.

Each context lands in its own table (``bos_people_<context>``): record_refs are only unique within
what one context may see, so contexts are not merged into one table.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime

from airflow.sdk import DAG, task

from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator

WAREHOUSE_CONN_ID = "bos_warehouse"


def table_for_context(context_handle: str) -> str:
    """A safe table name for a context handle: readable ([a-z0-9_], 40 characters) and one per handle
    (a hash of the whole handle: handles that differ only after 40 characters, in case or in
    punctuation would otherwise share a table)."""
    slug = re.sub(r"[^a-z0-9_]+", "_", context_handle.lower()).strip("_")[:40] or "default"
    digest = hashlib.sha256(context_handle.encode("utf-8")).hexdigest()[:8]
    return f"bos_people_{slug}_{digest}"


with DAG(
    dag_id="bos_sync_all_contexts",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["bos", "example"],
    doc_md=__doc__,
):

    @task
    def authorized_contexts() -> list[dict[str, str]]:
        from airflow_provider_bos.hooks.bos import BosHook

        with BosHook("bos_default") as hook:
            contexts = hook.list_contexts()
        return [
            {"context_handle": c.context_handle, "destination_table": table_for_context(c.context_handle)}
            for c in contexts
        ]

    BosFederatedReadOperator.partial(
        task_id="sync_context",
        bos_conn_id="bos_default",
        tool_name="people.search",
        via="execute",
        destination_conn_id=WAREHOUSE_CONN_ID,
    ).expand_kwargs(authorized_contexts())

"""BosFederatedReadOperator: one BOS federated read landed in a warehouse table.

Orchestration only: read (``BosHook``) -> final records -> ``WarehouseWriter`` (upsert + audit row
in one transaction) -> summary in XCom, asset event, lineage. Streamed pages are logged as progress
and never written; only the final, identity-merged records are.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow.sdk import AssetAlias, BaseOperator

from airflow_provider_bos.exceptions import BosError, BosPartialReadError, BosResultError
from airflow_provider_bos.hooks.bos import BosHook
from airflow_provider_bos.operators.progress import ProgressLogger
from airflow_provider_bos.redaction import redact

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["BosFederatedReadOperator", "arguments_hash"]

KNOWN_COMPLETENESS = {"complete": "complete", "partial": "partial"}


def arguments_hash(arguments: dict[str, Any]) -> str:
    """A stable hash of the read's arguments, so audit rows of the same read can be grouped."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def alias_name(destination_conn_id: str, schema: str | None, table: str) -> str:
    return f"bos:{destination_conn_id}:{schema or ''}:{table}"


class BosFederatedReadOperator(BaseOperator):
    """Run a BOS federated read and upsert its final records into ``destination_table``.

    :param tool_name: the read operation (a context operation such as ``people.search`` run through
        ``bos_execute``, or a directly listed tool such as ``search_people``). Templated.
    :param arguments: the operation's business arguments. Templated.
    :param bos_conn_id: the ``bos`` Connection.
    :param context_handle: BOS context for ``bos_execute``; default: the connection's, else the one
        BOS marks ``is_default``. Templated.
    :param destination_conn_id: an Airflow SQL connection (sqlite, postgres, mysql/MariaDB).
    :param destination_table: records table, created if missing (default ``bos_records``). Templated.
    :param destination_schema: schema / database of the table. Templated.
    :param audit_table: the sync audit table (default ``bos_sync_runs``), in the same schema.
    :param via: ``auto`` (direct if the tool is listed, else ``bos_execute``), ``direct`` or ``execute``.
    :param stream: negotiate ``bos/source-results/v1`` for live progress (default True).
    :param fail_on_partial: fail the task after landing a partial result (default False: leave the
        decision to ``BosCompletenessSensor``).
    :param batch_size: rows per insert batch.
    :param read_deadline: operation deadline for the whole read; the call is cancelled when it passes.
    """

    template_fields: Sequence[str] = (
        "tool_name",
        "arguments",
        "context_handle",
        "destination_table",
        "destination_schema",
    )
    template_fields_renderers = {"arguments": "json"}
    ui_color = "#e8f1fb"

    def __init__(
        self,
        *,
        tool_name: str,
        destination_conn_id: str,
        arguments: dict[str, Any] | None = None,
        bos_conn_id: str = BosHook.default_conn_name,
        context_handle: str | None = None,
        destination_table: str = "bos_records",
        destination_schema: str | None = None,
        audit_table: str = "bos_sync_runs",
        via: str = "auto",
        stream: bool = True,
        fail_on_partial: bool = False,
        batch_size: int = 5000,
        read_deadline: timedelta = timedelta(minutes=30),
        **kwargs: Any,
    ) -> None:
        if via not in {"auto", "direct", "execute"}:
            raise ValueError("via must be 'auto', 'direct' or 'execute'")
        if "outlets" not in kwargs:
            kwargs["outlets"] = [AssetAlias(alias_name(destination_conn_id, destination_schema, destination_table))]
        super().__init__(**kwargs)
        self.tool_name = tool_name
        self.arguments = arguments or {}
        self.bos_conn_id = bos_conn_id
        self.context_handle = context_handle
        self.destination_conn_id = destination_conn_id
        self.destination_table = destination_table
        self.destination_schema = destination_schema
        self.audit_table = audit_table
        self.via = via
        self.stream = stream
        self.fail_on_partial = fail_on_partial
        self.batch_size = batch_size
        self.read_deadline = read_deadline
        self._hook: BosHook | None = None
        self._hook_lock = threading.Lock()
        self._lineage: dict[str, Any] = {}

    # --- execution ------------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_bos.hooks.connections import engine_for_connection
        from airflow_provider_bos.warehouse import SyncRunInfo, WarehouseWriter, validate_identifier

        validate_identifier(self.destination_table, what="destination_table")
        if self.destination_schema:
            validate_identifier(self.destination_schema, what="destination_schema")
        validate_identifier(self.audit_table, what="audit_table")

        engine = engine_for_connection(self.destination_conn_id)
        writer = WarehouseWriter(
            engine,
            table=self.destination_table,
            schema=self.destination_schema,
            audit_table=self.audit_table,
            batch_size=self.batch_size,
        )
        writer.ensure_tables()

        ti = context["ti"]
        run = SyncRunInfo(
            run_id=str(uuid.uuid4()),
            dag_id=ti.dag_id,
            task_id=ti.task_id,
            airflow_run_id=ti.run_id,
            conn_id=self.bos_conn_id,
            context_handle=self.context_handle,
            tool_name=self.tool_name,
            arguments_hash=arguments_hash(self.arguments),
            started_at=datetime.now(timezone.utc),
        )
        # Published first so a sensor can find the run even if this task fails.
        ti.xcom_push(key="bos_run_id", value=run.run_id)

        hook = BosHook(self.bos_conn_id)
        with self._hook_lock:
            self._hook = hook
        progress = ProgressLogger(self.log)
        result = None
        try:
            result = hook.federated_read(
                self.tool_name,
                self.arguments,
                context_handle=self.context_handle,
                via=self.via,
                stream=self.stream,
                on_progress=progress,
                deadline_s=self.read_deadline.total_seconds(),
            )
            if result.context is not None:
                run.context_handle = result.context.context_handle
            status = KNOWN_COMPLETENESS.get(result.completeness)
            if status is None:
                # Fail closed: a completeness we do not know cannot be trusted as complete.
                raise BosResultError(f"Unknown completeness {result.completeness!r} in the final result.")
            for warning in result.warnings:
                self.log.warning("BOS final result cross-check: %s", warning)
            counts = writer.write_run(
                run,
                result.records,
                completeness=result.completeness,
                status=status,
                result_count=result.result_count,
                source_errors=[e.model_dump(mode="json") for e in result.source_errors],
                source_summary=result.observations.summary(),
                provisional_records=result.observations.provisional_records,
                provisional_pages=result.observations.pages,
                default_observed_at=result.metadata.observed_at,
            )
        except BaseException as exc:
            self._audit_failure(writer, run, exc, result)
            raise
        finally:
            with self._hook_lock:
                self._hook = None
            hook.close()

        summary = {
            "run_id": run.run_id,
            "status": status,
            "completeness": result.completeness,
            "result_count": result.result_count,
            "inserted": counts.inserted,
            "updated": counts.updated,
            "unchanged": counts.unchanged,
            "skipped_stale": counts.skipped_stale,
            "duplicates": counts.duplicates,
            "provisional_records": result.observations.provisional_records,
            "source_errors": [
                {"source": f"{e.source.source_type}/{e.source.source_identity}", "code": e.error.code}
                for e in result.source_errors
            ],
            "destination": writer.destination_table,
        }
        self.log.info(
            "BOS sync %s: %s, %s final records -> %s (inserted %d, updated %d, unchanged %d, stale %d)",
            run.run_id, status, result.result_count, writer.destination_table,
            counts.inserted, counts.updated, counts.unchanged, counts.skipped_stale,
        )
        self._emit_asset_event(context, engine, summary)
        self._lineage = {
            "engine_url": engine.url,
            "summary": summary,
            "resource_url": hook.config.resource_url,
            "context_handle": run.context_handle,
        }
        if status == "partial" and self.fail_on_partial:
            raise BosPartialReadError(
                f"BOS read was partial ({len(summary['source_errors'])} source error(s): "
                + ", ".join(f"{e['source']}={e['code']}" for e in summary["source_errors"])
                + "); the partial records were landed and audited."
            )
        return summary

    def _audit_failure(self, writer: Any, run: Any, exc: BaseException, result: Any) -> None:
        """Write the ``failed`` audit row; never let a failure to audit hide the original error."""
        observations = result.observations if result is not None else getattr(exc, "observations", None)
        try:
            writer.record_failure(
                run,
                error=_failure_message(exc),
                source_summary=observations.summary() if observations is not None else [],
                provisional_records=getattr(observations, "provisional_records", 0),
                provisional_pages=getattr(observations, "pages", 0),
            )
        except Exception as audit_exc:  # the database may be what failed
            self.log.error("Could not write the failed audit row for run %s: %s", run.run_id, audit_exc)

    def on_kill(self) -> None:
        """Close the stream; the server sees the disconnect and cancels the call."""
        with self._hook_lock:
            hook = self._hook
        if hook is not None:
            hook.cancel()

    # --- outputs --------------------------------------------------------------------------------

    def _emit_asset_event(self, context: Context, engine: Any, summary: dict[str, Any]) -> None:
        from airflow.sdk import Asset

        from airflow_provider_bos.assets.tables import table_asset_uri

        alias = next((o for o in self.outlets if isinstance(o, AssetAlias)), None)
        if alias is None:
            return
        uri = table_asset_uri(engine.url, self.destination_schema, self.destination_table)
        extra = {k: summary[k] for k in ("run_id", "status", "completeness", "result_count",
                                          "inserted", "updated", "unchanged", "skipped_stale")}
        context["outlet_events"][alias].add(Asset(uri=uri), extra=extra)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """BOS read as the input dataset; the destination table (schema, rowCount) as the output."""
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import InputDataset, OutputDataset
        from openlineage.client.facet_v2 import output_statistics_output_dataset, schema_dataset

        from airflow_provider_bos.assets.tables import table_asset_uri
        from airflow_provider_bos.warehouse import record_columns

        if not self._lineage:
            return OperatorLineage()
        url = self._lineage["engine_url"]
        summary = self._lineage["summary"]
        bos_input = InputDataset(
            namespace=self._lineage["resource_url"],
            name=f"{self._lineage['context_handle'] or 'default'}/{self.tool_name}",
        )
        # Namespace and name as the asset URI splits them: "<scheme>://<host>..." / "<table>".
        namespace, _, name = table_asset_uri(url, self.destination_schema, self.destination_table).rpartition("/")
        fields = [
            schema_dataset.SchemaDatasetFacetFields(name=column, type=type_name)
            for column, type_name in record_columns(url.get_backend_name())
        ]
        output = OutputDataset(
            namespace=namespace,
            name=name,
            facets={"schema": schema_dataset.SchemaDatasetFacet(fields=fields)},
            outputFacets={
                "outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                    rowCount=summary["inserted"] + summary["updated"]
                )
            },
        )
        return OperatorLineage(inputs=[bos_input], outputs=[output])


def _failure_message(exc: BaseException) -> str:
    """The audit row's error text: the error type and a bounded, secret-scrubbed message."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return f"{type(exc).__name__}: the task was interrupted"
    limit = 2000 if isinstance(exc, BosError) else 500
    return redact(f"{type(exc).__name__}: {str(exc)[:limit]}")

"""BosFederatedReadOperator: one BOS federated read landed in a warehouse table.

Orchestration only: read (``BosHook``) -> final records -> ``WarehouseWriter`` (upsert + audit row
in one transaction) -> summary in XCom, asset event, lineage. Streamed pages are logged as progress
and never written; only the final, identity-merged records are.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import AssetAlias, BaseOperator

from airflow_provider_bos.exceptions import BosConfigurationError, BosError, BosPartialReadError
from airflow_provider_bos.hooks.bos import BosHook
from airflow_provider_bos.mcp.reads import check_via
from airflow_provider_bos.operators.failures import reported
from airflow_provider_bos.operators.progress import ProgressLogger
from airflow_provider_bos.operators.run_report import source_report
from airflow_provider_bos.pii import PiiPolicy
from airflow_provider_bos.pii.stream import PolicyRun
from airflow_provider_bos.sync import run_sync
from airflow_provider_bos.warehouse.tables.attribute_columns import check_attribute_columns
from airflow_provider_bos.wire import ReconcileOptions, check_invalid_records, check_reconcile

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["BosFederatedReadOperator"]

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
    :param destination_conn_id: an Airflow SQL connection (sqlite, postgres, mysql/MariaDB, snowflake).
    :param destination_table: records table, created if missing (default ``bos_records``). Templated.
    :param destination_schema: schema / database of the table. Templated.
    :param audit_table: the sync audit table (default ``bos_sync_runs``), in the same schema.
    :param via: ``auto`` (direct if the tool is listed, else ``bos_execute``), ``direct`` or ``execute``.
    :param stream: negotiate ``bos/source-results/v1`` for live progress (default True).
    :param fail_on_partial: fail the task after landing a partial result (default False: leave the
        decision to ``BosCompletenessSensor``).
    :param batch_size: rows per insert batch.
    :param read_deadline: operation deadline for the whole read; the call is cancelled when it passes.
    :param invalid_records: what to do with a final record the table cannot store (a ``record_ref``
        longer than the key column, a non-finite number, a field of the wrong shape): ``"fail"``
        (default: the run rolls back and is audited ``failed``) or ``"quarantine"`` (it goes to
        ``<destination_table>_rejects``, the rest lands, the run is ``partial``, XCom ``rejected``
        counts it).
    :param sync_mode: ``"incremental"`` (default: upserts; a complete result still supersedes rows
        merged into or split across its records) or ``"full"`` (the read returns every record of its
        scope: a complete one retires the scope's current rows it did not return). See
        docs/sync-modes.md.
    :param scope: the name of the read's scope, for a full read whose arguments change from run to
        run (default: the BOS resource, context, tool and arguments). Templated.
    :param deletions: ``"soft"`` (default: ``_bos_deleted_at`` set) or ``"hard"`` (rows deleted).
    :param max_retire_fraction: a complete full read that would retire more than this fraction of
        its scope's current rows retires nothing and is audited ``partial`` (default 0.5; None: off).
    :param on_retire_guard: what such a read does: ``"fail"`` (default: as above) or ``"ask"``: it
        lands its inserts and updates, stays ``complete`` and holds the retirements in
        ``<destination_table>_pending_retirements`` for a person to approve or reject; XCom
        ``pending_retirements`` says what was held (count, share, per source, a sample of refs) for
        :func:`~airflow_provider_bos.operators.retirement_approval.retirement_approval`.
    :param history: keep every version of every record in ``<destination_table>_history``.
    :param adopt_unscoped_rows: let a full read retire rows written before scopes existed by runs
        of the same read (default False: such rows are outside every scope).
    :param pii_policy: the personal-data policy: per field, ``"keep"`` (the default), ``"hash"`` or
        ``"drop"``; fields ``display_name``, ``email``, ``phone``, ``sources[].external_id`` and
        ``attributes.<path>`` (see docs/personal-data.md). Applied before anything is stored or
        leaves the task. Checked when the DAG is parsed; not templated (the table remembers the
        policy it was written with and refuses a run under another, so it cannot vary per run).
    :param pii_key_conn_id: the Airflow Connection whose password is the hash key (default
        ``bos_pii_key``); read in the task, required when the policy hashes something (a policy
        that only drops uses it, when the connection exists, for its wire hashes alone).
    :param attribute_columns: promoted attributes: column name -> ``attributes`` path (type text), or
        ``{"path": ..., "type": ...}`` with a type of ``text``, ``integer``, ``number``, ``boolean``,
        ``timestamp`` or ``json``; e.g. ``{"department": "attributes.department", "fte": {"path":
        "attributes.employment.fte", "type": "number"}}``. Each column is added to the table and filled
        from the stored ``attributes`` the first time it is configured; removing one leaves the column
        (new rows get NULL there). See docs/warehouse.md. Checked when the DAG is parsed; not templated
        (it shapes the table).
    :param attribute_type_errors: a promoted value of the wrong type: ``"invalid_records"`` (default:
        the record is invalid, as ``invalid_records`` says: the run fails, or the record is
        quarantined) or ``"null"`` (stored with NULL in that column; XCom ``attribute_type_errors``
        and the audit note count them).
    """

    template_fields: Sequence[str] = (
        "tool_name",
        "arguments",
        "context_handle",
        "destination_table",
        "destination_schema",
        "scope",
    )
    template_fields_renderers = {"arguments": "json"}  # noqa: RUF012 - BaseOperator declares it a plain attribute
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
        invalid_records: str = "fail",
        sync_mode: str = "incremental",
        scope: str | None = None,
        deletions: str = "soft",
        max_retire_fraction: float | None = 0.5,
        on_retire_guard: str = "fail",
        history: bool = False,
        adopt_unscoped_rows: bool = False,
        pii_policy: Mapping[str, str] | None = None,
        pii_key_conn_id: str = "bos_pii_key",
        attribute_columns: Mapping[str, Any] | None = None,
        attribute_type_errors: str = "invalid_records",
        **kwargs: Any,
    ) -> None:
        check_via(via)
        # At DAG parse time, before any table: a wrong field or action fails the DAG import.
        self._pii_policy = PiiPolicy.parse(pii_policy)
        if not isinstance(pii_key_conn_id, str) or not pii_key_conn_id.strip():
            raise BosConfigurationError("pii_key_conn_id must name an Airflow connection (e.g. 'bos_pii_key').")
        # At DAG parse time: a wrong value fails the DAG import, before any read or table.
        self._reconcile_values: dict[str, Any] = {
            "sync_mode": sync_mode, "scope": scope, "deletions": deletions,
            "max_retire_fraction": max_retire_fraction, "history": history,
            "adopt_unscoped_rows": adopt_unscoped_rows, "on_retire_guard": on_retire_guard,
        }
        check_reconcile(**self._reconcile_values)
        check_invalid_records(invalid_records)  # at DAG parse time, before any table is created
        self._attribute_columns = check_attribute_columns(attribute_columns, type_errors=attribute_type_errors)
        self._attribute_columns.check_policy(self._pii_policy.as_dict())
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
        self.invalid_records = invalid_records
        self.sync_mode = sync_mode
        self.scope = scope
        self.deletions = deletions
        self.max_retire_fraction = max_retire_fraction
        self.on_retire_guard = on_retire_guard
        self.history = history
        self.adopt_unscoped_rows = adopt_unscoped_rows
        #: The canonical policy (what the UI shows; field -> action, never a value).
        self.pii_policy = self._pii_policy.as_dict()
        self.pii_key_conn_id = pii_key_conn_id
        self.attribute_columns = dict(attribute_columns or {})
        self.attribute_type_errors = attribute_type_errors
        self._hook: BosHook | None = None
        self._hook_lock = threading.Lock()
        self._lineage: dict[str, Any] = {}

    # --- execution ------------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        try:
            return self._execute(context)
        except BosError as exc:  # one clear line last; the chain of causes at debug level
            raise reported(exc, self.log)  # noqa: B904 - exc itself, its chain kept or trimmed by reported()

    def _execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_bos.hooks.connections import engine_for_connection
        from airflow_provider_bos.warehouse import validate_identifier

        validate_identifier(self.destination_table, what="destination_table")
        if self.destination_schema:
            validate_identifier(self.destination_schema, what="destination_schema")
        validate_identifier(self.audit_table, what="audit_table")
        _check_json_arguments(self.arguments)
        self._reconcile_options(None)  # a templated scope is checked once rendered, before the read
        pii = self._policy_run()  # a missing key fails here, before any table or read

        engine = engine_for_connection(self.destination_conn_id)
        try:
            return self._sync(context, engine, pii)
        finally:
            engine.dispose()  # the task's connections close with it, not with a pool left behind

    def _policy_run(self) -> PolicyRun | None:
        """The run's policy bound to its key (required when the policy hashes; for one that only
        drops, used for the wire hashes if the connection exists); None: no policy."""
        if self._pii_policy.is_empty:
            return None
        from airflow_provider_bos.pii.airflow_key import key_from_connection

        # Registered with the secrets masker when read.
        key = key_from_connection(self.pii_key_conn_id, required=self._pii_policy.needs_key)
        return PolicyRun.of(self._pii_policy, key)

    def _sync(self, context: Context, engine: Any, pii: PolicyRun | None) -> dict[str, Any]:
        """Read, land and audit one sync on ``engine``; the task's summary."""
        from airflow_provider_bos.warehouse import SyncRunInfo, WarehouseWriter, hash_arguments

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
            arguments_hash=hash_arguments(self.arguments),
            started_at=datetime.now(UTC),
        )
        # Published first so a sensor can find the run even if this task fails.
        ti.xcom_push(key="bos_run_id", value=run.run_id)

        hook = BosHook(self.bos_conn_id)
        reconcile = self._reconcile_options(hook.config.resource_url)
        if pii is not None:  # field names, actions and the key's public id: nothing secret
            self.log.info("BOS sync %s: personal-data policy %s", run.run_id, pii.fingerprint.text)
        with self._hook_lock:
            self._hook = hook
        try:
            outcome = run_sync(
                hook.federated_read,
                writer,
                run,
                tool_name=self.tool_name,
                arguments=self.arguments,
                logger=self.log,
                invalid_records=self.invalid_records,
                reconcile=reconcile,
                pii=pii,
                attribute_columns=self._attribute_columns or None,
                context_handle=self.context_handle,
                via=self.via,
                stream=self.stream,
                on_progress=ProgressLogger(self.log),
                deadline_s=self.read_deadline.total_seconds(),
            )
        finally:
            with self._hook_lock:
                self._hook = None
            hook.close()

        summary = outcome.summary(writer.destination_table)
        if pii is not None:  # per rule, how many values it met: names and counts, never a value
            summary["pii_rules"] = dict(pii.plan.matched)
        status, counts = outcome.status, outcome.counts
        self.log.info(
            "BOS sync %s: %s (%s), %s final records -> %s (inserted %d, updated %d, unchanged %d, stale %d, "
            "retired %d, superseded %d)",
            run.run_id, status, self.sync_mode, summary["result_count"], writer.destination_table,
            counts.inserted, counts.updated, counts.unchanged, counts.skipped_stale, counts.retired,
            counts.superseded,
        )
        for line in source_report(summary, outcome.result.observations.summary()):
            self.log.info("BOS sync %s: %s", run.run_id, line)
        summary["pending_retirements"] = self._held(engine, run.run_id) if counts.retire_withheld else None
        if summary["pending_retirements"] is not None:
            self.log.warning("BOS sync %s: %d row(s) not retired yet (max_retire_fraction=%s): held for approval, "
                             "%s of the scope; per source %s.", run.run_id, counts.retire_withheld,
                             self.max_retire_fraction, f"{summary['pending_retirements']['share']:.0%}",
                             summary["pending_retirements"]["per_source"])
        elif counts.retire_withheld:
            self.log.warning("BOS sync %s: %d row(s) were not retired (max_retire_fraction=%s); the run is partial.",
                             run.run_id, counts.retire_withheld, self.max_retire_fraction)
        if counts.withheld:
            self.log.warning("BOS sync %s: %d record(s) of this partial read came under refs a complete read merged "
                             "away; they were withheld (the merged record stays the one current row).",
                             run.run_id, counts.withheld)
        self._emit_asset_event(context, engine, summary)
        self._lineage = {
            "engine_url": engine.url,
            "summary": summary,
            "resource_url": hook.config.resource_url,
            "context_handle": run.context_handle,
        }
        if status == "partial" and self.fail_on_partial:
            rejected = (
                f"; {summary['rejected']} record(s) quarantined in {writer.rejects_destination}"
                if summary["rejected"] else ""
            )
            raise BosPartialReadError(
                f"BOS read was partial ({len(summary['source_errors'])} source error(s): "
                + ", ".join(f"{e['source']}={e['code']}" for e in summary["source_errors"])
                + f"{rejected}"
                + (f"; {summary['withheld']} record(s) under refs a complete read merged away were withheld"
                   if summary["withheld"] else "")
                + "); the partial records were landed and audited."
            )
        return summary

    def _held(self, engine: Any, run_id: str) -> dict[str, Any] | None:
        """What the run held for approval (``on_retire_guard="ask"``), with where it is and how the
        approval retires it; refs only, never a person's values. None: it held nothing."""
        if self.on_retire_guard != "ask":
            return None
        from airflow_provider_bos.warehouse.upkeep.retirements import held_retirements

        held = held_retirements(engine, table=self.destination_table, schema=self.destination_schema, run_id=run_id)
        if held is None:
            return None
        return {**held.as_dict(), "table": self.destination_table, "schema": self.destination_schema,
                "audit_table": self.audit_table, "deletions": self.deletions, "history": self.history,
                "max_retire_fraction": self.max_retire_fraction}

    def _reconcile_options(self, resource: str | None) -> ReconcileOptions:
        return check_reconcile(**{**self._reconcile_values, "scope": self.scope}, resource=resource)

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
                                          "inserted", "updated", "unchanged", "skipped_stale", "retired",
                                          "superseded")}
        context["outlet_events"][alias].add(Asset(uri=uri), extra=extra)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """BOS read as the input dataset; the destination table (schema, rowCount) as the output."""
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import InputDataset, OutputDataset
        from openlineage.client.facet_v2 import output_statistics_output_dataset, schema_dataset

        from airflow_provider_bos.assets.pii_lineage import policy_column_descriptions
        from airflow_provider_bos.assets.tables import table_lineage_dataset
        from airflow_provider_bos.warehouse import record_columns

        if not self._lineage:
            return OperatorLineage()
        url = self._lineage["engine_url"]
        summary = self._lineage["summary"]
        bos_input = InputDataset(
            namespace=self._lineage["resource_url"],
            name=f"{self._lineage['context_handle'] or 'default'}/{self.tool_name}",
        )
        namespace, name = table_lineage_dataset(url, self.destination_schema, self.destination_table)
        # Columns the personal-data policy hashes or drops say so (field names, never values).
        promoted = self._attribute_columns.columns
        described = policy_column_descriptions(self._pii_policy, [(c.name, c.path) for c in promoted])
        fields = [
            schema_dataset.SchemaDatasetFacetFields(name=column, type=type_name, description=described.get(column))
            for column, type_name in record_columns(url.get_backend_name(), [(c.name, c.type) for c in promoted])
        ]
        output = OutputDataset(
            namespace=namespace,
            name=name,
            facets={"schema": schema_dataset.SchemaDatasetFacet(fields=fields)},
            outputFacets={
                # Rows this run changed: written, and retired or superseded.
                "outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                    rowCount=summary["inserted"] + summary["updated"] + summary["retired"] + summary["superseded"]
                )
            },
        )
        return OperatorLineage(inputs=[bos_input], outputs=[output])


def _check_json_arguments(value: Any, path: str = "arguments") -> None:
    """Refuse a read's arguments that are not JSON values, naming the first one that is not.

    With ``render_template_as_native_obj=True`` a template such as ``{{ data_interval_start }}``
    renders to a DateTime object, which BOS (JSON) cannot be sent.
    """
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise BosConfigurationError(f"{path} is {value!r}, which JSON cannot hold.")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise BosConfigurationError(f"{path} has the key {key!r}: JSON object keys must be strings.")
            _check_json_arguments(item, f"{path}[{key!r}]")
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_json_arguments(item, f"{path}[{index}]")
        return
    raise BosConfigurationError(
        f"{path} is a {type(value).__name__}, not a JSON value; render it as text (e.g. "
        "'{{ data_interval_start.isoformat() }}' under render_template_as_native_obj=True)."
    )

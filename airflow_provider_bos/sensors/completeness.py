"""BosCompletenessSensor: did the BOS sync I depend on complete?

Answered from the audit table ``bos_sync_runs``; partial reads never pass silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

from airflow_provider_bos.airflow_compat import AirflowFailException, AirflowSkipException
from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.sensors.verdict import (
    NO_COVERAGE,
    PASS,
    UNKNOWN,
    Verdict,
    check_min_coverage,
    judge,
)

if TYPE_CHECKING:
    from airflow.sdk import BaseNotifier, Context

__all__ = ["BosCompletenessSensor"]

ON_PARTIAL = ("fail", "alert", "skip")


class BosCompletenessSensor(BaseSensorOperator):
    """Wait for a BOS sync's audit row and fail, alert or skip unless it is complete.

    Target one of:

    * ``sync_task_id``: the run written by that ``BosFederatedReadOperator`` task in this DAG run
      (a mapped read: map the sensor over the same list; each follows the read of its map index);
    * ``bos_conn_id`` + ``tool_name`` (+ ``context_handle``): the latest run of that read, which
      must be no older than ``max_age`` (for monitor DAGs).

    :param destination_conn_id: the SQL connection holding the audit table.
    :param on_partial: ``fail`` (default; no retries), ``alert`` (notify, warn, succeed) or ``skip``.
    :param notifiers: Airflow notifiers (any ``BaseNotifier``) called on ``alert``.
    :param on_partial_callback: ``callable(context, verdict)`` called on ``alert``.
    :param min_records: a complete run with fewer records is treated like a partial one (default 1:
        a sync that returns nothing is usually broken; set 0 for reads that may be empty).
    :param max_age: the run must have finished within this window (stale data otherwise).
    :param max_retired: a run that retired or superseded more rows than this is treated like a
        partial one (``on_partial`` decides: fail, alert or skip); default None: no limit.
    :param min_coverage: ``{column: share}``, e.g. ``{"email": 0.9}``: a complete run in which fewer
        than that share of its records had a value in the column (the audit row's ``coverage``) is
        treated like a partial one. Each share is above 0 and at most 1. A column the run's coverage
        does not hold (a run written before coverage, a column not counted) fails, whatever
        ``on_partial`` says. Default None: not checked.
    """

    # min_coverage too: a template field is serialized with the DAG, so the sync-health page draws the
    # thresholds the check holds a table's coverage to (its values are numbers: rendering leaves them).
    template_fields: Sequence[str] = ("sync_task_id", "tool_name", "context_handle", "bos_conn_id", "min_coverage")

    def __init__(
        self,
        *,
        destination_conn_id: str,
        sync_task_id: str | None = None,
        bos_conn_id: str | None = None,
        tool_name: str | None = None,
        context_handle: str | None = None,
        audit_table: str = "bos_sync_runs",
        destination_schema: str | None = None,
        on_partial: str = "fail",
        notifiers: Sequence[BaseNotifier] = (),
        on_partial_callback: Callable[[Context, Verdict], None] | None = None,
        min_records: int = 1,
        max_age: timedelta | None = None,
        max_retired: int | None = None,
        min_coverage: Mapping[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if max_retired is not None and (isinstance(max_retired, bool) or not isinstance(max_retired, int)
                                        or max_retired < 0):
            raise BosConfigurationError(
                f"max_retired must be a whole number of rows (0 or more), or None for no limit, not {max_retired!r}."
            )
        checked_coverage = check_min_coverage(min_coverage)
        super().__init__(**kwargs)
        if on_partial not in ON_PARTIAL:
            raise ValueError(f"on_partial must be one of {ON_PARTIAL}")
        if not sync_task_id and not (bos_conn_id and tool_name):
            raise ValueError("Give sync_task_id, or bos_conn_id and tool_name for the latest run.")
        if not sync_task_id and max_age is None:
            raise ValueError("max_age is required when watching the latest run (else stale data passes).")
        self.destination_conn_id = destination_conn_id
        self.sync_task_id = sync_task_id
        self.bos_conn_id = bos_conn_id
        self.tool_name = tool_name
        self.context_handle = context_handle
        self.audit_table = audit_table
        self.destination_schema = destination_schema
        self.on_partial = on_partial
        self.notifiers = list(notifiers)
        self.on_partial_callback = on_partial_callback
        self.min_records = min_records
        self.max_age = max_age
        self.max_retired = max_retired
        self.min_coverage = checked_coverage

    def _find_run(self, context: Context) -> dict[str, Any] | None:
        from airflow_provider_bos.hooks.connections import engine_for_connection
        from airflow_provider_bos.warehouse import AuditReader

        run_id = None
        if self.sync_task_id:
            run_id = self._sync_run_id(context["ti"])
            if not run_id:
                self.log.info("Task %s has not published a BOS run id yet.", self.sync_task_id)
                return None
        # An engine per poke, disposed with it: pokes can go on for hours, and a pool left behind
        # by each one holds its connection open until the database refuses new ones.
        engine = engine_for_connection(self.destination_conn_id)
        try:
            reader = AuditReader(engine, audit_table=self.audit_table, schema=self.destination_schema)
            if run_id:
                return reader.get_run(run_id)
            return reader.latest_run(self.bos_conn_id, self.context_handle, self.tool_name)
        finally:
            engine.dispose()

    def _sync_run_id(self, ti: Any) -> str | None:
        """The run id ``sync_task_id`` published; of a mapped read, the one with this sensor's map index."""
        run_id = ti.xcom_pull(task_ids=self.sync_task_id, key="bos_run_id")
        if not isinstance(run_id, list):
            return run_id
        # A mapped read publishes one run id per map index and xcom_pull returns them all.
        if ti.map_index is None or ti.map_index < 0:
            raise AirflowFailException(
                f"{self.sync_task_id} is a mapped task: map this sensor over the same list (one sensor "
                "per read, e.g. .partial(...).expand(...)) or point it at an unmapped read."
            )
        return ti.xcom_pull(task_ids=self.sync_task_id, key="bos_run_id", map_indexes=ti.map_index)

    def poke(self, context: Context) -> bool:
        run = self._find_run(context)
        if run is None:
            self.log.info("No BOS sync run recorded yet; waiting.")
            return False
        if self.sync_task_id and run.get("finished_at") is None:
            return False
        verdict = judge(
            run,
            min_records=self.min_records,
            max_age=self.max_age,
            max_retired=self.max_retired,
            min_coverage=self.min_coverage,
            now=datetime.now(UTC),
        )
        if verdict.outcome == PASS:
            self.log.info(verdict.message)
            return True
        self._act(context, verdict)
        return True

    def _act(self, context: Context, verdict: Verdict) -> None:
        # Unknown statuses fail whatever on_partial says: we cannot tell what was read. Nor can a
        # coverage threshold be judged on a run that counted no coverage of its column.
        if verdict.outcome in (UNKNOWN, NO_COVERAGE) or self.on_partial == "fail":
            raise AirflowFailException(verdict.message)
        if self.on_partial == "skip":
            raise AirflowSkipException(verdict.message)
        self.log.warning("BOS completeness alert: %s", verdict.message)
        context["bos_verdict"] = verdict  # type: ignore[typeddict-unknown-key]
        for notifier in self.notifiers:
            notifier(context)
        if self.on_partial_callback is not None:
            self.on_partial_callback(context, verdict)

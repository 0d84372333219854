"""A notifier that records BOS alerts as JSON lines (local development, tests, demos).

Production deployments pass any Airflow notifier instead (``SmtpNotifier``, ``SlackNotifier``...);
this one needs no external service. It writes only what went wrong and where: never records or secrets.

It alerts on three occasions, with one line each:

- a completeness verdict (``BosCompletenessSensor(on_partial="alert", notifiers=[...])``);
- a task that failed (``on_failure_callback=BosAlertFileNotifier(...)``), e.g. a sensor that fails
  on a partial read: the line carries the failure's message;
- a missed deadline (``DeadlineAlert(..., callback=AsyncCallback(BosAlertFileNotifier, kwargs={"path":
  ...}))``, Airflow 3.1+): the triggerer awaits the notifier with the deadline's context.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow.sdk import BaseNotifier

from airflow_provider_bos.redaction import printable

__all__ = ["DEADLINE_MISSED", "TASK_FAILED", "BosAlertFileNotifier", "alert_of", "deadline_alert"]

#: The ``outcome`` of an alert for a DAG run not finished by its deadline.
DEADLINE_MISSED = "deadline_missed"
#: The ``outcome`` of an alert for a task that failed (its failure callback).
TASK_FAILED = "task_failed"


class BosAlertFileNotifier(BaseNotifier):
    """Append one JSON line per alert to ``path`` and log it as a warning.

    :param path: file to append to (templated; a deadline's callback is not rendered against a task's
        context, so give it a plain path there); parent folders are created.
    :param context: given by Airflow when it awaits the notifier for a missed deadline.
    """

    template_fields = ("path",)

    def __init__(self, path: str, context: Any = None) -> None:
        super().__init__(context)
        self.path = path

    def notify(self, context: Any) -> None:
        self._send(alert_of(context))

    async def async_notify(self, context: Any) -> None:
        # Only the triggerer awaits a notifier: for a missed deadline. One short append: no thread of its own.
        self._send(deadline_alert(context or {}))

    def _send(self, alert: dict[str, Any]) -> None:
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(alert) + "\n")
        self.log.warning("BOS alert: %s", alert["message"])


def alert_of(context: Mapping[str, Any]) -> dict[str, Any]:
    """The alert line for ``context``: a sensor's verdict, a missed deadline or a task's failure."""
    verdict = context.get("bos_verdict")
    if verdict is not None:
        ti = context.get("ti")
        return _alert(
            dag_id=getattr(ti, "dag_id", None), task_id=getattr(ti, "task_id", None),
            airflow_run_id=getattr(ti, "run_id", None), outcome=getattr(verdict, "outcome", None),
            message=getattr(verdict, "message", None), run_id=(getattr(verdict, "run", None) or {}).get("run_id"),
            failing_sources=[list(s) for s in getattr(verdict, "failing_sources", [])],
        )
    if isinstance(context.get("deadline"), Mapping):
        return deadline_alert(context)
    ti = context.get("ti")
    dag_id, task_id = getattr(ti, "dag_id", None), getattr(ti, "task_id", None)
    exception = context.get("exception")
    reason = printable(str(exception), limit=2000) if exception is not None else "no error was given"
    return _alert(dag_id=dag_id, task_id=task_id, airflow_run_id=getattr(ti, "run_id", None), outcome=TASK_FAILED,
                  message=f"Task {dag_id}.{task_id} failed: {reason}")


def deadline_alert(context: Mapping[str, Any]) -> dict[str, Any]:
    """The alert for a DAG run not finished by its deadline (``context``: the run and the deadline,
    as the scheduler hands them to the callback; what an older Airflow leaves out is said so)."""
    dag_run, deadline = context.get("dag_run"), context.get("deadline")
    dag_run = dag_run if isinstance(dag_run, Mapping) else {}
    when = deadline.get("deadline_time") if isinstance(deadline, Mapping) else None
    dag_id, run_id = dag_run.get("dag_id"), dag_run.get("run_id")
    which = f"DAG {dag_id} run {run_id}" if dag_id else "A DAG run (Airflow passed no context to name it)"
    return _alert(
        dag_id=dag_id, task_id=None, airflow_run_id=run_id, outcome=DEADLINE_MISSED,
        message=(f"{which} had not finished by its deadline{f' ({when})' if when else ''}: the sync is late. "
                 "Open the run in Airflow to see which task is still running or waiting (a read in progress, "
                 "no free worker slot, a stuck worker)."),
    )


def _alert(*, dag_id: Any, task_id: Any, airflow_run_id: Any, outcome: Any, message: Any, run_id: Any = None,
           failing_sources: list[list[str]] | None = None) -> dict[str, Any]:
    return {
        "at": datetime.now(UTC).isoformat(),
        "dag_id": dag_id,
        "task_id": task_id,
        "airflow_run_id": airflow_run_id,
        "outcome": outcome,
        "message": message,
        "run_id": run_id,
        "failing_sources": failing_sources or [],
    }

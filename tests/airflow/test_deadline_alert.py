"""The daily example DAG's deadline: a run not finished within its window alerts through the provider's
notifier, the one a partial read alerts through.

The callback is taken from the DAG as the scheduler stores it (serialized, then decoded) and run by
Airflow's own ``CallbackTrigger`` with the context ``Deadline.handle_miss`` gives it: what the
triggerer does when a deadline is missed.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

REPO_DAGS = Path(__file__).resolve().parents[2] / "dags"
NOTIFIER_PATH = "airflow_provider_bos.notifiers.BosAlertFileNotifier"

pytestmark = pytest.mark.airflow


def _daily_dag(alerts: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from tests.airflow_names import DagBag

    monkeypatch.setenv("BOS_ALERTS_FILE", str(alerts))
    bag = DagBag(dag_folder=str(REPO_DAGS / "bos_sync_people_daily.py"))
    assert bag.import_errors == {}
    return bag.get_dag("bos_sync_people_daily")


def _stored_deadline(dag: Any) -> Any:
    """The deadline as the scheduler reads it from the serialized DAG."""
    from tests.airflow_names import stored_deadline_alerts

    (deadline,) = stored_deadline_alerts(dag)
    return deadline


def test_the_daily_dag_declares_a_deadline_that_alerts_through_the_notifier(airflow_db, tmp_path,
                                                                               monkeypatch) -> None:
    from airflow.sdk.definitions.deadline import AsyncCallback, DeadlineReference

    alerts = tmp_path / "alerts.jsonl"
    dag = _daily_dag(alerts, monkeypatch)

    (deadline,) = dag.deadline
    assert deadline.reference == DeadlineReference.DAGRUN_QUEUED_AT
    assert deadline.interval == timedelta(hours=2)
    assert isinstance(deadline.callback, AsyncCallback)
    stored = _stored_deadline(dag)
    assert (stored.callback.path, stored.callback.kwargs) == (NOTIFIER_PATH, {"path": str(alerts)})
    # A partial read fails the sensor, whose failure alerts through the same notifier and file.
    sensor = dag.get_task("check_completeness")
    (on_failure,) = sensor.on_failure_callback
    assert type(on_failure).__module__ + "." + type(on_failure).__qualname__ == NOTIFIER_PATH
    assert on_failure.path == str(alerts)


def test_a_missed_deadline_appends_an_alert_as_the_triggerer_runs_it(airflow_db, tmp_path, monkeypatch) -> None:
    from tests.airflow_names import deadline_callback_trigger

    alerts = tmp_path / "alerts" / "alerts.jsonl"
    callback = _stored_deadline(_daily_dag(alerts, monkeypatch)).callback
    deadline_time = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
    # What Deadline.handle_miss adds to the callback's kwargs (its "simple context").
    context = {
        "dag_run": {"dag_id": "bos_sync_people_daily", "run_id": "scheduled__2026-03-01T00:00:00+00:00",
                    "state": "running"},
        "deadline": {"id": "0195d1a0-0000-7000-8000-000000000001", "deadline_time": deadline_time},
    }
    trigger, status_key, succeeded = deadline_callback_trigger(callback.path, {**callback.kwargs, "context": context})

    async def events() -> list[Any]:
        return [event async for event in trigger.run()]

    states = [event.payload[status_key] for event in asyncio.run(events())]

    assert states == succeeded
    (line,) = alerts.read_text(encoding="utf-8").splitlines()
    alert = json.loads(line)
    assert alert["outcome"] == "deadline_missed"
    assert (alert["dag_id"], alert["airflow_run_id"]) == ("bos_sync_people_daily",
                                                          "scheduled__2026-03-01T00:00:00+00:00")
    assert "had not finished by its deadline (2026-03-01 02:00:00+00:00)" in alert["message"]
    assert "Open the run in Airflow" in alert["message"]


def test_a_failed_sensor_alerts_with_its_message(tmp_path) -> None:
    """The sensor's failure callback: the line carries why it failed (the verdict it raised)."""
    from types import SimpleNamespace

    from airflow_provider_bos.notifiers import BosAlertFileNotifier

    alerts = tmp_path / "alerts.jsonl"
    ti = SimpleNamespace(dag_id="bos_sync_people_daily", task_id="check_completeness", run_id="manual__1")
    reason = "BOS sync run 42 (people.search in context ctx) is partial. Failing sources: hr/main: timeout."
    BosAlertFileNotifier(path=str(alerts))({"ti": ti, "exception": RuntimeError(reason)})

    alert = json.loads(alerts.read_text(encoding="utf-8"))
    assert alert["outcome"] == "task_failed"
    assert alert["message"] == f"Task bos_sync_people_daily.check_completeness failed: {reason}"


def test_awaited_without_a_context_it_still_alerts_a_missed_deadline(tmp_path) -> None:
    """A triggerer that passes no context (it is optional to Airflow) still gets a deadline alert."""
    from airflow_provider_bos.notifiers import BosAlertFileNotifier

    alerts = tmp_path / "alerts.jsonl"

    async def awaited() -> None:
        await BosAlertFileNotifier(path=str(alerts))

    asyncio.run(awaited())

    alert = json.loads(alerts.read_text(encoding="utf-8"))
    assert alert["outcome"] == "deadline_missed"
    assert alert["message"].startswith("A DAG run (Airflow passed no context to name it) had not finished by its "
                                       "deadline: the sync is late.")

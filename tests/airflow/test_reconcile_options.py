"""The operator's and sensor's reconcile options: refused up front, counted in XCom, the log and lineage."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from outlet_events import OutletEvents

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.operators.federated_read import BosFederatedReadOperator
from airflow_provider_bos.sensors.completeness import BosCompletenessSensor
from airflow_provider_bos.sensors.verdict import PASS, TOO_MANY_RETIRED, judge
from airflow_provider_bos.testing.federation import expected_final
from airflow_provider_bos.testing.scenario import load_scenario

pytestmark = pytest.mark.airflow


@pytest.mark.parametrize(("option", "value", "says"), [
    ("sync_mode", "mirror", "sync_mode must be one of"),
    ("deletions", "purge", "deletions must be one of"),
    ("max_retire_fraction", 1.5, "max_retire_fraction must be a number from 0 to 1"),
    ("max_retire_fraction", True, "max_retire_fraction must be a number from 0 to 1"),
    ("scope", "", "scope must be a non-empty name"),
    ("history", "yes", "history must be True or False"),
    ("adopt_unscoped_rows", 1, "adopt_unscoped_rows must be True or False"),
])
def test_a_wrong_option_is_refused_when_the_dag_is_parsed(option: str, value: Any, says: str) -> None:
    with pytest.raises(BosConfigurationError, match=says):
        BosFederatedReadOperator(task_id="sync", tool_name="people.search", destination_conn_id="w",
                                 **{option: value})


@pytest.mark.parametrize("value", [-1, 2.5, True, "10"])
def test_the_sensor_refuses_a_wrong_max_retired(value: Any) -> None:
    with pytest.raises(BosConfigurationError, match="max_retired must be a whole number"):
        BosCompletenessSensor(task_id="check", destination_conn_id="w", sync_task_id="sync", max_retired=value)


def test_the_verdict_counts_retired_and_superseded_rows() -> None:
    run = {"run_id": "r", "status": "complete", "result_count": 200, "retired": 10, "superseded": 40}
    assert judge(run, max_retired=50).outcome == PASS
    verdict = judge(run, max_retired=49)
    assert verdict.outcome == TOO_MANY_RETIRED and "retired 10 and superseded 40" in verdict.message
    assert judge({**run, "retired": None, "superseded": None}, max_retired=0).outcome == PASS  # an older row


@pytest.mark.parametrize("warehouse_url", ["sqlite"], indirect=True)
def test_the_counts_reach_xcom_the_log_the_asset_event_and_lineage(bos_airflow, caplog, capsys) -> None:
    server = bos_airflow["server"]
    server.set_scenario(load_scenario("people_over_time"))
    operator = BosFederatedReadOperator(task_id="sync", tool_name="people.search", destination_conn_id="bos_warehouse",
                                        destination_table=bos_airflow["table"], sync_mode="full")

    def execute() -> tuple[dict[str, Any], Any]:
        ti = SimpleNamespace(dag_id="d", task_id="sync", run_id="r1", xcom_push=lambda key, value: None)
        events = OutletEvents()
        return operator.execute({"ti": ti, "outlet_events": events}), events

    execute()
    server.set_day(2)
    with caplog.at_level(logging.INFO):
        summary, events = execute()
    assert (summary["retired"], summary["superseded"], summary["retire_withheld"]) == (10, 40, 0)
    assert summary["result_count"] == len(expected_final("people_over_time", 2).refs)
    assert "retired 10, superseded 40" in caplog.text + capsys.readouterr().out  # the task log line
    [(_, extra)] = next(iter(events.values())).added
    assert (extra["retired"], extra["superseded"]) == (10, 40)
    [output] = operator.get_openlineage_facets_on_complete(None).outputs
    changed = summary["inserted"] + summary["updated"] + 10 + 40
    assert output.outputFacets["outputStatistics"].rowCount == changed

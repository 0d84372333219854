"""End to end, what a run's log says: the sync task ends with one line per source and the totals, a
passing check logs the coverage it checked, and a partial run's note is labelled a note, not an error.
"""

from __future__ import annotations

import json
import logging

import pytest
from afhelpers import task_states

from airflow_provider_bos.testing.federation import plan_read
from airflow_provider_bos.testing.scenario import load_scenario

pytestmark = pytest.mark.airflow


def test_the_sync_ends_with_each_source_and_the_totals(bos_airflow, run_dag, caplog, capsys) -> None:
    scenario = load_scenario("partial")
    bos_airflow["server"].set_scenario(scenario)
    with caplog.at_level(logging.INFO):
        dag_run = run_dag("bos_test_sync")
    assert task_states(dag_run)["sync"] == "success"
    log = caplog.text + "".join(capsys.readouterr())  # the task's log goes to stdout in dag.test()
    read = plan_read(scenario, request_id="x", context={"context_handle": "x"}, arguments={})
    for source in scenario.sources:
        line = next(line for line in log.splitlines() if f"  {source.source_type}/{source.source_identity}: " in line)
        if source.error is not None:
            assert f"error ({source.error})" in line
        else:
            assert "complete," in line and f"{source.delivered_records} record(s)" in line
    failing = sum(1 for s in scenario.sources if s.error is not None)
    final = len(list(read.iter_final_records()))
    assert f"Totals: {len(scenario.sources)} source(s), {failing} failing" in log
    assert f"; {final} final record(s), status partial" in log


def test_a_passing_check_logs_the_coverage_it_checked(bos_airflow, run_dag, caplog, capsys) -> None:
    bos_airflow["server"].set_scenario(load_scenario("complete"))
    with caplog.at_level(logging.INFO):
        dag_run = run_dag("bos_test_sync", BOS_TEST_MIN_COVERAGE=json.dumps({"email": 0.5}))
    assert task_states(dag_run)["check"] == "success"
    log = caplog.text + "".join(capsys.readouterr())
    assert "Coverage checked: email " in log and "min_coverage 50%" in log


def test_a_partial_runs_note_is_not_labelled_an_error() -> None:
    from airflow_provider_bos.sensors.verdict import judge

    note = "3 records of this partial read came under refs that a complete read merged away."
    partial = judge({"run_id": "r", "status": "partial", "error_message": note, "source_errors": []})
    failed = judge({"run_id": "r", "status": "failed", "error_message": "BosTransportError: dropped"})
    assert f"Note: {note}" in partial.message and "Error:" not in partial.message
    assert "Error: BosTransportError: dropped" in failed.message

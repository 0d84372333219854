"""End to end: BosCompletenessSensor's fail / alert / skip / min_records / max_age behaviours."""

from __future__ import annotations

import json

import pytest
from afhelpers import audit_rows, task_states

from airflow_provider_bos.testing.scenario import FaultSpec, load_scenario

pytestmark = [pytest.mark.airflow, pytest.mark.parametrize("warehouse_url", ["sqlite"], indirect=True)]


def test_fail_mode_fails_the_check_and_blocks_downstream(bos_airflow, run_dag, tmp_path) -> None:
    bos_airflow["server"].set_scenario(load_scenario("partial"))
    marker = tmp_path / "downstream.txt"

    dag_run = run_dag("bos_test_sync", BOS_TEST_ON_PARTIAL="fail", BOS_TEST_MARKER=str(marker))

    assert task_states(dag_run) == {"sync": "success", "check": "failed", "downstream": "upstream_failed"}
    assert not marker.exists()


def test_alert_mode_notifies_warns_and_lets_downstream_run(bos_airflow, run_dag, tmp_path) -> None:
    bos_airflow["server"].set_scenario(load_scenario("partial"))
    alerts, marker = tmp_path / "alerts.jsonl", tmp_path / "downstream.txt"

    dag_run = run_dag("bos_test_sync", BOS_TEST_ON_PARTIAL="alert", BOS_TEST_ALERTS_FILE=str(alerts),
                      BOS_TEST_MARKER=str(marker))

    assert task_states(dag_run) == {"sync": "success", "check": "success", "downstream": "success"}
    [alert] = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert alert["outcome"] == "partial"
    assert sorted(code for _, code in alert["failing_sources"]) == ["rate_limited", "source_timeout"]
    assert "partial" in alert["message"]


def test_skip_mode_skips_the_check_and_short_circuits_downstream(bos_airflow, run_dag, tmp_path) -> None:
    bos_airflow["server"].set_scenario(load_scenario("partial"))
    marker = tmp_path / "downstream.txt"

    dag_run = run_dag("bos_test_sync", BOS_TEST_ON_PARTIAL="skip", BOS_TEST_MARKER=str(marker))

    assert task_states(dag_run) == {"sync": "success", "check": "skipped", "downstream": "skipped"}
    assert not marker.exists()


@pytest.mark.parametrize(("min_records", "expected"), [(1, "failed"), (0, "success")])
def test_min_records_treats_an_empty_complete_read_as_broken(bos_airflow, run_dag, min_records, expected) -> None:
    bos_airflow["server"].set_scenario(load_scenario("empty"))

    dag_run = run_dag("bos_test_sync", BOS_TEST_MIN_RECORDS=str(min_records))

    states = task_states(dag_run)
    assert states["sync"] == "success"
    assert states["check"] == expected


def test_complete_read_passes(bos_airflow, run_dag) -> None:
    bos_airflow["server"].set_scenario(load_scenario("complete"))
    assert task_states(run_dag("bos_test_sync")) == {"sync": "success", "check": "success", "downstream": "success"}


def test_failed_sync_is_judged_failed_by_a_monitor(bos_airflow, run_dag) -> None:
    dropping = load_scenario("complete").model_copy(update={"faults": FaultSpec(drop_before_final=True)})
    bos_airflow["server"].set_scenario(dropping)
    assert task_states(run_dag("bos_test_sync"))["sync"] == "failed"

    monitor = run_dag("bos_test_monitor", BOS_TEST_MAX_AGE_S="3600")

    assert task_states(monitor) == {"watch": "failed", "after_watch": "upstream_failed"}


@pytest.mark.parametrize("tool", ["people.search", "search_people"], ids=["bos_execute", "direct"])
def test_a_monitor_naming_the_context_sees_a_sync_that_failed_before_its_result(bos_airflow, run_dag, tool) -> None:
    # The sync names no context (BOS's default is used); a complete run, then one whose stream drops
    # before the final result. The failed row must carry the context_handle, or a monitor that
    # names the context passes on the older complete run. Through bos_execute the client resolves
    # the context itself; a direct tool is sent none, and its pages say which one BOS used.
    server, engine, table = bos_airflow["server"], bos_airflow["engine"], bos_airflow["table"]
    server.set_scenario(load_scenario("complete"))
    assert task_states(run_dag("bos_test_sync", BOS_TEST_TOOL=tool))["sync"] == "success"
    server.set_scenario(load_scenario("complete").model_copy(
        update={"revision": 2, "faults": FaultSpec(drop_before_final=True)}))
    assert task_states(run_dag("bos_test_sync", BOS_TEST_TOOL=tool))["sync"] == "failed"

    complete, failed = audit_rows(engine, table)
    assert (complete["status"], failed["status"]) == ("complete", "failed")
    assert failed["context_handle"] == complete["context_handle"] is not None
    monitor = run_dag("bos_test_monitor", BOS_TEST_TOOL=tool, BOS_TEST_MONITOR_CONTEXT=complete["context_handle"])
    assert task_states(monitor) == {"watch": "failed", "after_watch": "upstream_failed"}


@pytest.mark.parametrize(("max_age_s", "expected"), [("3600", "success"), ("0.001", "failed")])
def test_max_age_flags_stale_data_in_a_monitor_dag(bos_airflow, run_dag, max_age_s, expected) -> None:
    bos_airflow["server"].set_scenario(load_scenario("complete"))
    assert task_states(run_dag("bos_test_sync"))["check"] == "success"

    monitor = run_dag("bos_test_monitor", BOS_TEST_MAX_AGE_S=max_age_s)

    assert task_states(monitor)["watch"] == expected


def test_stale_data_alert_goes_through_the_notifier(bos_airflow, run_dag, tmp_path) -> None:
    bos_airflow["server"].set_scenario(load_scenario("complete"))
    run_dag("bos_test_sync")
    alerts = tmp_path / "alerts.jsonl"

    monitor = run_dag("bos_test_monitor", BOS_TEST_MAX_AGE_S="0.001", BOS_TEST_ON_PARTIAL="alert",
                      BOS_TEST_ALERTS_FILE=str(alerts))

    assert task_states(monitor) == {"watch": "success", "after_watch": "success"}
    [alert] = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert alert["outcome"] == "stale"


@pytest.mark.parametrize(("base", "contradiction", "named"), [
    ("complete", "error_flag_on_complete", "isError=True is inconsistent with completeness 'complete'"),
    ("partial", "hidden_source_errors", "ended in error 'source_timeout' in the stream but is missing"),
])
def test_a_self_contradicting_final_result_is_audited_partial_and_never_passes(
        bos_airflow, run_dag, tmp_path, base, contradiction, named) -> None:
    scenario = load_scenario(base)
    bos_airflow["server"].set_scenario(
        scenario.model_copy(update={"faults": FaultSpec(final_contradiction=contradiction)}))
    alerts = tmp_path / "alerts.jsonl"

    dag_run = run_dag("bos_test_sync", BOS_TEST_ON_PARTIAL="alert", BOS_TEST_ALERTS_FILE=str(alerts))

    assert task_states(dag_run)["sync"] == "success"  # the records land...
    [audit] = audit_rows(bos_airflow["engine"], bos_airflow["table"])
    assert audit["completeness"] == "complete"  # ...what the server claimed...
    assert audit["status"] == "partial"  # ...is not trusted
    assert "contradicts itself" in audit["error_message"] and named in audit["error_message"]
    [alert] = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert alert["outcome"] == "partial" and named in alert["message"]
    assert task_states(run_dag("bos_test_sync"))["check"] == "failed"  # on_partial="fail" (default)

"""End to end: a field that was filled comes back empty for everyone on the next read -> the operator in
a real dag.test() records the drop in the audit row's ``coverage`` -> BosCompletenessSensor(min_coverage=...)
fails the check (``on_partial="fail"``) or alerts through its notifier (``on_partial="alert"``).

Every dialect: SQLite in the fast tier, PostgreSQL, MariaDB and DuckDB in the full tier (Snowflake:
tests/airflow/test_snowflake_e2e.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from afhelpers import audit_rows, every_dialect, task_states

from airflow_provider_bos.testing.federation import plan_read
from airflow_provider_bos.testing.scenario import load_scenario

pytestmark = pytest.mark.airflow

WATCH = {"BOS_TEST_MIN_COVERAGE": json.dumps({"email": 0.5, "phone": 0.5})}


def final_coverage(scenario: Any) -> dict[str, Any]:
    """The coverage of the scenario's final records, counted here from the server's own plan."""
    read = plan_read(scenario, request_id="expected", context={"context_handle": "x"}, arguments={})
    records = list(read.iter_final_records())
    return {"records": len(records), "columns": {
        c: sum(1 for r in records if r[c]) for c in ("display_name", "email", "phone")}}


def coverage_of(audit: dict[str, Any]) -> Any:
    value = audit["coverage"]
    return json.loads(value) if isinstance(value, str) else value  # JSON text where the driver gives text


@every_dialect
def test_a_field_that_goes_empty_fails_the_check(bos_airflow, run_dag, tmp_path) -> None:
    server, engine, table = bos_airflow["server"], bos_airflow["engine"], bos_airflow["table"]
    filled = load_scenario("complete")
    server.set_scenario(filled)
    marker = tmp_path / "downstream.txt"
    first = run_dag("bos_test_sync", **WATCH)
    assert task_states(first) == {"sync": "success", "check": "success", "downstream": "success"}

    emptied = filled.model_copy(update={"emptied_fields": ["phone"]})
    server.set_scenario(emptied)
    second = run_dag("bos_test_sync", BOS_TEST_MARKER=str(marker), **WATCH)

    assert task_states(second) == {"sync": "success", "check": "failed", "downstream": "upstream_failed"}
    assert not marker.exists()
    before, after = (coverage_of(a) for a in audit_rows(engine, table))
    assert before == final_coverage(filled) and before["columns"]["phone"] > before["records"] / 2
    assert after == final_coverage(emptied) and after["columns"]["phone"] == 0


@every_dialect
def test_alert_mode_calls_the_notifier_naming_the_column(bos_airflow, run_dag, tmp_path) -> None:
    server = bos_airflow["server"]
    filled = load_scenario("complete")
    server.set_scenario(filled)
    assert task_states(run_dag("bos_test_sync", **WATCH))["check"] == "success"
    alerts, marker = tmp_path / "alerts.jsonl", tmp_path / "downstream.txt"

    server.set_scenario(filled.model_copy(update={"emptied_fields": ["email"]}))
    dag_run = run_dag("bos_test_sync", BOS_TEST_ON_PARTIAL="alert", BOS_TEST_ALERTS_FILE=str(alerts),
                      BOS_TEST_MARKER=str(marker), **WATCH)

    assert task_states(dag_run) == {"sync": "success", "check": "success", "downstream": "success"}
    [alert] = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert alert["outcome"] == "low_coverage"
    assert "email had a value in 0 of" in alert["message"] and "below min_coverage 50%" in alert["message"]
    assert "phone" not in alert["message"]  # the column that kept its values is not named
    assert "@" not in alert["message"]  # counts, never values


@every_dialect
def test_a_promoted_attribute_that_goes_empty_fails_the_check(bos_airflow, run_dag) -> None:
    """``department`` promoted to a column: its coverage is recorded with the top-level fields', and a
    source that stops sending it fails the check though every run is complete."""
    server, engine, table = bos_airflow["server"], bos_airflow["engine"], bos_airflow["table"]
    promoted = {"BOS_TEST_ATTRIBUTE_COLUMNS": json.dumps({"department": "attributes.department"}),
                "BOS_TEST_MIN_COVERAGE": json.dumps({"department": 0.5})}
    filled = load_scenario("complete")
    server.set_scenario(filled)
    first = run_dag("bos_test_sync", **promoted)
    assert task_states(first)["check"] == "success"

    server.set_scenario(filled.model_copy(update={"emptied_fields": ["attributes.department"]}))
    second = run_dag("bos_test_sync", **promoted)
    assert task_states(second)["sync"] == "success" and task_states(second)["check"] == "failed"
    before, after = (coverage_of(a) for a in audit_rows(engine, table))
    read = plan_read(filled, request_id="expected", context={"context_handle": "x"}, arguments={})
    with_department = sum(1 for r in read.iter_final_records() if (r["attributes"] or {}).get("department"))
    assert before["columns"]["department"] == with_department > before["records"] / 2
    assert after["columns"]["department"] == 0 and after["records"] == before["records"]

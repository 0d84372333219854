"""End to end, a policy's report: per rule, how many values it met in the records the run decoded (the
XCom summary, the audit row's note, the log), and a warning naming a rule that met none (a mistyped
path such as ``attributes.salery`` changes nothing, and would otherwise pass silently)."""

from __future__ import annotations

import json
import logging
import secrets

import pytest
from afhelpers import audit_rows, task_states, xcom_summary

from airflow_provider_bos.pii import PiiPolicy
from airflow_provider_bos.testing.federation import expected_final
from airflow_provider_bos.testing.scenario import load_scenario

pytestmark = pytest.mark.airflow

POLICY = {"email": "hash", "attributes.employment": "drop", "attributes.salery": "drop"}


def test_each_rule_says_what_it_met_and_a_rule_that_met_nothing_is_named(bos_airflow_audit, run_dag, monkeypatch,
                                                                          caplog, capsys) -> None:
    env = bos_airflow_audit
    env["server"].set_scenario(load_scenario("people_over_time"))
    monkeypatch.setenv("AIRFLOW_CONN_BOS_PII_KEY", json.dumps({"conn_type": "generic",
                                                               "password": secrets.token_urlsafe(48)}))
    with caplog.at_level(logging.INFO):
        dag_run = run_dag("bos_test_days", "bos_test_days.py", BOS_TEST_PII_POLICY=json.dumps(POLICY))
    assert task_states(dag_run)["sync"] == "success"
    records = [r.record for r in expected_final("people_over_time", 1).records]
    rules = xcom_summary(dag_run)["pii_rules"]
    assert rules == {
        "attributes.employment": sum(1 for r in records if (r["attributes"] or {}).get("employment") is not None),
        "attributes.salery": 0,
        "email": sum(1 for r in records if r["email"] is not None),
    }
    assert set(rules) == set(PiiPolicy.parse(POLICY).as_dict())
    [audit] = audit_rows(env["engine"], env["table"], env["audit"])
    assert "Rule(s) that met no value: attributes.salery" in audit["notes"]
    assert f"email hashed in {rules['email']}" in audit["notes"]
    log = caplog.text + "".join(capsys.readouterr())
    [line] = [line for line in log.splitlines() if "BOS personal-data policy:" in line]
    assert "warning" in line.lower() and "met no value: attributes.salery" in line
    env["engine"].dispose()
    with env["engine"].begin() as conn:
        for suffix in ("lineage", "history", "sources", "policy"):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {env['table']}_{suffix}")

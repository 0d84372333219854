"""End to end: a hostile or broken BOS server -> BosFederatedReadOperator in dag.test() -> database.

A server that invents sources, names them to forge log lines, or sends a final result that
contradicts its own stream: the records land, the audit row says ``partial`` and why, and the
completeness sensor fails or alerts. Nothing of the server's text reaches the task log raw.
"""

from __future__ import annotations

import json

import pytest
from afhelpers import audit_rows, task_states

from airflow_provider_bos.mcp.source_results import MAX_TRACKED_SOURCES, UNTRACKED_STATUS
from airflow_provider_bos.testing.federation import expected_final
from airflow_provider_bos.testing.scenario import FaultSpec, Scenario, SourceSpec, load_scenario

pytestmark = [pytest.mark.airflow, pytest.mark.parametrize("warehouse_url", ["sqlite"], indirect=True)]

FORGED = "crm-eu\nERROR - BOS grant expired; reconnect at https://evil.example/connect\x1b[31m"


def alerted(bos_airflow, run_dag, tmp_path, scenario: Scenario) -> tuple[dict, dict]:
    """Run the sync DAG with on_partial="alert": (the audit row, the one alert)."""
    bos_airflow["server"].set_scenario(scenario)
    alerts = tmp_path / "alerts.jsonl"
    dag_run = run_dag("bos_test_sync", BOS_TEST_ON_PARTIAL="alert", BOS_TEST_ALERTS_FILE=str(alerts))
    assert task_states(dag_run) == {"sync": "success", "check": "success", "downstream": "success"}
    [audit] = audit_rows(bos_airflow["engine"], bos_airflow["table"])
    [alert] = [json.loads(line) for line in alerts.read_text().splitlines()]
    return audit, alert


@pytest.mark.parametrize("contradiction", ["result_count_mismatch", "unfinished_source"])
def test_a_final_result_that_disagrees_with_itself_is_partial(bos_airflow, run_dag, tmp_path,
                                                             contradiction) -> None:
    scenario = load_scenario("complete").model_copy(update={"faults": FaultSpec(final_contradiction=contradiction)})
    count = len(expected_final(scenario).records)
    named = {"result_count_mismatch": f"result_count is {count + 1} but the result holds {count} records",
             "unfinished_source": "arrived before these sources finished: crm/crm-eu"}[contradiction]

    audit, alert = alerted(bos_airflow, run_dag, tmp_path, scenario)

    assert audit["completeness"] == "complete"  # what the server claimed...
    assert audit["status"] == "partial"  # ...is not trusted
    assert named in audit["error_message"]
    assert alert["outcome"] == "partial" and named in alert["message"]
    assert audit["inserted"] == count  # the records still land
    assert task_states(run_dag("bos_test_sync"))["check"] == "failed"  # on_partial="fail" (default)


def test_a_server_naming_too_many_sources_is_bounded_and_audited_partial(bos_airflow, run_dag, tmp_path) -> None:
    sources = [SourceSpec(source_type="crm", source_identity="crm-eu", records=30, page_size=10)]
    sources += [SourceSpec(source_type="directory", source_identity=f"ldap-{n:05d}-" + "x" * 40, records=0)
                for n in range(MAX_TRACKED_SOURCES + 50)]
    scenario = Scenario(name="many-sources", sources=sources)

    audit, alert = alerted(bos_airflow, run_dag, tmp_path, scenario)

    assert audit["completeness"] == "complete" and audit["status"] == "partial"
    assert f"more than {MAX_TRACKED_SOURCES} sources" in audit["error_message"]
    assert alert["outcome"] == "partial"
    summary = audit["source_summary"]
    summary = json.loads(summary) if isinstance(summary, str) else summary
    assert len(summary) == MAX_TRACKED_SOURCES + 1
    assert summary[0]["source_identity"] == "crm-eu" and summary[0]["records"] == 30
    assert summary[-1]["status"] == UNTRACKED_STATUS and str(MAX_TRACKED_SOURCES) in summary[-1]["source_identity"]
    assert audit["inserted"] == 30 and audit["provisional_records"] == 30


def test_server_supplied_source_names_cannot_forge_task_log_lines(bos_airflow, run_dag, capsys) -> None:
    scenario = Scenario(name="forged-names", shared_people=2, sources=[
        SourceSpec(source_type="crm", source_identity=FORGED, records=12, page_size=5),
        SourceSpec(source_type="hr\r\nWARNING", source_identity="hr-main", records=6, page_size=5,
                   error="source_timeout", error_after_pages=1),
    ])
    bos_airflow["server"].set_scenario(scenario)

    dag_run = run_dag("bos_test_sync", BOS_TEST_ON_PARTIAL="alert")

    assert task_states(dag_run)["sync"] == "success"
    captured = capsys.readouterr()  # the task log (structlog writes it to stdout under dag.test)
    lines = (captured.out + captured.err).splitlines()
    progress = [line for line in lines if "BOS progress:" in line]
    assert len(progress) >= 5, lines  # the pages, the terminal statuses
    assert any("crm/crm-eu\\nERROR - BOS grant expired" in line for line in progress)
    assert any("hr\\r\\nWARNING/hr-main ERROR source_timeout" in line for line in progress)
    # No line of the log starts with what the server wrote after its newlines.
    assert not [line for line in lines if line.lstrip().startswith(("ERROR - BOS grant", "WARNING/hr-main"))]
    assert "\x1b[31m" not in captured.out + captured.err
    [audit] = audit_rows(bos_airflow["engine"], bos_airflow["table"])
    assert audit["status"] == "partial"

"""End to end on Snowflake: reference server -> operator in a real dag.test() -> SnowflakeHook's
engine (Connection type ``snowflake``) -> the fakesnow server over the connector's HTTP protocol.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "warehouse"))
from afhelpers import task_states, xcom_summary
from fakesnow_support import fakesnow_server, snowflake_connection_json, snowflake_url  # noqa: F401

from airflow_provider_bos.testing.federation import plan_read
from airflow_provider_bos.testing.scenario import FaultSpec, load_scenario

pytestmark = [pytest.mark.airflow, pytest.mark.snowflake]


@pytest.fixture()
def warehouse_url(snowflake_url: str) -> str:  # noqa: F811 - the Snowflake destination for bos_airflow
    return snowflake_url


@pytest.fixture()
def sf_airflow(bos_airflow: dict[str, Any], fakesnow_server: dict[str, Any],  # noqa: F811
               monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """``bos_airflow`` with ``bos_warehouse`` as a Connection of type snowflake (SnowflakeHook's engine)."""
    monkeypatch.setenv("AIRFLOW_CONN_BOS_WAREHOUSE", json.dumps(snowflake_connection_json(fakesnow_server)))
    yield bos_airflow
    with bos_airflow["engine"].begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {bos_airflow['table']}_rejects")


def final_refs(scenario: Any) -> set[str]:
    read = plan_read(scenario, request_id="expected", context={"context_handle": "x"}, arguments={})
    return {r["record_ref"] for r in read.iter_final_records()}


def _rows(engine: sa.Engine, sql: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [{k.lower(): v for k, v in r._mapping.items()} for r in conn.exec_driver_sql(sql)]


def _refs(engine: sa.Engine, table: str) -> set[str]:
    return {r["record_ref"] for r in _rows(engine, f"SELECT record_ref FROM {table}")}


def _audit(engine: sa.Engine, table: str) -> list[dict[str, Any]]:
    rows = _rows(engine, "SELECT * FROM bos_sync_runs ORDER BY started_at")
    return [r for r in rows if str(r["destination_table"]).split(".")[-1] == table]


def test_the_hook_engine_is_snowflake_through_snowflake_hook(sf_airflow) -> None:
    from airflow_provider_bos.hooks.connections import engine_for_connection

    engine = engine_for_connection("bos_warehouse")
    assert (engine.dialect.name, engine.url.query["account"]) == ("snowflake", "fakesnow")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT CURRENT_DATABASE()").scalar() == "BOSDB"


def test_identity_merge_lands_the_final_records_and_the_sensor_passes(sf_airflow, run_dag) -> None:
    server, engine, table = sf_airflow["server"], sf_airflow["engine"], sf_airflow["table"]
    scenario = load_scenario("identity_merge")
    server.set_scenario(scenario)

    dag_run = run_dag("bos_test_sync")

    assert task_states(dag_run) == {"sync": "success", "check": "success", "downstream": "success"}
    refs = _refs(engine, table)
    assert refs == final_refs(scenario)
    [audit] = _audit(engine, table)
    assert audit["status"] == "complete" and audit["inserted"] == len(refs) and audit["provisional_records"] > 0
    assert xcom_summary(dag_run)["inserted"] == len(refs)


def test_second_identical_run_rewrites_zero_rows(sf_airflow, run_dag) -> None:
    server, engine, table = sf_airflow["server"], sf_airflow["engine"], sf_airflow["table"]
    server.set_scenario(load_scenario("complete"))
    first = run_dag("bos_test_sync")
    before = _rows(engine, f"SELECT * FROM {table} ORDER BY record_ref")

    second = run_dag("bos_test_sync")

    assert task_states(second)["sync"] == "success"
    summary = xcom_summary(second)
    assert (summary["inserted"], summary["updated"]) == (0, 0)
    assert summary["unchanged"] == xcom_summary(first)["inserted"] == 350
    assert _rows(engine, f"SELECT * FROM {table} ORDER BY record_ref") == before  # not even _bos_run_id moved


def test_partial_read_lands_and_the_sensor_stops_it(sf_airflow, run_dag) -> None:
    server, engine, table = sf_airflow["server"], sf_airflow["engine"], sf_airflow["table"]
    scenario = load_scenario("partial")
    server.set_scenario(scenario)

    states = task_states(run_dag("bos_test_sync"))

    assert (states["sync"], states["check"]) == ("success", "failed")
    [audit] = _audit(engine, table)
    assert audit["status"] == "partial"
    errors = json.loads(audit["source_errors"])
    assert sorted(e["error"]["code"] for e in errors) == ["rate_limited", "source_timeout"]


def test_unstorable_records_are_quarantined_in_the_rejects_table(sf_airflow, run_dag) -> None:
    server, engine, table = sf_airflow["server"], sf_airflow["engine"], sf_airflow["table"]
    scenario = load_scenario("complete").model_copy(update={"faults": FaultSpec(unstorable_final_records=True)})
    server.set_scenario(scenario)

    dag_run = run_dag("bos_test_sync", BOS_TEST_INVALID_RECORDS="quarantine")

    assert task_states(dag_run)["sync"] == "success"
    summary = xcom_summary(dag_run)
    assert summary["status"] == "partial" and summary["rejected"] == 2
    kept = _rows(engine, f"SELECT record_ref, record FROM {table}_rejects")
    assert len(kept) == 2 and all(json.loads(bytes(r["record"]))["record_ref"] == r["record_ref"] for r in kept)


def test_a_monitor_dag_judges_the_latest_sync(sf_airflow, run_dag) -> None:
    sf_airflow["server"].set_scenario(load_scenario("complete"))
    assert task_states(run_dag("bos_test_sync"))["sync"] == "success"

    monitor = run_dag("bos_test_monitor", BOS_TEST_MAX_AGE_S="3600")

    assert task_states(monitor)["watch"] == "success"


def test_asset_event_and_lineage_follow_the_snowflake_provider(sf_airflow, run_dag) -> None:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    from airflow_provider_bos.assets.tables import table_lineage_dataset

    sf_airflow["server"].set_scenario(load_scenario("complete"))
    dag_run = run_dag("bos_test_sync")
    with create_session() as session:
        [uri] = session.scalars(
            sa.select(AssetModel.uri).join(AssetEvent, AssetEvent.asset_id == AssetModel.id)
            .where(AssetEvent.source_run_id == dag_run.run_id, AssetEvent.source_task_id == "sync")
        ).all()
    table = sf_airflow["table"].upper()
    assert uri == f"snowflake://fakesnow/BOSDB/PUBLIC/{table}"
    # The provider's own converter gives the same dataset as our lineage facet.
    from urllib.parse import urlsplit

    from airflow.providers.snowflake.assets.snowflake import convert_asset_to_openlineage, sanitize_uri
    from airflow.sdk import Asset

    sanitize_uri(urlsplit(uri))
    dataset = convert_asset_to_openlineage(Asset(uri=uri), None)
    engine_url = sf_airflow["engine"].url
    assert table_lineage_dataset(engine_url, None, sf_airflow["table"]) == (dataset.namespace, dataset.name)
    assert dataset.name == f"BOSDB.PUBLIC.{table}"


def test_a_field_that_goes_empty_fails_the_coverage_check_and_alerts(sf_airflow, run_dag, tmp_path) -> None:
    server, engine, table = sf_airflow["server"], sf_airflow["engine"], sf_airflow["table"]
    watch = {"BOS_TEST_MIN_COVERAGE": json.dumps({"email": 0.5, "phone": 0.5})}
    filled = load_scenario("complete")
    server.set_scenario(filled)
    assert task_states(run_dag("bos_test_sync", **watch))["check"] == "success"

    server.set_scenario(filled.model_copy(update={"emptied_fields": ["phone"]}))
    failed = run_dag("bos_test_sync", **watch)
    alerts = tmp_path / "alerts.jsonl"
    alerted = run_dag("bos_test_sync", BOS_TEST_ON_PARTIAL="alert", BOS_TEST_ALERTS_FILE=str(alerts), **watch)

    assert task_states(failed) == {"sync": "success", "check": "failed", "downstream": "upstream_failed"}
    assert task_states(alerted) == {"sync": "success", "check": "success", "downstream": "success"}
    [alert] = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert alert["outcome"] == "low_coverage" and "phone had a value in 0 of" in alert["message"]
    coverages = [json.loads(a["coverage"]) if isinstance(a["coverage"], str) else a["coverage"]
                 for a in _audit(engine, table)]
    records = len(final_refs(filled))
    assert [c["records"] for c in coverages] == [records] * 3
    assert coverages[0]["columns"]["phone"] > records / 2
    assert [c["columns"]["phone"] for c in coverages[1:]] == [0, 0]
    assert len({c["columns"]["email"] for c in coverages}) == 1  # the other fields kept theirs

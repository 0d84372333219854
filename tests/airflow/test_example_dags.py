"""The example DAGs in dags/ parse cleanly and run end to end against the reference server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from afhelpers import task_states

from airflow_provider_bos.testing.scenario import load_scenario

REPO_DAGS = Path(__file__).resolve().parents[2] / "dags"
EXAMPLE_DAG_IDS = {"bos_sync_people", "bos_sync_people_daily", "bos_sync_all_contexts", "bos_completeness_monitor"}

pytestmark = pytest.mark.airflow


def test_example_dags_import_without_errors(airflow_db) -> None:
    from tests.airflow_names import DagBag

    bag = DagBag(dag_folder=str(REPO_DAGS))
    assert bag.import_errors == {}
    assert set(bag.dag_ids) >= EXAMPLE_DAG_IDS
    for dag_id in EXAMPLE_DAG_IDS:
        assert "bos" in bag.get_dag(dag_id).tags


@pytest.mark.parametrize("warehouse_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(("scenario", "rows"), [("complete", 350), ("empty", 0)])
def test_bos_sync_people_runs_end_to_end(bos_airflow, run_dag, scenario, rows) -> None:
    # "empty": the example reads what changed since its interval began, so a quiet hour is a
    # complete, empty read, not a broken one (its sensor once failed it with min_records=1).
    bos_airflow["server"].set_scenario(load_scenario(scenario))

    dag_run = run_dag("bos_sync_people", filename="bos_sync_people.py")

    assert task_states(dag_run) == {"sync_people": "success", "check_completeness": "success",
                                    "summarize_people": "success"}
    with bos_airflow["engine"].connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM bos_people")).scalar_one() == rows


@pytest.mark.parametrize("warehouse_url", ["sqlite"], indirect=True)
def test_bos_sync_all_contexts_maps_one_read_per_context(bos_airflow, run_dag) -> None:
    bos_airflow["server"].set_scenario(load_scenario("identity_merge"))

    dag_run = run_dag("bos_sync_all_contexts", filename="bos_sync_all_contexts.py")

    tis = dag_run.get_task_instances()
    mapped = [ti for ti in tis if ti.task_id == "sync_context"]
    assert len(mapped) == 2  # the reference server authorizes two contexts
    assert all(str(getattr(ti.state, "value", ti.state)) == "success" for ti in tis)
    inspector = sa.inspect(bos_airflow["engine"])
    tables = [t for t in inspector.get_table_names()
              if t.startswith("bos_people_") and not t.endswith(("_lineage", "_history", "_rejects", "_sources"))]
    assert len(tables) == 2


def test_each_context_gets_a_table_of_its_own() -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "dags" / "bos_sync_all_contexts.py"
    spec = importlib.util.spec_from_file_location("example_all_contexts", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    long = "ctx_contoso_corporate_people_directory_emea_"
    handles = [long + "production", long + "sandbox", "ctx-a", "CTX-A", "ctx_a"]
    tables = [module.table_for_context(h) for h in handles]
    assert len(set(tables)) == len(handles)  # once, the first two (and the last three) shared a table
    assert all(len(t) <= 63 and t == t.lower() for t in tables)


@pytest.mark.parametrize("warehouse_url", ["sqlite"], indirect=True)
def test_bos_completeness_monitor_alerts_on_a_partial_sync(bos_airflow, run_dag, tmp_path) -> None:
    bos_airflow["server"].set_scenario(load_scenario("partial"))
    run_dag("bos_sync_people", filename="bos_sync_people.py")
    alerts = tmp_path / "alerts.jsonl"

    monitor = run_dag("bos_completeness_monitor", filename="bos_completeness_monitor.py",
                      BOS_ALERTS_FILE=str(alerts))

    assert task_states(monitor) == {"watch_people_sync": "success"}
    [alert] = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert alert["outcome"] == "partial"
    assert {code for _, code in alert["failing_sources"]} == {"rate_limited", "source_timeout"}


@pytest.mark.parametrize("warehouse_url", ["sqlite"], indirect=True)
def test_bos_sync_people_daily_retires_leavers_and_follows_merges(bos_airflow, run_dag, monkeypatch) -> None:
    from airflow_provider_bos.pii import PiiKey, hash_value
    from airflow_provider_bos.testing.federation import day_changes, expected_final

    key_text = "yLkGEs7zrji2xAiuhaj9ankHWnau0aLn-fFqx_YHSBc"
    monkeypatch.setenv("AIRFLOW_CONN_BOS_PII_KEY", json.dumps({"conn_type": "generic", "password": key_text}))
    server, engine = bos_airflow["server"], bos_airflow["engine"]
    server.set_scenario(load_scenario("people_over_time"))
    try:
        for day in (1, 2):
            server.set_day(day)
            dag_run = run_dag("bos_sync_people_daily", filename="bos_sync_people_daily.py")
            assert task_states(dag_run) == {"sync_people": "success", "check_completeness": "success",
                                            "count_people": "success"}
        with engine.connect() as conn:
            current = set(conn.execute(sa.text(
                "SELECT record_ref FROM bos_people_daily WHERE _bos_deleted_at IS NULL")).scalars())
            merged = set(conn.execute(sa.text(
                "SELECT record_ref FROM bos_people_daily WHERE _bos_superseded_by IS NOT NULL")).scalars())
        assert current == expected_final("people_over_time", 2).refs
        assert merged == {old for olds in day_changes("people_over_time", 2).merged.values() for old in olds}
        # The policy: emails stored as their keyed hashes, the employment subtree nowhere.
        person = next(r.record for r in expected_final("people_over_time", 2).records if r.record["email"])
        with engine.connect() as conn:
            email, attributes = conn.execute(sa.text(
                "SELECT email, attributes FROM bos_people_daily WHERE record_ref = :ref"),
                {"ref": person["record_ref"]}).one()
        assert email == hash_value(PiiKey.from_text(key_text, source="the test"), "email", person["email"])
        assert "employment" not in json.loads(attributes)
    finally:
        with engine.begin() as conn:
            for table in ("bos_people_daily", "bos_people_daily_history", "bos_people_daily_lineage",
                          "bos_people_daily_rejects", "bos_people_daily_policy"):
                conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))

"""A destination the provider cannot write is refused by the operator, naming the supported ones, before any read."""

from __future__ import annotations

import json

import pytest
from afhelpers import task_states

from airflow_provider_bos.testing.scenario import load_scenario

pytestmark = pytest.mark.airflow


@pytest.mark.parametrize("warehouse_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("conn_type", ["oracle", "mssql", "http"])
def test_an_unsupported_destination_fails_before_anything_is_read(
    bos_airflow, run_dag, capsys, monkeypatch, conn_type,
) -> None:
    server = bos_airflow["server"]
    server.set_scenario(load_scenario("complete"))
    calls = server.counters.tool_calls
    monkeypatch.setenv("AIRFLOW_CONN_BOS_WAREHOUSE", json.dumps({"conn_type": conn_type, "host": "db.invalid"}))
    dag_run = run_dag("bos_test_sync")
    assert task_states(dag_run)["sync"] == "failed"
    out = "".join(capsys.readouterr())
    assert "Connection 'bos_warehouse'" in out
    assert "BOS writes to PostgreSQL, MySQL/MariaDB, SQLite, DuckDB or Snowflake" in out
    assert "connection types sqlite, postgres, mysql (MariaDB), duckdb or snowflake" in out
    assert server.counters.tool_calls == calls  # nothing was read from the server

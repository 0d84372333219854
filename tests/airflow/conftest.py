"""Fixtures for end-to-end Airflow runs: connections as env vars, a DAG loader, run inspection.

The warehouse of a DAG run here is SQLite unless a test parametrizes ``warehouse_url`` itself: the
dialect matrix lives in tests/warehouse (each dialect's SQL, on all four, in the fast tier). A file
where the dialect matters end to end keeps one smoke per server dialect (``every_dialect`` in
afhelpers.py: its PostgreSQL, MariaDB and DuckDB runs are in the full tier, see tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url


def connection_json_for_url(url: str) -> str:
    """An Airflow connection (JSON form) for a SQLAlchemy URL of the test databases."""
    u = make_url(url)
    backend = u.get_backend_name()
    if backend in ("sqlite", "duckdb"):  # a file path in the host field (the duckdb provider's too)
        return json.dumps({"conn_type": backend, "host": u.database})
    conn_type = "postgres" if backend == "postgresql" else "mysql"
    return json.dumps({"conn_type": conn_type, "host": u.host, "port": u.port, "login": u.username,
                       "password": u.password or "", "schema": u.database})


@pytest.fixture(params=["sqlite"])
def warehouse_url(request: pytest.FixtureRequest) -> str:
    """SQLite (a test that parametrizes ``warehouse_url`` indirectly picks its own dialects)."""
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture()
def bos_airflow(airflow_db: Path, bos_server: Any, warehouse_url: str, unique_table: str,
                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Connections `bos_default` (OAuth grant minted on the reference server) and `bos_warehouse`."""
    grant = bos_server.mint_grant()
    token_store = f"sqlite:///{tmp_path / 'tokens.db'}"
    monkeypatch.setenv("AIRFLOW_CONN_BOS_DEFAULT", json.dumps({
        "conn_type": "bos", "host": bos_server.mcp_url, "password": grant["refresh_token"],
        "extra": {"auth_type": "oauth", "client_id": grant["client_id"], "protocol": "auto",
                  "token_store_url": token_store},
    }))
    monkeypatch.setenv("AIRFLOW_CONN_BOS_WAREHOUSE", connection_json_for_url(warehouse_url))
    monkeypatch.setenv("BOS_TEST_TABLE", unique_table)
    engine = sa.create_engine(warehouse_url)
    yield {"server": bos_server, "grant": grant, "engine": engine, "table": unique_table,
           "url": warehouse_url, "tmp": tmp_path}
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE IF EXISTS {unique_table}"))
    engine.dispose()


def load_dag(dags_folder: Path, filename: str, dag_id: str) -> Any:
    """Parse one DAG file of the session dags folder the way Airflow does (DagBag)."""
    from tests.airflow_names import DagBag

    bag = DagBag(dag_folder=str(dags_folder / filename))
    assert not bag.import_errors, bag.import_errors
    return bag.get_dag(dag_id)


@pytest.fixture()
def run_dag(airflow_db: Path) -> Callable[..., Any]:
    """Run a DAG from the session dags folder with dag.test(); returns the DagRun."""

    from tests.airflow_names import dag_test_hears_hitl_answers

    def run(dag_id: str, filename: str = "bos_test_sync.py", **env: str) -> Any:
        for key, value in env.items():
            os.environ[key] = value
        try:
            dag = load_dag(airflow_db, filename, dag_id)
            # dag.test() of a DAG with a deadline fails once its run succeeds on Airflow 3.3
            # (apache/airflow#73428); the daily DAG's deadline is tested in test_deadline_alert.py.
            dag.deadline = None
            with dag_test_hears_hitl_answers():
                return dag.test()
        finally:
            for key in env:
                os.environ.pop(key, None)

    return run


@pytest.fixture()
def bos_airflow_audit(bos_airflow: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """``bos_airflow`` plus a private audit table (dropped afterwards)."""
    audit = f"a_{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("BOS_TEST_AUDIT_TABLE", audit)
    env = {**bos_airflow, "audit": audit}
    yield env
    with env["engine"].begin() as conn:
        conn.execute(sa.text(f"DROP TABLE IF EXISTS {audit}"))


@pytest.fixture()
def days(bos_airflow_audit: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``bos_airflow_audit`` serving the builtin ``people_over_time`` scenario (its days: joins, merges,
    splits, leavers, a partial day); the history and lineage tables dropped afterwards."""
    from airflow_provider_bos.testing.scenario import load_scenario
    from airflow_provider_bos.warehouse.tables.schema import companion_table_name

    env = bos_airflow_audit
    env["server"].set_scenario(load_scenario("people_over_time"))
    yield env
    with env["engine"].begin() as conn:
        for suffix in ("lineage", "history", "sources"):
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {companion_table_name(env['table'], suffix)}"))

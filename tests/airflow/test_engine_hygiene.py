"""The sensor and the operator give back every database connection they open.

The sensor pokes every ``poke_interval`` for as long as the sync runs: an engine left behind per
poke is a connection held open per poke, until the database refuses new ones.
"""

from __future__ import annotations

import gc
import os
import uuid
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
import sqlalchemy as sa
from afhelpers import task_states
from sqlalchemy.engine import make_url

from airflow_provider_bos.hooks import connections
from airflow_provider_bos.sensors.completeness import BosCompletenessSensor
from airflow_provider_bos.testing.scenario import load_scenario
from airflow_provider_bos.warehouse import WarehouseWriter

pytestmark = pytest.mark.postgres


def _open_connections_to(port: int) -> int:
    """Established TCP connections of this process to the database's port."""
    return sum(
        1 for c in psutil.Process(os.getpid()).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


def test_twenty_pokes_leave_no_connection_open(postgres_url: str, unique_table: str, monkeypatch: Any) -> None:
    audit = unique_table + "_runs"
    setup = sa.create_engine(postgres_url)
    WarehouseWriter(setup, table=unique_table, audit_table=audit).ensure_tables()
    setup.dispose()
    # The engine engine_for_connection builds for a postgres Connection, without an Airflow task.
    monkeypatch.setattr(connections, "engine_for_connection",
                        lambda conn_id: sa.create_engine(postgres_url, pool_pre_ping=True))
    sensor = BosCompletenessSensor(task_id="check", destination_conn_id="warehouse", sync_task_id="sync",
                                   audit_table=audit)
    # The sync task published a run id that is not recorded yet: every poke looks it up and waits.
    context = {"ti": SimpleNamespace(xcom_pull=lambda task_ids, key: str(uuid.uuid4()))}
    port = make_url(postgres_url).port or 5432
    gc.collect()  # an earlier test's unreachable engine must not close by chance during the measurement
    before = _open_connections_to(port)

    for _ in range(20):
        assert sensor.poke(context) is False

    assert _open_connections_to(port) == before


@pytest.mark.airflow
@pytest.mark.parametrize("warehouse_url", ["postgres"], indirect=True)
def test_a_dag_run_leaves_no_warehouse_connection_open(bos_airflow: dict[str, Any], run_dag: Any) -> None:
    # The operator's sync and the sensor's check, in a real dag.test() run in this process.
    bos_airflow["server"].set_scenario(load_scenario("complete"))
    port = make_url(bos_airflow["url"]).port or 5432
    gc.collect()  # an earlier test's unreachable engine must not close by chance during the measurement
    before = _open_connections_to(port)

    assert task_states(run_dag("bos_test_sync")) == {"sync": "success", "check": "success", "downstream": "success"}

    assert _open_connections_to(port) == before

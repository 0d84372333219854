"""BOS on a real Airflow deployment: API server, scheduler, DAG processor, Local or Celery executor.

Every component is its own process from the project venv, on a fresh PostgreSQL metadata DB, with
the ``airflow.cfg`` fragment of docs/deployment.md. The reference server runs in this process (2 s access
tokens); the grant lives in a PostgreSQL token store every task shares. Three phases per executor:

1. 8 mapped reads into 8 new tables at once, then a sensor per table: all succeed on the first
   try, their windows overlap, each table holds exactly the final records, 8 ``complete`` audit
   rows, no refresh-token reuse and no revoked grant at the server, no token in any log.
2. A stalled read marked failed through the REST API (the UI's "Mark as failed"): the BOS call is
   cancelled at the server and the audit row says ``failed``.
3. A read whose worker is SIGKILLed mid-stream (Local: the task process; Celery: the whole worker)
   is retried and lands the records exactly once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import sqlalchemy as sa
from afdeploy import (
    FRAGMENT,
    HERE,
    PG_ADMIN_URL,
    Deployment,
    create_database,
    drop_database,
    drop_orphaned_databases,
    wait_for,
)

from airflow_provider_bos.testing.federation import plan_read
from airflow_provider_bos.testing.scenario import FaultSpec, Scenario, SourceSpec

pytestmark = [pytest.mark.deployment, pytest.mark.postgres, pytest.mark.timeout(900)]

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

# Few records, slow pages: each read lasts ~7 s, long enough for its 2 s access tokens to expire
# and for the 8 reads to be running at the same time, short enough for CI.
SMALL = Scenario(
    name="deployment",
    seed=17,
    shared_people=2,
    sources=[
        SourceSpec(source_type="crm", source_identity="crm-eu", records=6, page_size=1, page_delay_ms=1200),
        SourceSpec(source_type="hr", source_identity="hr-main", records=4, page_size=1, page_delay_ms=1500),
    ],
)
STALL = SMALL.model_copy(update={"faults": FaultSpec(stall=True, keepalive_interval_ms=100)})
TOKEN = re.compile(r"bos_(?:at|rt)_[A-Za-z0-9_-]{20,}")


def _reachable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def expected_records() -> set[tuple[str, str, str]]:
    read = plan_read(SMALL, request_id="expected", context={"context_handle": "x"}, arguments={})
    return {(r["record_ref"], r["display_name"], r["email"]) for r in read.iter_final_records()}


def stored_records(engine: sa.Engine, table: str) -> list[tuple[str, str, str]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(f"SELECT record_ref, display_name, email FROM {table}"))]


def audit_rows(engine: sa.Engine, airflow_run_id: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT * FROM bos_sync_runs WHERE airflow_run_id = :r"),
                            {"r": airflow_run_id}).mappings().all()
    return [dict(r) for r in rows]


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


@pytest.fixture(params=["LocalExecutor", "CeleryExecutor"])
def deployment(request: pytest.FixtureRequest, tmp_path: Path,
               bos_server_factory: Callable[..., Any]) -> Iterator[tuple[Deployment, Any, sa.Engine, str]]:
    # Marker `deployment`: the full tier only (3-6 min per executor; `bash .ci/test --all`, .ci/run).
    for name, port in (("PostgreSQL", 5432), ("Redis", 6379)):
        if not _reachable(port):
            message = f"{name} is not reachable on 127.0.0.1:{port}; the deployment test needs it"
            if IN_CI:
                pytest.fail(f"{message}; under CI=true it must run, not skip.")
            pytest.skip(f"{message} (start it to run this test; CI runs it).")
    drop_orphaned_databases()  # of an earlier run killed before its teardown
    server = bos_server_factory(scenario=SMALL, access_token_ttl_s=2)
    warehouse_db = create_database("bos_wh")
    warehouse_url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{warehouse_db}"
    prefix = f"d_{os.urandom(4).hex()}"
    dep = Deployment(tmp_path / "airflow", request.param, dags=HERE / "dags",
                     env={"BOS_DEPLOY_TABLE_PREFIX": prefix, "BOS_DEPLOY_RECORDS": str(len(expected_records()))})
    engine = sa.create_engine(warehouse_url, poolclass=sa.pool.NullPool)
    try:
        dep.start()
        grant = server.mint_grant()
        dep.import_connections({
            "bos_default": {
                "conn_type": "bos", "host": server.mcp_url, "password": grant["refresh_token"],
                "extra": json.dumps({"auth_type": "oauth", "client_id": grant["client_id"], "protocol": "auto",
                                     "token_store_url": warehouse_url}),
            },
            "bos_warehouse": {"conn_type": "postgres", "host": "127.0.0.1", "port": 5432, "login": "postgres",
                              "schema": warehouse_db},
        })
        yield dep, server, engine, prefix
    except BaseException:
        for name in dep.processes:
            print(f"----- {name} -----\n{dep.proc_log(name)}")
        raise
    finally:
        dep.stop()
        engine.dispose()
        drop_database(warehouse_db)


def test_a_killed_run_leaves_no_database_and_no_process_behind() -> None:
    finished = subprocess.Popen(["true"])  # its pid, once reaped, belongs to no process
    finished.wait()
    dead_pid = finished.pid
    orphan = f"bos_wh_{dead_pid}_{os.urandom(5).hex()}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {orphan}")
    ours = create_database("bos_wh")
    try:
        assert orphan in drop_orphaned_databases()
        with admin.connect() as conn:
            left = set(conn.exec_driver_sql("SELECT datname FROM pg_database").scalars())
        assert orphan not in left and ours in left  # this live run's database stays
    finally:
        drop_database(ours)
        drop_database(orphan)

    # A component spawned like the deployment's dies with the test process, even one killed by SIGKILL.
    runner = subprocess.Popen(
        [sys.executable, "-c",
         ("import subprocess, sys, time; sys.path.insert(0, sys.argv[1]); from afdeploy import _die_with_the_test_run; "
          "p = subprocess.Popen(['sleep', '300'], start_new_session=True, preexec_fn=_die_with_the_test_run); "
          "print(p.pid, flush=True); time.sleep(300)"), str(HERE)],
        stdout=subprocess.PIPE, text=True)
    assert runner.stdout is not None
    component = int(runner.stdout.readline())
    runner.kill()
    runner.wait()
    wait_for("the component to die with its test process",
             lambda: not psutil.pid_exists(component) or psutil.Process(component).status() == psutil.STATUS_ZOMBIE,
             timeout=10)


def test_the_documented_fragment_is_what_the_deployment_test_configures() -> None:
    guide = (HERE.parent.parent / "docs" / "deployment.md").read_text()
    assert f"```ini\n{FRAGMENT.read_text()}```" in guide


def test_bos_on_a_real_airflow_deployment(deployment: tuple[Deployment, Any, sa.Engine, str]) -> None:
    dep, server, engine, prefix = deployment
    started = time.monotonic()
    dep.wait_for_dag("bos_deploy_sync")
    dep.wait_for_dag("bos_deploy_kill")
    parallel_reads(dep, server, engine, [f"{prefix}_t{i}" for i in range(8)])
    on_kill_via_rest_api(dep, server, engine, f"{prefix}_kill")
    retry_after_worker_killed(dep, server, engine, f"{prefix}_kill")
    # Secrets: no access or refresh token in any task log (nor in the components' own output).
    logs = dep.task_log_files()
    assert len(logs) >= 17, [str(p) for p in logs]
    leaks = [str(p) for p in [*logs, *(dep.home / "proc").iterdir()] if TOKEN.search(p.read_text(errors="replace"))]
    assert leaks == []
    print(f"{dep.executor}: phases took {time.monotonic() - started:.0f}s after start-up")


def parallel_reads(dep: Deployment, server: Any, engine: sa.Engine, tables: list[str]) -> None:
    run_id = dep.trigger("bos_deploy_sync")
    state = dep.wait_for_run("bos_deploy_sync", run_id)
    tis = dep.task_instances("bos_deploy_sync", run_id)
    summary = sorted((t["task_id"], t["map_index"], t["state"], t["try_number"]) for t in tis)
    assert state == "success", summary
    assert summary == sorted([("read", i, "success", 1) for i in range(8)] + [("check", i, "success", 1)
                                                                              for i in range(8)])
    # The 8 reads ran at the same time: one instant lies inside every read's window.
    reads = [t for t in tis if t["task_id"] == "read"]
    last_start = max(_ts(t["start_date"]) for t in reads)
    first_end = min(_ts(t["end_date"]) for t in reads)
    assert last_start < first_end, [(t["map_index"], t["start_date"], t["end_date"]) for t in reads]

    expected = expected_records()
    for table in tables:
        stored = stored_records(engine, table)
        assert len(stored) == len(expected) and set(stored) == expected, table
    audits = audit_rows(engine, run_id)
    assert sorted((a["destination_table"], a["status"], a["inserted"]) for a in audits) == sorted(
        (t, "complete", len(expected)) for t in tables)

    counters = server.counters.snapshot()
    assert counters["refresh_reuse_detected"] == 0 and counters["grants_revoked"] == 0, counters
    assert counters["refreshes"] >= 1, counters  # the 2 s tokens did expire and were refreshed


def on_kill_via_rest_api(dep: Deployment, server: Any, engine: sa.Engine, table: str) -> None:
    server.set_scenario(STALL)
    streamed, cancelled = server.counters.streamed_calls, server.counters.cancelled_calls
    run_id = dep.trigger("bos_deploy_kill")
    assert server.counters.wait_until("streamed_calls", streamed + 1, timeout=120), "the read never started"
    dep.mark_failed("bos_deploy_kill", run_id, "read")
    assert server.wait_for_cancelled_calls(cancelled + 1, timeout=90), "the BOS call was not cancelled"
    failed = wait_for("the failed audit row",
                      lambda: [a for a in audit_rows(engine, run_id) if a["status"] == "failed"], timeout=90)
    assert len(failed) == 1 and failed[0]["inserted"] in (0, None), failed
    assert dep.wait_for_run("bos_deploy_kill", run_id) == "failed"
    ti = dep.task_instance("bos_deploy_kill", run_id, "read")
    assert (ti["state"], ti["try_number"]) == ("failed", 1), ti
    assert stored_records(engine, table) == []


def retry_after_worker_killed(dep: Deployment, server: Any, engine: sa.Engine, table: str) -> None:
    server.set_scenario(STALL)
    streamed = server.counters.streamed_calls
    run_id = dep.trigger("bos_deploy_kill")
    assert server.counters.wait_until("streamed_calls", streamed + 1, timeout=120), "the read never started"
    ti = dep.task_instance("bos_deploy_kill", run_id, "read")
    # The retry reads normally; the stalled first attempt dies mid-stream with its worker.
    server.set_scenario(SMALL)
    killed: tuple[str, ...] = ()
    if dep.executor == "CeleryExecutor":
        killed = (dep.owner_of(ti["pid"]),)
        dep.kill(killed[0])
    else:
        os.kill(ti["pid"], signal.SIGKILL)
    assert dep.wait_for_run("bos_deploy_kill", run_id, except_=killed) == "success"
    ti = dep.task_instance("bos_deploy_kill", run_id, "read")
    assert (ti["state"], ti["try_number"]) == ("success", 2), ti
    expected = expected_records()
    stored = stored_records(engine, table)
    assert len(stored) == len(expected) and set(stored) == expected
    complete = [a for a in audit_rows(engine, run_id) if a["status"] == "complete"]
    assert [(a["inserted"], a["updated"]) for a in complete] == [(len(expected), 0)], complete

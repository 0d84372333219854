"""8 processes share one ``bos`` connection and one token store while access tokens keep dying.

What this file proves is the Airflow side of token rotation: 8 plain processes each doing what a task
does (a new ``BosHook`` from the connection, its ``token_store_url``, one federated read, close), on
one PostgreSQL token store, with 1-second access tokens, so refreshes happen concurrently and reads
keep getting them. BOS rotates the refresh token on every refresh and revokes the whole grant if a
rotated one is presented again: required are zero reuse detections, zero revoked grants, every read
complete, and at least ``MIN_REFRESHES`` refresh cycles.

The contention proof itself (the store's row lock and re-read, 100 contended refreshes, SQLite,
PostgreSQL and MariaDB, and after a reconnect) is tests/auth/test_rotation_concurrency.py; the end to
end one (8 mapped tasks of a real deployment sharing one grant) is tests/deployment. So this one
needs only enough cycles to see the hooks refresh under contention (full tier: marker ``slow``).
``BOS_TEST_CONCURRENCY_TTL_S`` and ``BOS_TEST_CONCURRENCY_REFRESHES`` make it longer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_bos.auth import SqlTokenStore
from airflow_provider_bos.testing.scenario import Scenario, SourceSpec

pytestmark = pytest.mark.airflow

HERE = Path(__file__).resolve().parent
WORKERS = 8
MIN_REFRESHES = int(os.environ.get("BOS_TEST_CONCURRENCY_REFRESHES", "20"))
TTL_S = float(os.environ.get("BOS_TEST_CONCURRENCY_TTL_S", "1"))
# One shared grant row refreshes about once per half token lifetime (the refresh-ahead margin is
# half the lifetime for short-lived tokens), whatever the number of workers: with 1 s tokens, 20
# cycles take ~10 s once the workers are up. The bound only stops a hung run.
TIME_LIMIT_S = 60 + MIN_REFRESHES * TTL_S

SCENARIO = Scenario(
    name="concurrency",
    seed=3,
    sources=[SourceSpec(source_type="crm", source_identity="crm-eu", records=12, page_size=5)],
)


def _run_workers(server: Any, tmp_path: Path, token_store_url: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    server.set_scenario(SCENARIO)
    server.set_access_token_ttl(TTL_S)
    grant = server.mint_grant()
    conn_id = f"bos_conc_{uuid.uuid4().hex[:10]}"
    env = {
        **os.environ,
        f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps({
            "conn_type": "bos", "host": server.mcp_url, "password": grant["refresh_token"],
            "extra": {"auth_type": "oauth", "client_id": grant["client_id"], "token_store_url": token_store_url},
        }),
    }
    stop = tmp_path / "stop"
    procs: list[subprocess.Popen] = []
    try:
        for i in range(WORKERS):
            ready = tmp_path / f"ready-{i}"
            procs.append(subprocess.Popen(
                [sys.executable, str(HERE / "bos_hook_worker.py"), conn_id, str(ready), str(stop)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            ))
        # Bounded by count and by time: stop once enough refresh cycles happened (or time is up).
        started = time.monotonic()
        server.counters.wait_until("refreshes", MIN_REFRESHES, timeout=TIME_LIMIT_S)
        elapsed = time.monotonic() - started
        stop.touch()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        stop.touch()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    counters = server.counters.snapshot()
    counters["_elapsed_s"] = int(elapsed)
    counters["_conn_id"] = conn_id  # type: ignore[assignment]
    return results, counters


def _assert_safe(results: list[dict[str, Any]], counters: dict[str, Any]) -> None:
    errors = [e for r in results for e in r["errors"]]
    assert not errors, errors[:3]
    assert counters["refresh_reuse_detected"] == 0, counters
    assert counters["grants_revoked"] == 0, counters
    assert counters["refreshes"] >= MIN_REFRESHES, counters
    reads = sum(r["reads"] for r in results)
    assert all(r["reads"] >= 1 for r in results), results  # every worker really took part
    assert counters["completed_streams"] >= reads  # every read got its final response


@pytest.mark.slow
@pytest.mark.postgres
def test_eight_processes_share_a_postgres_token_store(bos_server, postgres_url, tmp_path) -> None:
    # PostgreSQL: the store a deployment's tasks share. The SQLite file store under the same
    # contention is proven at the auth level (test_rotation_concurrency.py).
    results, counters = _run_workers(bos_server, tmp_path, postgres_url)
    try:
        _assert_safe(results, counters)
    finally:
        store = SqlTokenStore(postgres_url)
        store.delete(counters["_conn_id"])
        store.dispose()


@pytest.mark.postgres
def test_closing_a_hook_releases_its_token_store_connections(bos_server, postgres_url, monkeypatch) -> None:
    """A TaskFlow task (or a long-lived process) that opens and closes hooks must not pile up DB sessions.

    close() releases the token store's pool and the HTTP client itself: left to the garbage
    collector, 8 busy workers exhaust PostgreSQL's connection slots.
    """
    import gc

    import sqlalchemy as sa

    from airflow_provider_bos.hooks.bos import BosHook

    bos_server.set_scenario("empty")
    grant = bos_server.mint_grant()
    tag = f"bos_leak_{uuid.uuid4().hex[:8]}"
    conn_id = f"bos_leak_{uuid.uuid4().hex[:8]}"
    store_url = f"{postgres_url}?application_name={tag}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({
        "conn_type": "bos", "host": bos_server.mcp_url, "password": grant["refresh_token"],
        "extra": {"auth_type": "oauth", "client_id": grant["client_id"], "token_store_url": store_url}}))
    engine = sa.create_engine(postgres_url)

    def open_sessions() -> int:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :t"),
                                {"t": tag}).scalar_one()

    gc.disable()  # what is released must be released by close(), not by a lucky collection
    try:
        for _ in range(3):
            with BosHook(conn_id) as hook:
                hook.federated_read("people.search", {})
        lingering = open_sessions()
    finally:
        gc.enable()
        gc.collect()
        store = SqlTokenStore(postgres_url)
        store.delete(conn_id)
        store.dispose()
        engine.dispose()
    assert lingering == 0

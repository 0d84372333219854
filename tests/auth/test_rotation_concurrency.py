"""8 processes share one token store and one rotating grant with short-lived access tokens.

Refresh tokens rotate with reuse detection on the server: any refresh made with an already-used
refresh token revokes the grant. With the row lock and re-read, there must be no reuse at all,
also when half of the workers still hold the Connection from before a reconnect (its refresh token
long spent) while the other half hold the new one.

This file is the concurrency proof of token rotation at the auth level (the end-to-end one is the
deployment test; tests/airflow/test_concurrent_hooks.py only adds the hooks' side). The fast tier
runs it on the SQLite file store; the full tier (marker ``full``) on PostgreSQL and MariaDB and after
a reconnect too. Each store's row lock itself is proven on every dialect in the fast tier by
test_token_store.py (``test_a_second_locker_waits_for_the_first``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from airflow_provider_bos.auth.discovery import discover
from airflow_provider_bos.auth.grants import OAuthGrantAuth
from airflow_provider_bos.auth.token_store import SqlTokenStore

WORKERS = 8
TARGET_REFRESHES = 100
# The reconnect variants and MariaDB (slower row locks) stop earlier: what they prove is 0 reuse
# under contention, and 30 contended refreshes show it.
SHORT_TARGET = 30
WORKER_SCRIPT = Path(__file__).with_name("rotation_worker.py")


def run_rotation(
    bos_server, store_url: str, *, after_reconnect: bool = False, target: int = TARGET_REFRESHES
) -> None:
    table = f"grants_{uuid.uuid4().hex[:10]}"
    bos_server.set_access_token_ttl(2)
    token_endpoint = discover(bos_server.mcp_url).token_endpoint
    grant = bos_server.mint_grant()
    store = SqlTokenStore(store_url, table=table)
    try:
        store.seed(
            "bos_default",
            client_id=grant["client_id"],
            token_endpoint=token_endpoint,
            resource=bos_server.mcp_url,
            scope=grant["scope"],
            refresh_token=grant["refresh_token"],
            access_token=grant["access_token"],
            expires_at=time.time() + grant["expires_in"],
        )
        seeds = [grant["refresh_token"]] * WORKERS
        if after_reconnect:
            old_seed = grant["refresh_token"]
            spend_once(store, token_endpoint, bos_server.mcp_url, grant["client_id"])
            grant = bos_server.mint_grant()  # the user reconnects, as the connect command stores it
            store.seed(
                "bos_default",
                client_id=grant["client_id"],
                token_endpoint=token_endpoint,
                resource=bos_server.mcp_url,
                scope=grant["scope"],
                refresh_token=grant["refresh_token"],
                access_token=grant["access_token"],
                expires_at=time.time() + grant["expires_in"],
                force=True,
            )
            spend_once(store, token_endpoint, bos_server.mcp_url, grant["client_id"])
            seeds = [old_seed, grant["refresh_token"]] * (WORKERS // 2)
        start_generation = store.load("bos_default").generation
        start_refreshes = bos_server.counters.refreshes
        config = {
            "store_url": store_url,
            "table": table,
            "key": "bos_default",
            "token_endpoint": token_endpoint,
            "client_id": grant["client_id"],
            "mcp_url": bos_server.mcp_url,
            # 2 s tokens refreshed 1.85 s ahead: a new refresh cycle about every 0.15 s.
            "margin": 1.85,
            "target_refreshes": start_generation + target - 1,
            "max_seconds": 60,
        }
        workers = [
            subprocess.Popen(
                [sys.executable, str(WORKER_SCRIPT), json.dumps({**config, "seed_refresh_token": seed})],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for seed in seeds
        ]
        summaries = []
        for worker in workers:
            out, err = worker.communicate(timeout=120)
            assert worker.returncode == 0, err[-2000:]
            summaries.append(json.loads(out.strip().splitlines()[-1]))
        final = store.load("bos_default")
    finally:
        with store.engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
        store.dispose()

    failures = [f for s in summaries for f in s["failures"]]
    assert failures == []
    assert all(s["ok"] > 0 for s in summaries), summaries  # every process really took part
    counters = bos_server.counters
    assert counters.refresh_reuse_detected == 0
    assert counters.grants_revoked == 0
    client_refreshes = sum(s["refreshes"] for s in summaries)
    assert counters.refreshes - start_refreshes == client_refreshes == final.generation - start_generation
    assert client_refreshes >= target
    # More than one process did refreshes: the lock was actually contended, not one hot worker.
    assert sum(1 for s in summaries if s["refreshes"]) > 1


def spend_once(store: SqlTokenStore, token_endpoint: str, resource: str, client_id: str) -> None:
    """One refresh of the stored grant: the refresh token it was seeded with is spent."""
    auth = OAuthGrantAuth(store, "bos_default", token_endpoint=token_endpoint, client_id=client_id,
                          resource=resource)
    try:
        auth.access_token(rejected=auth.access_token())
    finally:
        auth.close()


def test_eight_processes_on_the_sqlite_file_store(bos_server, tmp_path: Path) -> None:
    run_rotation(bos_server, f"sqlite:///{tmp_path / 'bos_token_store.db'}")


@pytest.mark.full
@pytest.mark.postgres
def test_eight_processes_on_postgres(bos_server, postgres_url: str) -> None:
    run_rotation(bos_server, postgres_url)


@pytest.mark.full
@pytest.mark.mysql
def test_eight_processes_on_mariadb(bos_server, mysql_url: str) -> None:
    run_rotation(bos_server, mysql_url, target=SHORT_TARGET)


@pytest.mark.full
def test_old_and_new_connections_after_a_reconnect_on_the_sqlite_file_store(bos_server, tmp_path: Path) -> None:
    run_rotation(bos_server, f"sqlite:///{tmp_path / 'bos_token_store.db'}", after_reconnect=True, target=SHORT_TARGET)


@pytest.mark.full
@pytest.mark.postgres
def test_old_and_new_connections_after_a_reconnect_on_postgres(bos_server, postgres_url: str) -> None:
    run_rotation(bos_server, postgres_url, after_reconnect=True, target=SHORT_TARGET)


@pytest.mark.full
@pytest.mark.mysql
def test_old_and_new_connections_after_a_reconnect_on_mariadb(bos_server, mysql_url: str) -> None:
    run_rotation(bos_server, mysql_url, after_reconnect=True, target=SHORT_TARGET)

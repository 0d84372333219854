"""Which Connection password may (re)seed the stored grant, against the reference server's
refresh-token reuse detection: only a never-seen one; an old or a masked one never replaces it."""

from __future__ import annotations

import logging
import time

import httpx
import pytest

from airflow_provider_bos.auth.grants import OAuthGrantAuth
from airflow_provider_bos.exceptions import BosReconnectRequired

KEY = "bos_default"
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


def worker(bos_server, store, token_endpoint, client_id: str, seed: str | None) -> OAuthGrantAuth:
    """What a task builds from its Connection (password = ``seed``)."""
    return OAuthGrantAuth(
        store, KEY, token_endpoint=token_endpoint, client_id=client_id, resource=bos_server.mcp_url,
        seed_refresh_token=seed,
    )


def call(bos_server, auth: httpx.Auth) -> int:
    with httpx.Client(auth=auth, headers={"Accept": "application/json, text/event-stream"}) as client:
        return client.post(bos_server.mcp_url, json=INIT).status_code


def rotate(auth: OAuthGrantAuth) -> None:
    auth.access_token(rejected=auth.access_token())  # as after a 401


def test_an_old_connection_after_a_reconnect_does_not_revoke_the_new_grant(
    bos_server, store, token_endpoint
) -> None:
    first = bos_server.mint_grant()
    old_worker = worker(bos_server, store, token_endpoint, first["client_id"], first["refresh_token"])
    rotate(old_worker)  # the first seed is spent at the server
    second = bos_server.mint_grant()  # the user reconnects
    new_worker = worker(bos_server, store, token_endpoint, second["client_id"], second["refresh_token"])
    rotate(new_worker)
    generation = store.load(KEY).generation
    # A worker whose secrets backend still serves the first Connection starts now.
    stale = worker(bos_server, store, token_endpoint, first["client_id"], first["refresh_token"])
    assert call(bos_server, stale) == 200
    rotate(stale)
    assert call(bos_server, new_worker) == 200
    assert store.load(KEY).generation == generation + 1
    assert bos_server.counters.refresh_reuse_detected == 0 and bos_server.counters.grants_revoked == 0


@pytest.mark.parametrize("password", ["***", "", "  \t", "********"])
def test_a_masked_or_empty_password_uses_the_stored_grant_and_says_how_to_fix_it(
    bos_server, store, token_endpoint, caplog, password: str
) -> None:
    grant = bos_server.mint_grant()
    rotate(worker(bos_server, store, token_endpoint, grant["client_id"], grant["refresh_token"]))
    before = store.load(KEY)
    copied = worker(bos_server, store, token_endpoint, grant["client_id"], password)
    with caplog.at_level(logging.WARNING, logger="airflow_provider_bos.auth.grants"):
        assert call(bos_server, copied) == 200
    assert store.load(KEY) == before  # not re-seeded
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "--show-secrets" in warning and "token store" in warning
    rotate(copied)
    assert bos_server.counters.refresh_reuse_detected == 0 and bos_server.counters.grants_revoked == 0


@pytest.mark.parametrize("password", ["***", " "])
def test_a_masked_password_without_a_stored_grant_fails_clearly(
    bos_server, store, token_endpoint, password: str
) -> None:
    auth = worker(bos_server, store, token_endpoint, "cid", password)
    with pytest.raises(BosReconnectRequired, match="holds no refresh token") as caught:
        auth.access_token()
    assert "--show-secrets" in str(caught.value)
    assert store.load(KEY) is None


def test_a_never_seen_seed_replaces_the_row(bos_server, store, token_endpoint) -> None:
    first = bos_server.mint_grant()
    rotate(worker(bos_server, store, token_endpoint, first["client_id"], first["refresh_token"]))
    second = bos_server.mint_grant()
    reconnected = worker(bos_server, store, token_endpoint, second["client_id"], second["refresh_token"])
    assert call(bos_server, reconnected) == 200
    row = store.load(KEY)
    assert row.generation >= 3 and row.refresh_token != first["refresh_token"]
    assert bos_server.counters.refresh_reuse_detected == 0


def test_the_seeded_row_expires_as_the_server_said(bos_server, store, token_endpoint) -> None:
    grant = bos_server.mint_grant()
    auth = worker(bos_server, store, token_endpoint, grant["client_id"], grant["refresh_token"])
    auth.access_token()
    assert store.load(KEY).expires_at == pytest.approx(time.time() + 3600, abs=60)

"""Where a stored grant's tokens may go: only to the Connection's current resource and client, and
refreshes only to the token endpoint discovered for that resource, which must be the row's."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet

from airflow_provider_bos.auth.grants import OAuthGrantAuth
from airflow_provider_bos.auth.token_store import SqlTokenStore
from airflow_provider_bos.exceptions import BosReconnectRequired, BosTokenStoreError

KEY = "bos_default"
OTHER_RESOURCE = "https://other-bos.example/mcp/apps/bos/platform"


def seeded_worker(bos_server, store, token_endpoint, **overrides) -> tuple[OAuthGrantAuth, dict]:
    grant = bos_server.mint_grant()
    kwargs = dict(token_endpoint=token_endpoint, client_id=grant["client_id"], resource=bos_server.mcp_url,
                  seed_refresh_token=grant["refresh_token"])
    auth = OAuthGrantAuth(store, KEY, **kwargs)
    auth.access_token()
    return OAuthGrantAuth(store, KEY, **{**kwargs, **overrides}), grant


def test_a_changed_host_with_the_same_password_gets_no_token(bos_server, store, token_endpoint) -> None:
    moved, grant = seeded_worker(bos_server, store, token_endpoint, resource=OTHER_RESOURCE)
    with pytest.raises(BosReconnectRequired, match=r"other-bos.example") as caught:
        moved.access_token()
    assert grant["access_token"] not in str(caught.value)
    assert store.load(KEY).resource == bos_server.mcp_url  # nothing rewritten


def test_a_changed_client_id_gets_no_token(bos_server, store, token_endpoint) -> None:
    moved, _ = seeded_worker(bos_server, store, token_endpoint, client_id="another-client")
    with pytest.raises(BosReconnectRequired, match="another-client"):
        moved.access_token()


def test_the_binding_is_checked_on_every_refresh(bos_server, store, token_endpoint) -> None:
    """A row rewritten under a running worker (another Connection, a tampered table)."""
    auth, _ = seeded_worker(bos_server, store, token_endpoint)
    token = auth.access_token()
    refreshes = bos_server.counters.refreshes
    with store.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {store.table_name} SET resource = :r"), {"r": OTHER_RESOURCE})
    with pytest.raises(BosReconnectRequired, match=r"other-bos.example"):
        auth.access_token(rejected=token)
    assert bos_server.counters.refreshes == refreshes


def test_a_row_pointed_at_another_token_endpoint_sends_its_refresh_token_nowhere(
        bos_server, store, token_endpoint) -> None:
    """Whoever can write the table must not be able to receive the refresh token."""
    auth, _ = seeded_worker(bos_server, store, token_endpoint)
    token = auth.access_token()
    refreshes = bos_server.counters.refreshes
    seen: list[str] = []

    def attacker(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(500)

    with store.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {store.table_name} SET token_endpoint = 'https://attacker.example/t'"))
    auth._http = httpx.Client(mounts={"https://attacker.example": httpx.MockTransport(attacker)})
    with pytest.raises(BosReconnectRequired, match=r"attacker\.example"):
        auth.access_token(rejected=token)
    assert seen == []
    assert bos_server.counters.refreshes == refreshes
    assert store.load(KEY).token_endpoint == "https://attacker.example/t"  # nothing rewritten


def test_with_a_key_configured_a_plaintext_row_is_not_used(bos_server, tmp_path: Path, token_endpoint) -> None:
    url = f"sqlite:///{tmp_path / 'tokens.db'}"
    grant = bos_server.mint_grant()
    planted = SqlTokenStore(url)  # written without the key
    planted.seed(KEY, client_id=grant["client_id"], token_endpoint=token_endpoint, resource=bos_server.mcp_url,
                 scope=grant["scope"], refresh_token=grant["refresh_token"], access_token=grant["access_token"],
                 expires_at=time.time() + 3600)
    planted.dispose()
    keyed = SqlTokenStore(url, cipher=Fernet(Fernet.generate_key()))
    auth = OAuthGrantAuth(keyed, KEY, token_endpoint=token_endpoint, client_id=grant["client_id"],
                          resource=bos_server.mcp_url, seed_refresh_token=grant["refresh_token"])
    try:
        with pytest.raises(BosTokenStoreError, match="not encrypted"):
            auth.access_token()
    finally:
        keyed.dispose()

"""An OAuth Connection without a secret: the hook takes the grant from the token store row alone."""

from __future__ import annotations

import json

import pytest

from airflow_provider_bos.auth.token_store import SqlTokenStore
from airflow_provider_bos.exceptions import BosReconnectRequired
from airflow_provider_bos.hooks.bos import BosHook


@pytest.fixture()
def store_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'tokens.db'}"


def _connection_without_secret(monkeypatch, server, client_id: str, store_url: str) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_BOS_STORE_ONLY",
        json.dumps(
            {
                "conn_type": "bos",
                "host": server.mcp_url,
                "extra": {"auth_type": "oauth", "client_id": client_id, "token_store_url": store_url},
            }
        ),
    )


def test_a_connection_without_a_secret_reads_the_stored_grant(bos_server, store_url, monkeypatch) -> None:
    grant = bos_server.mint_grant()
    store = SqlTokenStore(store_url)
    store.seed(
        "bos_store_only",
        client_id=grant["client_id"],
        token_endpoint=f"{bos_server.base_url}/token",
        resource=bos_server.mcp_url,
        scope="mcp:tools offline_access",
        refresh_token=grant["refresh_token"],
        force=True,
    )
    _connection_without_secret(monkeypatch, bos_server, grant["client_id"], store_url)

    with BosHook("bos_store_only") as hook:
        contexts = hook.list_contexts()

    assert len(contexts) == 2
    row = store.load("bos_store_only")
    assert (
        row is not None and row.generation == 2
    )  # the hook refreshed the stored grant, nothing re-seeded it
    store.dispose()


def test_without_a_stored_grant_the_hook_asks_for_a_reconnect(bos_server, store_url, monkeypatch) -> None:
    _connection_without_secret(monkeypatch, bos_server, "some-client", store_url)

    with (
        BosHook("bos_store_only") as hook,
        pytest.raises(BosReconnectRequired, match="No OAuth grant is stored"),
    ):
        hook.list_contexts()

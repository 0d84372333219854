"""Using and rotating a grant against the reference server: refresh-ahead, 401 retry, rotation,
reuse of another worker's refresh, invalid_grant handling, API keys."""

from __future__ import annotations

import time

import httpx
import pytest
import sqlalchemy as sa

from airflow_provider_bos.auth.grants import ApiKeyAuth, OAuthGrantAuth, TokenSet
from airflow_provider_bos.auth.token_store import SqlTokenStore, StoredGrant
from airflow_provider_bos.exceptions import BosReconnectRequired
from airflow_provider_bos.redaction import add_secret_sink

KEY = "bos_default"
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
ACCEPT = {"Accept": "application/json, text/event-stream"}


def seed_minted(
    bos_server,
    store: SqlTokenStore,
    token_endpoint: str,
    *,
    access_token: str | None = None,
    expires_in: float | None = None,
) -> dict:
    grant = bos_server.mint_grant()
    store.seed(
        KEY,
        client_id=grant["client_id"],
        token_endpoint=token_endpoint,
        resource=bos_server.mcp_url,
        scope=grant["scope"],
        refresh_token=grant["refresh_token"],
        access_token=access_token or grant["access_token"],
        expires_at=time.time() + (grant["expires_in"] if expires_in is None else expires_in),
    )
    return grant


def age_stored_token(store: SqlTokenStore, seconds: float) -> None:
    """Pretend the stored access token was issued ``seconds`` earlier (a longer lifetime), so the
    configured refresh margin applies in full rather than the half-lifetime cap."""
    with store._engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {store.table_name} SET updated_at = updated_at - :s"), {"s": seconds})


def make_auth(bos_server, store, token_endpoint, grant: dict, **kwargs) -> OAuthGrantAuth:
    return OAuthGrantAuth(
        store,
        KEY,
        token_endpoint=token_endpoint,
        client_id=grant["client_id"],
        resource=bos_server.mcp_url,
        **kwargs,
    )


def initialize(bos_server, auth: httpx.Auth) -> httpx.Response:
    with httpx.Client(auth=auth, headers=ACCEPT) as client:
        return client.post(bos_server.mcp_url, json=INIT)


def test_a_fresh_token_is_used_without_refreshing(bos_server, store, token_endpoint) -> None:
    grant = seed_minted(bos_server, store, token_endpoint)
    auth = make_auth(bos_server, store, token_endpoint, grant)
    assert initialize(bos_server, auth).status_code == 200
    assert initialize(bos_server, auth).status_code == 200
    assert bos_server.counters.refreshes == 0 and store.load(KEY).generation == 1


def test_refresh_ahead_of_expiry_rotates_and_persists_first(bos_server, store, token_endpoint) -> None:
    grant = seed_minted(bos_server, store, token_endpoint, expires_in=30)  # inside the 60 s margin
    age_stored_token(store, 600)
    auth = make_auth(bos_server, store, token_endpoint, grant)
    assert initialize(bos_server, auth).status_code == 200
    row = store.load(KEY)
    assert bos_server.counters.refreshes == 1 and row.generation == 2
    assert row.refresh_token != grant["refresh_token"] and row.access_token != grant["access_token"]
    assert row.expires_at is not None and row.expires_at > time.time() + 3000
    assert auth.grant == row  # what the auth uses is exactly what was committed


def test_refresh_margin_is_capped_at_half_the_token_lifetime(bos_server, store, token_endpoint) -> None:
    # A 60 s margin on a 30 s token would refresh (and rotate) on every request.
    grant = seed_minted(bos_server, store, token_endpoint, expires_in=30)
    auth = make_auth(bos_server, store, token_endpoint, grant)
    for _ in range(3):
        assert initialize(bos_server, auth).status_code == 200
    assert bos_server.counters.refreshes == 0


def test_rotation_over_several_cycles_keeps_generations(bos_server, store, token_endpoint) -> None:
    grant = seed_minted(bos_server, store, token_endpoint)
    auth = make_auth(bos_server, store, token_endpoint, grant)
    refresh_tokens = {grant["refresh_token"]}
    for expected_generation in (2, 3, 4):
        token = auth.access_token()
        auth.access_token(rejected=token)  # as after a 401
        row = store.load(KEY)
        assert row.generation == expected_generation
        refresh_tokens.add(row.refresh_token)
    assert len(refresh_tokens) == 4
    assert bos_server.counters.refreshes == 3 and bos_server.counters.refresh_reuse_detected == 0
    assert initialize(bos_server, auth).status_code == 200


def test_a_401_refreshes_once_and_retries_once(bos_server, store, token_endpoint) -> None:
    grant = seed_minted(bos_server, store, token_endpoint, access_token="at-the-server-does-not-know")
    auth = make_auth(bos_server, store, token_endpoint, grant)
    response = initialize(bos_server, auth)
    assert response.status_code == 200
    assert [r.status_code for r in response.history] == [401]
    assert bos_server.counters.refreshes == 1 and store.load(KEY).generation == 2


def test_a_second_401_is_returned_not_looped(bos_server, store, token_endpoint) -> None:
    grant = seed_minted(bos_server, store, token_endpoint)
    auth = make_auth(bos_server, store, token_endpoint, grant)
    calls: list[str] = []

    def always_401(request: httpx.Request) -> httpx.Response:
        calls.append(request.headers["authorization"])
        return httpx.Response(401, headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})

    with httpx.Client(auth=auth, transport=httpx.MockTransport(always_401)) as client:
        assert client.post("https://bos.example/mcp", json=INIT).status_code == 401
    assert len(calls) == 2 and calls[0] != calls[1]
    assert bos_server.counters.refreshes == 1


def test_a_token_another_worker_refreshed_is_reused(bos_server, store, token_endpoint) -> None:
    grant = seed_minted(bos_server, store, token_endpoint, access_token="at-stale-everywhere")
    worker_a = make_auth(bos_server, store, token_endpoint, grant)
    worker_b = make_auth(bos_server, store, token_endpoint, grant)
    assert worker_b.access_token() == "at-stale-everywhere"  # b caches the row it read
    assert initialize(bos_server, worker_a).status_code == 200  # a: 401 -> refresh
    assert bos_server.counters.refreshes == 1
    response = initialize(bos_server, worker_b)  # b: 401 -> lock -> sees a's token -> no refresh
    assert response.status_code == 200 and len(response.history) == 1
    assert bos_server.counters.refreshes == 1 and store.load(KEY).generation == 2
    assert worker_b.grant.access_token == worker_a.grant.access_token


def test_refresh_ahead_reuses_another_workers_refresh(bos_server, store, token_endpoint) -> None:
    grant = seed_minted(bos_server, store, token_endpoint, expires_in=10)
    age_stored_token(store, 600)
    worker_a = make_auth(bos_server, store, token_endpoint, grant)
    worker_b = make_auth(bos_server, store, token_endpoint, grant, refresh_margin_s=0)
    worker_b.access_token()  # caches generation 1 (valid for b's zero margin)
    worker_a.access_token()  # a's 60 s margin: refreshes
    worker_b._margin = 60.0  # now b also wants to refresh ahead
    assert worker_b.access_token() == worker_a.grant.access_token
    assert bos_server.counters.refreshes == 1 and bos_server.counters.refresh_reuse_detected == 0


def test_revoked_grant_asks_for_reconnect(bos_server, store, token_endpoint) -> None:
    grant = seed_minted(bos_server, store, token_endpoint, access_token="at-unknown")
    bos_server.revoke_grant_of(grant["refresh_token"])
    auth = make_auth(bos_server, store, token_endpoint, grant)
    with pytest.raises(BosReconnectRequired) as caught:
        initialize(bos_server, auth)
    message = str(caught.value)
    assert "airflow-provider-bos connect --conn-id bos_default" in message and "invalid_grant" in message
    assert grant["refresh_token"] not in message
    assert store.load(KEY).generation == 1  # nothing was written


def test_invalid_grant_with_a_moved_generation_uses_the_moved_grant(
    bos_server, store, token_endpoint, monkeypatch
) -> None:
    """The row moved while our refresh call failed (e.g. the Connection was re-connected meanwhile)."""
    grant = seed_minted(bos_server, store, token_endpoint, access_token="at-unknown")
    bos_server.revoke_grant_of(grant["refresh_token"])
    auth = make_auth(bos_server, store, token_endpoint, grant)
    auth.access_token()  # load the (doomed) row
    real_load = store.load

    def load_after_reconnect(key: str) -> StoredGrant | None:
        fresh = bos_server.mint_grant()  # the user re-connected while our refresh was failing
        store.seed(
            KEY,
            client_id=fresh["client_id"],
            token_endpoint=token_endpoint,
            resource=bos_server.mcp_url,
            scope=fresh["scope"],
            refresh_token=fresh["refresh_token"],
            access_token=fresh["access_token"],
            expires_at=time.time() + fresh["expires_in"],
        )
        monkeypatch.setattr(store, "load", real_load)
        return real_load(key)

    monkeypatch.setattr(store, "load", load_after_reconnect)
    response = initialize(bos_server, auth)
    assert response.status_code == 200
    assert auth.grant.generation == 2 and store.load(KEY).generation == 2
    assert bos_server.counters.refreshes == 0  # the moved grant's access token was used as is


def test_invalid_grant_without_movement_is_final(bos_server, store, token_endpoint) -> None:
    grant = seed_minted(bos_server, store, token_endpoint)
    bos_server.revoke_grant_of(grant["refresh_token"])
    auth = make_auth(bos_server, store, token_endpoint, grant)
    with pytest.raises(BosReconnectRequired):
        auth.access_token(rejected=auth.access_token())


def test_seeding_from_the_connection_and_reseeding_after_reconnect(bos_server, store, token_endpoint) -> None:
    first = bos_server.mint_grant()
    auth = make_auth(bos_server, store, token_endpoint, first, seed_refresh_token=first["refresh_token"])
    assert initialize(bos_server, auth).status_code == 200  # seeded (no access token) -> refresh
    assert store.load(KEY).generation == 2 and bos_server.counters.refreshes == 1
    # A new process with the same Connection does not re-seed the rotated row.
    again = make_auth(bos_server, store, token_endpoint, first, seed_refresh_token=first["refresh_token"])
    assert initialize(bos_server, again).status_code == 200 and store.load(KEY).generation == 2
    # The Connection was re-connected: its new refresh token re-seeds the row.
    second = bos_server.mint_grant()
    reconnected = make_auth(
        bos_server, store, token_endpoint, second, seed_refresh_token=second["refresh_token"]
    )
    assert initialize(bos_server, reconnected).status_code == 200
    row = store.load(KEY)
    assert row.generation == 4 and bos_server.counters.refresh_reuse_detected == 0


def test_no_grant_anywhere_asks_for_reconnect(bos_server, store, token_endpoint) -> None:
    auth = OAuthGrantAuth(
        store, "missing", token_endpoint=token_endpoint, client_id="c", resource=bos_server.mcp_url
    )
    with pytest.raises(BosReconnectRequired, match="connect --conn-id missing"):
        auth.access_token()


def test_every_token_is_registered_as_a_secret(bos_server, store, token_endpoint) -> None:
    seen: list[str] = []
    add_secret_sink(seen.append)
    grant = seed_minted(bos_server, store, token_endpoint, expires_in=0)
    auth = make_auth(bos_server, store, token_endpoint, grant)
    auth.access_token()
    row = store.load(KEY)
    assert {grant["refresh_token"], row.refresh_token, row.access_token} <= set(seen)


def test_reprs_hide_tokens(bos_server, store, token_endpoint) -> None:
    grant = seed_minted(bos_server, store, token_endpoint)
    auth = make_auth(bos_server, store, token_endpoint, grant)
    auth.access_token()
    for text in (repr(auth), repr(auth.grant), str(auth.grant)):
        assert grant["refresh_token"] not in text and grant["access_token"] not in text
    tokens = TokenSet(access_token="at-secret-x", refresh_token="rt-secret-y", expires_at=None, scope="s")
    assert "secret" not in repr(tokens)


def test_api_key_auth(bos_server) -> None:
    key = bos_server.create_api_key()
    auth = ApiKeyAuth(key)
    assert key not in repr(auth)
    assert initialize(bos_server, auth).status_code == 200
    assert initialize(bos_server, ApiKeyAuth("bos_key_wrong_value")).status_code == 401

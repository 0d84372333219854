"""A sealed token decrypts only in the row it was written for: a writer of the shared token-store
table cannot move a Connection's tokens to a host of their choosing.

The attacks run end to end against two reference servers, the victim's BOS and the attacker's
"BOS", sharing one encrypted token store as two deployments (or two Connections) would; every
request the attacker's side makes is recorded, and no victim token may be in any of them.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet

from airflow_provider_bos.auth.discovery import discover
from airflow_provider_bos.auth.grants import OAuthGrantAuth
from airflow_provider_bos.auth.sealed import LegacyTokenError
from airflow_provider_bos.auth.token_store import ResealReport, SqlTokenStore
from airflow_provider_bos.exceptions import BosReconnectRequired, BosTokenBindingError, BosTokenStoreError
from airflow_provider_bos.mcp import McpSession

VICTIM = "bos_victim"
ATTACKER = "bos_attacker"


@pytest.fixture()
def cipher() -> Fernet:
    return Fernet(Fernet.generate_key())


@pytest.fixture()
def shared_store(tmp_path: Path, cipher: Fernet):
    store = SqlTokenStore(f"sqlite:///{tmp_path / 'shared.db'}", cipher=cipher)
    yield store
    store.dispose()


class Wire:
    """An httpx client that records every request it sends (headers and body)."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.client = httpx.Client(event_hooks={"request": [self._record]}, timeout=10.0)

    def _record(self, request: httpx.Request) -> None:
        body = request.read().decode("utf-8", "replace")
        self.sent.append(f"{request.method} {request.url}\n{request.headers}\n{body}")

    def carries(self, *secrets: str) -> bool:
        return any(secret in text for text in self.sent for secret in secrets)


def connected(bos_server: Any, store: SqlTokenStore, key: str) -> tuple[OAuthGrantAuth, dict[str, Any]]:
    """A Connection ``key`` signed in to ``bos_server``, its grant sealed in ``store``."""
    grant = bos_server.mint_grant()
    endpoint = discover(bos_server.mcp_url).token_endpoint
    store.seed(key, client_id=grant["client_id"], token_endpoint=endpoint, resource=bos_server.mcp_url,
               scope=grant["scope"], refresh_token=grant["refresh_token"], access_token=grant["access_token"],
               expires_at=time.time() + 3600)
    auth = OAuthGrantAuth(store, key, token_endpoint=endpoint, client_id=grant["client_id"],
                          resource=bos_server.mcp_url)
    return auth, grant


def copy_tokens(store: SqlTokenStore, source: str, target: str) -> None:
    """What a table writer does: the victim row's token ciphertexts into another row."""
    with store.engine.begin() as conn:
        row = conn.execute(sa.text(f"SELECT access_token, refresh_token FROM {store.table_name} WHERE key = :k"),
                           {"k": source}).one()
        conn.execute(sa.text(f"UPDATE {store.table_name} SET access_token = :a, refresh_token = :r WHERE key = :k"),
                     {"a": row.access_token, "r": row.refresh_token, "k": target})


def point_row_at(store: SqlTokenStore, key: str, source: str) -> None:
    """What a table writer does: row ``key``'s plaintext target columns made those of row ``source``."""
    with store.engine.begin() as conn:
        row = conn.execute(sa.text(f"SELECT client_id, resource, token_endpoint FROM {store.table_name} "
                                   "WHERE key = :k"), {"k": source}).one()
        conn.execute(sa.text(f"UPDATE {store.table_name} SET client_id = :c, resource = :r, token_endpoint = :t "
                             "WHERE key = :k"), {"c": row.client_id, "r": row.resource, "t": row.token_endpoint,
                                                 "k": key})


def attack_by_copying_into_own_row(store: SqlTokenStore, attacker_server: Any) -> str:
    """The attacker's own Connection, whose row now holds the victim's ciphertexts."""
    connected(attacker_server, store, ATTACKER)
    copy_tokens(store, VICTIM, ATTACKER)
    return ATTACKER


def attack_by_repointing_the_victims_row(store: SqlTokenStore, attacker_server: Any) -> str:
    """A second deployment sharing the table, with a Connection of the victim's id pointed at the
    attacker's host: the victim row's plaintext columns rewritten to match it."""
    connected(attacker_server, store, ATTACKER)
    point_row_at(store, VICTIM, ATTACKER)
    return VICTIM


@pytest.mark.parametrize("attack", [attack_by_copying_into_own_row, attack_by_repointing_the_victims_row])
def test_a_victims_tokens_moved_to_a_row_pointed_at_another_server_are_never_sent_there(
        bos_server_factory: Callable[..., Any], shared_store: SqlTokenStore,
        attack: Callable[[SqlTokenStore, Any], str]) -> None:
    victim_server = bos_server_factory(scenario="complete")
    attacker_server = bos_server_factory(scenario="complete")
    victim_auth, victim_grant = connected(victim_server, shared_store, VICTIM)
    victim_auth.access_token()  # the victim's grant is in use
    row_key = attack(shared_store, attacker_server)
    attacker_row = shared_store.raw_row(ATTACKER)
    endpoint = discover(attacker_server.mcp_url).token_endpoint
    wire = Wire()
    attacker_auth = OAuthGrantAuth(shared_store, row_key, token_endpoint=endpoint,
                                   client_id=attacker_row["client_id"], resource=attacker_server.mcp_url,
                                   http_client=wire.client)
    with McpSession(attacker_server.mcp_url, auth=attacker_auth, http_client=wire.client,
                    era="2025-11-25") as session, pytest.raises(BosTokenBindingError) as caught:
        session.connect()
    with pytest.raises(BosTokenBindingError):
        attacker_auth.access_token(rejected="anything")  # a forced refresh: nothing goes to the token endpoint
    secrets = (victim_grant["access_token"], victim_grant["refresh_token"])
    assert not wire.carries(*secrets)
    assert attacker_server.counters.refreshes == 0
    message = str(caught.value)
    assert "sealed for another row" in message and "Reconnect with: airflow-provider-bos connect" in message
    assert not any(secret in message for secret in secrets)
    assert isinstance(caught.value, BosReconnectRequired) and isinstance(caught.value, BosTokenStoreError)
    wire.client.close()


def test_the_rightful_connection_still_reads_and_refreshes_its_sealed_row(bos_server: Any,
                                                                         shared_store: SqlTokenStore) -> None:
    auth, grant = connected(bos_server, shared_store, VICTIM)
    assert auth.access_token() == grant["access_token"]
    refreshed = auth.access_token(rejected=grant["access_token"])
    assert refreshed != grant["access_token"] and bos_server.counters.refreshes == 1
    row = shared_store.raw_row(VICTIM)
    assert row["access_token"].startswith("enc:v2:") and row["refresh_token"].startswith("enc:v2:")
    assert refreshed not in str(row)
    assert OAuthGrantAuth(shared_store, VICTIM, token_endpoint=auth._token_endpoint, client_id=grant["client_id"],
                          resource=bos_server.mcp_url).access_token() == refreshed


def test_access_and_refresh_token_cannot_swap_columns(bos_server: Any, shared_store: SqlTokenStore) -> None:
    auth, _ = connected(bos_server, shared_store, VICTIM)
    with shared_store.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {shared_store.table_name} SET access_token = refresh_token, "
                             "refresh_token = access_token"))
    with pytest.raises(BosTokenBindingError, match="its column differs"):
        auth.access_token()


def test_a_changed_token_endpoint_gets_no_refresh_token(bos_server: Any, shared_store: SqlTokenStore) -> None:
    """The resource's metadata now names another token endpoint: the refresh token stays home."""
    _, grant = connected(bos_server, shared_store, VICTIM)
    moved = OAuthGrantAuth(shared_store, VICTIM, token_endpoint="https://elsewhere.example/token",
                           client_id=grant["client_id"], resource=bos_server.mcp_url)
    with pytest.raises(BosReconnectRequired, match=r"elsewhere\.example"):
        moved.access_token(rejected=grant["access_token"])
    assert bos_server.counters.refreshes == 0


# --- rows written in the earlier, unbound format ----------------------------------------------------


def legacy_row(store: SqlTokenStore, cipher: Fernet, bos_server: Any, key: str) -> dict[str, Any]:
    """A row as the earlier release wrote it: each token encrypted alone (``enc:v1:``)."""
    _, grant = connected(bos_server, store, key)

    def v1(token: str) -> str:
        return "enc:v1:" + base64.urlsafe_b64encode(cipher.encrypt(token.encode())).decode()

    with store.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {store.table_name} SET access_token = :a, refresh_token = :r WHERE key = :k"),
                     {"a": v1(grant["access_token"]), "r": v1(grant["refresh_token"]), "k": key})
    return grant


def test_a_legacy_row_is_refused_until_an_admin_reseals_it(
        bos_server: Any, shared_store: SqlTokenStore, cipher: Fernet) -> None:
    grant = legacy_row(shared_store, cipher, bos_server, VICTIM)
    auth = OAuthGrantAuth(shared_store, VICTIM, token_endpoint=discover(bos_server.mcp_url).token_endpoint,
                          client_id=grant["client_id"], resource=bos_server.mcp_url)
    with pytest.raises(LegacyTokenError, match="airflow-provider-bos token-store reseal") as caught:
        auth.access_token()
    assert bos_server.counters.refreshes == 0
    assert grant["refresh_token"] not in str(caught.value) and grant["access_token"] not in str(caught.value)
    report = shared_store.reseal_legacy()
    assert [key for key, _resource, _endpoint in report.resealed] == [VICTIM] and report.refused == ()
    row = shared_store.raw_row(VICTIM)
    assert row["access_token"].startswith("enc:v2:") and row["refresh_token"].startswith("enc:v2:")
    assert auth.access_token() == grant["access_token"] and bos_server.counters.refreshes == 0  # re-sealed, not spent
    assert shared_store.reseal_legacy() == ResealReport((), ())  # nothing left to do


def test_a_legacy_ciphertext_moved_into_another_row_is_never_sent_anywhere(
        bos_server_factory: Callable[..., Any], shared_store: SqlTokenStore, cipher: Fernet) -> None:
    """A writer without the key moves (not copies) a victim's v1 tokens into a row of their own,
    pointed at their own server: the ciphertext is in one row only, so no copy check can see it."""
    victim_server = bos_server_factory(scenario="complete")
    attacker_server = bos_server_factory(scenario="complete")
    victim_grant = legacy_row(shared_store, cipher, victim_server, VICTIM)
    connected(attacker_server, shared_store, ATTACKER)
    copy_tokens(shared_store, VICTIM, ATTACKER)
    with shared_store.engine.begin() as conn:  # the move: the victim's row no longer holds them
        conn.execute(sa.text(f"UPDATE {shared_store.table_name} SET access_token = NULL, refresh_token = NULL "
                             "WHERE key = :k"), {"k": VICTIM})
    attacker_row = shared_store.raw_row(ATTACKER)
    wire = Wire()
    attacker_auth = OAuthGrantAuth(shared_store, ATTACKER,
                                   token_endpoint=discover(attacker_server.mcp_url).token_endpoint,
                                   client_id=attacker_row["client_id"], resource=attacker_server.mcp_url,
                                   http_client=wire.client)
    with pytest.raises(LegacyTokenError, match="token-store reseal"):
        attacker_auth.access_token()
    with pytest.raises(LegacyTokenError):
        attacker_auth.access_token(rejected="anything")  # a forced refresh: nothing goes to the token endpoint
    assert not wire.carries(victim_grant["access_token"], victim_grant["refresh_token"])
    assert attacker_server.counters.refreshes == 0
    wire.client.close()


def test_a_legacy_ciphertext_found_in_two_rows_is_resealed_in_neither(
        bos_server_factory: Callable[..., Any], shared_store: SqlTokenStore, cipher: Fernet) -> None:
    victim_server = bos_server_factory(scenario="complete")
    attacker_server = bos_server_factory(scenario="complete")
    victim_grant = legacy_row(shared_store, cipher, victim_server, VICTIM)
    connected(attacker_server, shared_store, ATTACKER)
    copy_tokens(shared_store, VICTIM, ATTACKER)
    before = {key: shared_store.raw_row(key) for key in (VICTIM, ATTACKER)}
    report = shared_store.reseal_legacy()
    assert report.resealed == () and sorted(key for key, _why in report.refused) == [ATTACKER, VICTIM]
    assert all("another row" in why for _key, why in report.refused)
    assert {key: shared_store.raw_row(key) for key in (VICTIM, ATTACKER)} == before  # left as they were
    for key, server, client_id in ((VICTIM, victim_server, victim_grant["client_id"]),
                                   (ATTACKER, attacker_server, before[ATTACKER]["client_id"])):
        auth = OAuthGrantAuth(shared_store, key, token_endpoint=discover(server.mcp_url).token_endpoint,
                              client_id=client_id, resource=server.mcp_url)
        with pytest.raises(LegacyTokenError):
            auth.access_token()
    assert victim_server.counters.refreshes == attacker_server.counters.refreshes == 0


def test_a_reconnect_replaces_a_row_that_fails_its_check(bos_server: Any, shared_store: SqlTokenStore) -> None:
    auth, grant = connected(bos_server, shared_store, VICTIM)
    connected(bos_server, shared_store, ATTACKER)
    copy_tokens(shared_store, ATTACKER, VICTIM)
    with pytest.raises(BosTokenBindingError):
        auth.access_token()
    fresh = bos_server.mint_grant(client_id=grant["client_id"])
    shared_store.seed(VICTIM, client_id=grant["client_id"], token_endpoint=auth._token_endpoint,
                      resource=bos_server.mcp_url, scope=fresh["scope"], refresh_token=fresh["refresh_token"],
                      access_token=fresh["access_token"], expires_at=time.time() + 3600, force=True)
    assert OAuthGrantAuth(shared_store, VICTIM, token_endpoint=auth._token_endpoint, client_id=grant["client_id"],
                          resource=bos_server.mcp_url).access_token() == fresh["access_token"]

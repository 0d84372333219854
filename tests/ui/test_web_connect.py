"""The web connect flow against the reference server, without a browser or an API server.

The authorization URL is followed with httpx (the reference server consents automatically), the
callback URL is handed to :func:`finish_web_connect` as the API server's route would.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx
import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet

from airflow_provider_bos.auth.token_store import SqlTokenStore
from airflow_provider_bos.exceptions import BosCallbackError, BosConfigurationError
from airflow_provider_bos.plugins.csrf import CSRF_TTL_S, csrf_token, csrf_valid, same_origin
from airflow_provider_bos.plugins.pending import ConnectTarget, PendingConnectStore
from airflow_provider_bos.plugins.web_connect import begin_web_connect, check_redirect_uri, finish_web_connect

REDIRECT = "http://127.0.0.1:8080/bos/callback"


@pytest.fixture()
def pending(tmp_path: Path) -> PendingConnectStore:
    return PendingConnectStore(
        sa.create_engine(f"sqlite:///{tmp_path / 'meta.db'}"), cipher=Fernet(Fernet.generate_key())
    )


@pytest.fixture()
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tokens.db'}"


def _sign_in(authorization_url: str) -> str:
    """What the browser does: follow the sign-in until it is sent to our redirect URI."""
    url = authorization_url
    with httpx.Client() as browser:
        for _ in range(10):
            response = browser.get(url, follow_redirects=False)
            assert response.is_redirect, response.text
            url = urljoin(url, response.headers["location"])
            if url.startswith(REDIRECT):
                return url
    raise AssertionError("no redirect to the callback")


def _begin(server, pending, user="alice") -> str:
    with httpx.Client() as client:
        return begin_web_connect(
            ConnectTarget("bos_web", server.mcp_url),
            redirect_uri=REDIRECT,
            user_id=user,
            pending=pending,
            http_client=client,
        )


def _finish(callback: str, pending, store_url: str, user="alice", **kwargs):
    with httpx.Client() as client:
        return finish_web_connect(
            callback,
            user_id=user,
            pending=pending,
            open_token_store=lambda _target: SqlTokenStore(store_url),
            http_client=client,
            **kwargs,
        )


def test_the_authorization_request_is_pkce_s256_with_state_and_resource(bos_server, pending) -> None:
    query = parse_qs(urlsplit(_begin(bos_server, pending)).query)
    assert query["code_challenge_method"] == ["S256"] and len(query["code_challenge"][0]) == 43
    assert query["redirect_uri"] == [REDIRECT] and query["resource"] == [bos_server.mcp_url]
    assert len(query["state"][0]) >= 43 and "offline_access" in query["scope"][0]


def test_a_finished_sign_in_seeds_the_token_store(bos_server, pending, store_url) -> None:
    callback = _sign_in(_begin(bos_server, pending))

    target, outcome, grant = _finish(callback, pending, store_url)

    assert target.conn_id == "bos_web" and outcome.info.resource == bos_server.mcp_url
    row = SqlTokenStore(store_url).load("bos_web")
    assert row is not None and row.refresh_token == outcome.tokens.refresh_token
    assert (row.generation, row.client_id) == (1, outcome.client_id) == (grant.generation, grant.client_id)


def test_a_callback_is_single_use(bos_server, pending, store_url) -> None:
    callback = _sign_in(_begin(bos_server, pending))
    _finish(callback, pending, store_url)

    with pytest.raises(BosCallbackError, match="already used") as excinfo:
        _finish(callback, pending, store_url)
    assert excinfo.value.rule == "pending-unknown"


def test_an_expired_pending_sign_in_is_refused_before_the_code_is_spent(
    bos_server, pending, store_url
) -> None:
    pending.ttl_s = 0.0
    callback = _sign_in(_begin(bos_server, pending))

    with pytest.raises(BosCallbackError, match="expired"):
        _finish(callback, pending, store_url)
    assert SqlTokenStore(store_url).load("bos_web") is None


def test_a_forged_state_or_issuer_is_refused_and_nothing_is_stored(bos_server, pending, store_url) -> None:
    callback = _sign_in(_begin(bos_server, pending))
    with pytest.raises(BosCallbackError, match="no pending sign-in"):
        _finish(callback.replace("state=", "state=x"), pending, store_url)
    forged_issuer = callback.replace("iss=", "iss=https%3A%2F%2Fevil.example")
    with pytest.raises(BosCallbackError) as excinfo:
        _finish(forged_issuer, pending, store_url)
    assert excinfo.value.rule == "callback-issuer-mismatch"
    assert SqlTokenStore(store_url).load("bos_web") is None


def test_another_user_cannot_finish_my_sign_in(bos_server, pending, store_url) -> None:
    callback = _sign_in(_begin(bos_server, pending, user="alice"))
    with pytest.raises(BosCallbackError, match="another Airflow user"):
        _finish(callback, pending, store_url, user="mallory")
    assert SqlTokenStore(store_url).load("bos_web") is None


def test_another_user_holding_the_state_cannot_burn_my_sign_in(bos_server, pending, store_url) -> None:
    callback = _sign_in(_begin(bos_server, pending, user="alice"))
    with pytest.raises(BosCallbackError, match="another Airflow user"):
        _finish(callback, pending, store_url, user="mallory")

    target, _outcome, grant = _finish(callback, pending, store_url, user="alice")
    assert target.conn_id == "bos_web" and grant.generation == 1


def test_the_verifier_is_encrypted_at_rest(bos_server, pending, tmp_path) -> None:
    authorization_url = _begin(bos_server, pending)
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'meta.db'}")
    with engine.connect() as conn:
        [row] = conn.execute(sa.text("SELECT * FROM bos_ui_pending_connect")).mappings().all()
    state = parse_qs(urlsplit(authorization_url).query)["state"][0]
    assert row["verifier"].startswith("enc:v1:") and state not in str(dict(row))


@pytest.mark.parametrize("uri", ["http://airflow.example/bos/callback", "ftp://127.0.0.1/bos/callback"])
def test_the_callback_must_be_https_or_loopback(uri) -> None:
    with pytest.raises(BosConfigurationError):
        check_redirect_uri(uri)
    check_redirect_uri("https://airflow.example/bos/callback")
    check_redirect_uri("http://localhost:8080/bos/callback")


KEY = b"server-side-secret"


def test_csrf_tokens_are_bound_to_the_user_a_server_secret_and_an_expiry() -> None:
    token = csrf_token("alice", key=KEY, now=1000.0)
    assert csrf_valid("alice", token, key=KEY, now=1000.0 + 3600)
    # Another user, another server secret, a forged expiry, an old token: refused.
    assert not csrf_valid("mallory", token, key=KEY, now=1000.0)
    assert not csrf_valid("alice", token, key=b"another-deployment", now=1000.0)
    expires, mac = token.split(".")[1:]
    assert not csrf_valid("alice", f"v2.{int(expires) + 10**6}.{mac}", key=KEY, now=1000.0)
    assert not csrf_valid("alice", token, key=KEY, now=1000.0 + CSRF_TTL_S + 1)
    for bad in (None, "", "v2", "v2.x.y", "v1.1.2", token + "x"):
        assert not csrf_valid("alice", bad, key=KEY, now=1000.0)


def test_the_same_user_gets_a_working_token_whatever_session_they_hold() -> None:
    # No session cookie at all (simple_auth_manager_all_admins) or a re-issued JWT: the identity is the same.
    assert csrf_valid("admin", csrf_token("admin", key=KEY, now=5.0), key=KEY, now=6.0)


def test_same_origin() -> None:
    assert same_origin("http://127.0.0.1:8080", "http://127.0.0.1:8080")
    assert not same_origin("null", "http://127.0.0.1:8080")
    assert not same_origin("https://evil.example", "http://127.0.0.1:8080")


def test_the_page_without_a_metadata_database_says_so(monkeypatch) -> None:
    """Pending sign-ins live in Airflow's metadata database: a process without one gets a clear error."""
    from airflow import settings

    from airflow_provider_bos.plugins import app

    monkeypatch.setattr(settings, "engine", None)
    with pytest.raises(BosConfigurationError, match="metadata database"):
        app._pending_store()

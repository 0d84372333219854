"""The first sign-in over real loopback HTTP against the reference server (auto-consent)."""

from __future__ import annotations

import json
import time
from urllib.parse import urljoin

import httpx
import pytest

from airflow_provider_bos.auth import connect as c
from airflow_provider_bos.auth.connect import (
    exchange_code,
    prepare_authorization,
    register_client,
    run_connect_flow,
    validate_callback,
)
from airflow_provider_bos.auth.discovery import AuthServerInfo, discover
from airflow_provider_bos.auth.grants import BosTokenEndpointError
from airflow_provider_bos.exceptions import BosAuthError, BosCallbackError

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


def browser_follow(url: str, redirect_prefix: str) -> str:
    """A 'browser' that follows redirects until the one aimed at our redirect URI, and returns it."""
    with httpx.Client() as browser:
        for _ in range(10):
            response = browser.get(url)
            assert response.is_redirect, response.text
            url = urljoin(url, response.headers["location"])
            if url.startswith(redirect_prefix):
                return url
    raise AssertionError("no redirect to the callback")


def _initialize_status(mcp_url: str, access_token: str) -> int:
    response = httpx.post(
        mcp_url,
        json=INIT,
        headers={"Authorization": f"Bearer {access_token}", "Accept": "application/json, text/event-stream"},
    )
    return response.status_code


def test_full_connect_with_the_loopback_listener(bos_server) -> None:
    presented: list[str] = []

    def browser(authorization_url: str) -> None:
        presented.append(authorization_url)
        # The browser follows the redirect all the way to the loopback listener.
        assert httpx.get(authorization_url, follow_redirects=True).status_code == 200

    started = time.time()
    outcome = run_connect_flow(bos_server.mcp_url, present=browser, timeout_s=30)
    assert outcome.registered and outcome.client_id
    assert outcome.redirect_uri.startswith("http://127.0.0.1:") and outcome.redirect_uri.endswith("/callback")
    assert outcome.info.issuer == bos_server.issuer
    tokens = outcome.tokens
    assert tokens.refresh_token and tokens.access_token
    assert tokens.scope.split() == ["mcp:tools", "offline_access"]
    assert tokens.expires_at is not None and tokens.expires_at >= started + 3000
    assert tokens.access_token not in repr(tokens) and tokens.refresh_token not in repr(tokens)
    assert len(presented) == 1 and "resource=" in presented[0]
    assert _initialize_status(bos_server.mcp_url, tokens.access_token) == 200


def test_paste_mode_with_a_given_client_id(bos_server) -> None:
    redirect = "https://app.example/bos/callback"
    client_id = bos_server.register_client([redirect])
    captured: list[str] = []
    outcome = run_connect_flow(
        bos_server.mcp_url,
        client_id=client_id,
        redirect_uri=redirect,
        present=lambda url: captured.append(browser_follow(url, redirect)),
        read_pasted_callback=lambda: "  " + captured[0] + "\n",
    )
    assert not outcome.registered and outcome.client_id == client_id and outcome.redirect_uri == redirect
    assert _initialize_status(bos_server.mcp_url, outcome.tokens.access_token) == 200


def _pending_and_callback(bos_server, **prepare) -> tuple[AuthServerInfo, c.PendingAuthorization, str]:
    redirect = "https://app.example/cb"
    info = discover(bos_server.mcp_url)
    with httpx.Client() as client:
        client_id = register_client(info, redirect, http_client=client)
    pending = prepare_authorization(info, client_id=client_id, redirect_uri=redirect, **prepare)
    return info, pending, browser_follow(pending.authorization_url, redirect)


def test_server_callback_carries_state_and_issuer(bos_server) -> None:
    info, pending, callback = _pending_and_callback(bos_server)
    code = validate_callback(pending, callback)
    with httpx.Client() as client:
        tokens = exchange_code(info, pending, code, http_client=client)
    assert tokens.refresh_token


def test_a_code_is_single_use_and_errors_name_only_the_oauth_code(bos_server) -> None:
    info, pending, callback = _pending_and_callback(bos_server)
    code = validate_callback(pending, callback)
    with httpx.Client() as client:
        exchange_code(info, pending, code, http_client=client)
        with pytest.raises(BosTokenEndpointError) as caught:
            exchange_code(info, pending, code, http_client=client)
    assert caught.value.oauth_error == "invalid_grant" and caught.value.status_code == 400
    assert code not in str(caught.value) and pending.verifier not in str(caught.value)


def test_the_verifier_is_checked(bos_server) -> None:
    info, pending, callback = _pending_and_callback(bos_server)
    code = validate_callback(pending, callback)
    other = prepare_authorization(info, client_id=pending.client_id, redirect_uri=pending.redirect_uri)
    forged = c.PendingAuthorization(**{**pending.__dict__, "verifier": other.verifier})
    with httpx.Client() as client, pytest.raises(BosTokenEndpointError) as caught:
        exchange_code(info, forged, code, http_client=client)
    assert caught.value.oauth_error == "invalid_grant"


def test_a_wrong_resource_comes_back_as_an_authorization_error(bos_server) -> None:
    _, pending, callback = _pending_and_callback(bos_server, resource="https://bos.example/elsewhere")
    with pytest.raises(BosCallbackError) as caught:
        validate_callback(pending, callback)
    assert caught.value.rule == c.RULE_AUTHORIZATION_ERROR and "invalid_target" in str(caught.value)


def test_registration_refusal_reports_the_oauth_error() -> None:
    info = AuthServerInfo(
        resource="https://b/mcp",
        resource_metadata_url="https://b/prm",
        issuer="https://b",
        authorization_endpoint="https://b/authorize",
        token_endpoint="https://b/token",
        registration_endpoint="https://b/register",
    )
    transport = httpx.MockTransport(
        lambda request: httpx.Response(
            400, json={"error": "invalid_redirect_uri", "error_description": "loopback only"}
        )
    )
    with httpx.Client(transport=transport) as client, pytest.raises(BosAuthError) as caught:
        register_client(info, "https://x/cb", http_client=client)
    assert "invalid_redirect_uri" in str(caught.value) and "loopback only" in str(caught.value)


def test_registration_sends_a_public_client_document() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json={"client_id": "new-client"})

    info = AuthServerInfo(
        resource="https://b/mcp",
        resource_metadata_url="https://b/prm",
        issuer="https://b",
        authorization_endpoint="https://b/authorize",
        token_endpoint="https://b/token",
        registration_endpoint="https://b/register",
    )
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        assert register_client(info, "http://127.0.0.1:1/cb", http_client=client) == "new-client"
    body = json.loads(seen[0].content)
    assert body["redirect_uris"] == ["http://127.0.0.1:1/cb"]
    assert body["token_endpoint_auth_method"] == "none"
    assert body["grant_types"] == ["authorization_code", "refresh_token"] and body["response_types"] == [
        "code"
    ]

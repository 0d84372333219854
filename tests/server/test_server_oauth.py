"""OAuth side of the reference server, over real loopback HTTP with plain httpx."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from airflow_provider_bos.testing import BosReferenceServer
from airflow_provider_bos.testing.scenario import FaultSpec, load_scenario

REDIRECT = "http://127.0.0.1:53682/callback"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "1"}}}
ACCEPT = {"Accept": "application/json, text/event-stream"}


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    return verifier, challenge


def discover(http: httpx.Client, mcp_url: str) -> dict:
    """401 -> protected-resource metadata -> AS metadata, as the contract's client example does."""
    challenge = http.post(mcp_url, json=INIT, headers=ACCEPT)
    assert challenge.status_code == 401
    metadata_url = re.search(r'resource_metadata="([^"]+)"', challenge.headers["www-authenticate"]).group(1)
    resource = http.get(metadata_url).json()
    issuer = resource["authorization_servers"][0]
    return http.get(issuer + "/.well-known/oauth-authorization-server").json()


def register(http: httpx.Client, as_meta: dict, redirect: str = REDIRECT) -> str:
    response = http.post(as_meta["registration_endpoint"], json={
        "client_name": "test client", "redirect_uris": [redirect], "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"]})
    assert response.status_code == 201, response.text
    return response.json()["client_id"]


def authorize(http: httpx.Client, as_meta: dict, client_id: str, challenge: str, *, state: str = "st-1",
              redirect: str = REDIRECT, **extra: str) -> httpx.Response:
    params = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect,
              "scope": "mcp:tools offline_access", "state": state, "code_challenge": challenge,
              "code_challenge_method": "S256", **extra}
    return http.get(as_meta["authorization_endpoint"] + "?" + urlencode(params), follow_redirects=False)


def callback_params(response: httpx.Response) -> dict[str, list[str]]:
    assert response.status_code == 302, response.text
    return parse_qs(urlsplit(response.headers["location"]).query)


def connect(server: BosReferenceServer, http: httpx.Client, *, resource: bool = True) -> dict:
    """The whole browserless flow; returns the token response plus client_id."""
    as_meta = discover(http, server.mcp_url)
    client_id = register(http, as_meta)
    verifier, challenge = pkce()
    extra = {"resource": server.mcp_url} if resource else {}
    query = callback_params(authorize(http, as_meta, client_id, challenge, **extra))
    assert query["state"] == ["st-1"] and query["iss"] == [server.issuer]
    form = {"grant_type": "authorization_code", "client_id": client_id, "redirect_uri": REDIRECT,
            "code": query["code"][0], "code_verifier": verifier, **extra}
    response = http.post(as_meta["token_endpoint"], data=form)
    assert response.status_code == 200, response.text
    return {**response.json(), "client_id": client_id, "token_endpoint": as_meta["token_endpoint"]}


def refresh(http: httpx.Client, tokens: dict, refresh_token: str, **extra: str) -> httpx.Response:
    return http.post(tokens["token_endpoint"], data={"grant_type": "refresh_token", "client_id": tokens["client_id"],
                                                     "refresh_token": refresh_token, **extra})


def mcp_status(http: httpx.Client, server: BosReferenceServer, token: str) -> int:
    return http.post(server.mcp_url, json=INIT, headers={**ACCEPT, "Authorization": f"Bearer {token}"}).status_code


@pytest.fixture()
def http():
    with httpx.Client(timeout=10) as client:
        yield client


# -- discovery --------------------------------------------------------------------------------------

def test_unauthenticated_request_gets_bare_challenge(bos_server, http):
    response = http.post(bos_server.mcp_url, json=INIT, headers=ACCEPT)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == (
        f'Bearer resource_metadata="{bos_server.base_url}/.well-known/oauth-protected-resource/mcp/apps/bos/platform"')
    assert bos_server.counters.unauthorized == 1


def test_bad_token_challenge_says_invalid_token(bos_server, http):
    response = http.post(bos_server.mcp_url, json=INIT, headers={**ACCEPT, "Authorization": "Bearer nope"})
    assert response.status_code == 401
    challenge = response.headers["www-authenticate"]
    assert 'error="invalid_token"' in challenge and "resource_metadata=" in challenge


def test_protected_resource_metadata(bos_server, http):
    url = f"{bos_server.base_url}/.well-known/oauth-protected-resource/mcp/apps/bos/platform"
    meta = http.get(url).json()
    assert meta["resource"] == bos_server.mcp_url
    assert meta["authorization_servers"] == [bos_server.issuer]
    assert {"mcp:tools", "offline_access"} <= set(meta["scopes_supported"])
    assert meta["resource_documentation"].startswith(bos_server.base_url)


def test_authorization_server_metadata(bos_server, http):
    meta = http.get(bos_server.issuer + "/.well-known/oauth-authorization-server").json()
    assert meta["issuer"] == bos_server.base_url and not meta["issuer"].endswith("/")
    for key in ("authorization_endpoint", "token_endpoint", "registration_endpoint"):
        assert meta[key].startswith(bos_server.base_url + "/")
    assert meta["response_types_supported"] == ["code"]
    assert {"authorization_code", "refresh_token"} <= set(meta["grant_types_supported"])
    assert meta["code_challenge_methods_supported"] == ["S256"]
    assert meta["token_endpoint_auth_methods_supported"] == ["none"]
    assert meta["authorization_response_iss_parameter_supported"] is True
    assert {"mcp:tools", "offline_access"} <= set(meta["scopes_supported"])
    assert meta["service_documentation"].startswith(bos_server.base_url)


# -- registration and authorization ------------------------------------------------------------------

def test_registration_is_public_only_and_needs_redirect_uris(bos_server, http):
    as_meta = discover(http, bos_server.mcp_url)
    ok = http.post(as_meta["registration_endpoint"], json={"redirect_uris": [REDIRECT]})
    assert ok.status_code == 201
    assert ok.json()["token_endpoint_auth_method"] == "none" and "client_secret" not in ok.json()
    assert http.post(as_meta["registration_endpoint"], json={"client_name": "x"}).status_code == 400
    confidential = http.post(as_meta["registration_endpoint"],
                             json={"redirect_uris": [REDIRECT], "token_endpoint_auth_method": "client_secret_post"})
    assert confidential.status_code == 400


@pytest.mark.parametrize("resource", [True, False])
def test_full_flow_issues_working_tokens(bos_server, http, resource):
    tokens = connect(bos_server, http, resource=resource)
    assert tokens["token_type"] == "Bearer" and tokens["refresh_token"] and tokens["expires_in"] > 0
    assert mcp_status(http, bos_server, tokens["access_token"]) == 200


def test_authorize_rejects_untrusted_client_or_redirect_without_redirecting(bos_server, http):
    as_meta = discover(http, bos_server.mcp_url)
    client_id = register(http, as_meta)
    _, challenge = pkce()
    assert authorize(http, as_meta, "unknown-client", challenge).status_code == 400
    assert authorize(http, as_meta, client_id, challenge, redirect="http://127.0.0.1:1/evil").status_code == 400


@pytest.mark.parametrize(("extra", "error"), [
    ({"state": ""}, "invalid_request"),
    ({"code_challenge_method": "plain"}, "invalid_request"),
    ({"response_type": "token"}, "unsupported_response_type"),
    ({"scope": "admin"}, "invalid_scope"),
    ({"resource": "http://127.0.0.1:1/mcp/apps/bos/platform"}, "invalid_target"),
])
def test_authorize_errors_redirect_to_a_trusted_callback(bos_server, http, extra, error):
    as_meta = discover(http, bos_server.mcp_url)
    client_id = register(http, as_meta)
    _, challenge = pkce()
    params = {"state": "st-1", **extra}
    response = authorize(http, as_meta, client_id, challenge, **params)
    query = callback_params(response)
    assert query["error"] == [error]
    assert "code" not in query


# -- token endpoint ---------------------------------------------------------------------------------

@pytest.fixture()
def pending(bos_server, http):
    """A fresh authorization code plus what the client knows about it."""
    as_meta = discover(http, bos_server.mcp_url)
    client_id = register(http, as_meta)
    verifier, challenge = pkce()
    code = callback_params(authorize(http, as_meta, client_id, challenge))["code"][0]
    return {"token_endpoint": as_meta["token_endpoint"], "client_id": client_id, "code": code, "verifier": verifier,
            "form": {"grant_type": "authorization_code", "client_id": client_id, "redirect_uri": REDIRECT,
                     "code": code, "code_verifier": verifier}}


@pytest.mark.parametrize(("change", "error"), [
    ({"code_verifier": "x" * 43}, "invalid_grant"),
    ({"redirect_uri": "http://127.0.0.1:53682/other"}, "invalid_request"),
    ({"resource": "https://elsewhere.example/mcp"}, "invalid_target"),
])
def test_code_exchange_rejections(http, pending, change, error):
    response = http.post(pending["token_endpoint"], data={**pending["form"], **change})
    assert response.status_code == 400
    assert response.json()["error"] == error


def test_code_is_single_use_and_bound_to_its_client(bos_server, http, pending):
    other_client = bos_server.register_client([REDIRECT])
    stolen = http.post(pending["token_endpoint"], data={**pending["form"], "client_id": other_client})
    assert stolen.json()["error"] == "invalid_grant"
    first = http.post(pending["token_endpoint"], data=pending["form"])
    assert first.status_code == 200
    again = http.post(pending["token_endpoint"], data=pending["form"])
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant"
    # a replayed code revokes what it produced
    assert mcp_status(http, bos_server, first.json()["access_token"]) == 401


def test_refresh_rotates_every_time(bos_server, http):
    tokens = connect(bos_server, http)
    seen = {tokens["refresh_token"]}
    current = tokens["refresh_token"]
    for _ in range(3):
        response = refresh(http, tokens, current)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["refresh_token"] not in seen
        seen.add(body["refresh_token"])
        current = body["refresh_token"]
        assert mcp_status(http, bos_server, body["access_token"]) == 200
    assert bos_server.counters.refreshes == 3
    assert bos_server.counters.refresh_reuse_detected == 0


def test_reusing_a_rotated_refresh_token_revokes_the_grant(bos_server, http):
    tokens = connect(bos_server, http)
    old = tokens["refresh_token"]
    newer = refresh(http, tokens, old).json()
    reuse = refresh(http, tokens, old)
    assert reuse.status_code == 400 and reuse.json()["error"] == "invalid_grant"
    assert bos_server.counters.refresh_reuse_detected == 1
    assert bos_server.counters.grants_revoked == 1
    # the whole grant is gone: the newest refresh token and every access token
    assert refresh(http, tokens, newer["refresh_token"]).json()["error"] == "invalid_grant"
    assert mcp_status(http, bos_server, newer["access_token"]) == 401
    assert mcp_status(http, bos_server, tokens["access_token"]) == 401


def test_refresh_checks_client_and_resource(bos_server, http):
    tokens = connect(bos_server, http)
    other_client = bos_server.register_client([REDIRECT])
    wrong_client = http.post(tokens["token_endpoint"], data={
        "grant_type": "refresh_token", "client_id": other_client, "refresh_token": tokens["refresh_token"]})
    assert wrong_client.json()["error"] == "invalid_grant"
    wrong_resource = refresh(http, tokens, tokens["refresh_token"], resource="https://elsewhere.example/mcp")
    assert wrong_resource.json()["error"] == "invalid_target"
    right = refresh(http, tokens, tokens["refresh_token"], resource=bos_server.mcp_url)
    assert right.status_code == 200
    assert bos_server.counters.refresh_reuse_detected == 0


def test_access_token_lifetime_is_configurable(bos_server, http):
    bos_server.set_access_token_ttl(0)
    grant = bos_server.mint_grant()
    assert grant["expires_in"] == 0
    response = http.post(bos_server.mcp_url, json=INIT,
                         headers={**ACCEPT, "Authorization": f"Bearer {grant['access_token']}"})
    assert response.status_code == 401
    assert 'error="invalid_token"' in response.headers["www-authenticate"]
    bos_server.set_access_token_ttl(3600)
    assert mcp_status(http, bos_server, bos_server.mint_grant()["access_token"]) == 200


def test_token_stops_working_after_n_requests_fault(bos_server_factory, http):
    scenario = load_scenario("complete")
    scenario.faults = FaultSpec(expire_access_token_after_requests=2)
    server = bos_server_factory(scenario=scenario)
    grant = server.mint_grant()
    assert [mcp_status(http, server, grant["access_token"]) for _ in range(3)] == [200, 200, 401]
    fresh = http.post(server.base_url + "/token", data={"grant_type": "refresh_token", "client_id": grant["client_id"],
                                                        "refresh_token": grant["refresh_token"]}).json()
    assert mcp_status(http, server, fresh["access_token"]) == 200


def test_api_key_gives_mcp_access_without_refresh(bos_server, http):
    key = bos_server.create_api_key()
    assert mcp_status(http, bos_server, key) == 200
    refused = http.post(bos_server.base_url + "/token",
                        data={"grant_type": "refresh_token", "client_id": "x", "refresh_token": key})
    assert refused.status_code in (400, 401)


def test_revoke_grant_of_kills_the_grant(bos_server, http):
    grant = bos_server.mint_grant()
    bos_server.revoke_grant_of(grant["refresh_token"])
    assert mcp_status(http, bos_server, grant["access_token"]) == 401
    assert bos_server.counters.grants_revoked == 1

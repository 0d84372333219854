"""Every credential goes over https, or plain http only to a loopback address or ``localhost``.

The same rule for the OAuth bearer, the refresh token's token endpoint and the API key: a request
that would carry one to a plain-http host elsewhere is refused before anything is sent, with a
typed error that names the URL and says what to do (never the credential).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from airflow_provider_bos.auth.grants import ApiKeyAuth, OAuthGrantAuth, request_token
from airflow_provider_bos.auth.token_store import SqlTokenStore
from airflow_provider_bos.auth.urls import credential_url_problem, is_loopback_host
from airflow_provider_bos.exceptions import BosConfigurationError

KEY = "bos_key_0123456789abcdef"


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST", "127.0.0.1", "127.8.9.10", "::1", "[::1]"])
def test_loopback_hosts_are_literal_loopback_addresses_and_localhost(host: str) -> None:
    assert is_loopback_host(host)


@pytest.mark.parametrize("host", [
    "bos.localhost",  # RFC 6761 says it should resolve to loopback, but resolvers need not: nothing checks it
    "evil.localhost", "localhost.evil.example", "localhost.", "10.0.0.1", "0.0.0.0", "::", "bos.example",
])
def test_other_names_are_not_loopback(host: str) -> None:
    assert not is_loopback_host(host)


@pytest.mark.parametrize("url", [
    "https://bos.example/mcp", "http://127.0.0.1:8765/mcp", "http://localhost/mcp", "http://[::1]:9/x",
])
def test_https_or_loopback_urls_may_carry_a_credential(url: str) -> None:
    assert credential_url_problem(url) is None


@pytest.mark.parametrize("url", [
    "http://bos.example/mcp", "http://bos.localhost:8765/mcp", "http://10.1.2.3/mcp", "ftp://bos.example/",
    "not a url",
])
def test_plain_http_elsewhere_may_not(url: str) -> None:
    assert credential_url_problem(url) is not None


class Recorder:
    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200, json={"ok": True})


def test_an_api_key_is_never_sent_over_plain_http_to_another_host() -> None:
    seen = Recorder()
    with httpx.Client(transport=httpx.MockTransport(seen), auth=ApiKeyAuth(KEY)) as client:
        with pytest.raises(BosConfigurationError, match=r"http://bos\.example/mcp.*https") as caught:
            client.post("http://bos.example/mcp", json={})
        assert client.post("http://127.0.0.1:8765/mcp", json={}).status_code == 200
        assert client.post("https://bos.example/mcp", json={}).status_code == 200
    assert KEY not in str(caught.value)
    assert [str(r.url) for r in seen.requests] == ["http://127.0.0.1:8765/mcp", "https://bos.example/mcp"]
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in seen.requests)


def test_an_oauth_bearer_is_never_sent_over_plain_http_to_another_host(tmp_path: Any) -> None:
    store = SqlTokenStore(f"sqlite:///{tmp_path / 'grants.db'}")
    store.seed("c", client_id="client-1", token_endpoint="https://bos.example/token",
               resource="http://bos.example/mcp", scope="s", refresh_token="rt_0123456789",
               access_token="at_0123456789", expires_at=None)
    auth = OAuthGrantAuth(store, "c", token_endpoint="https://bos.example/token", client_id="client-1",
                          resource="http://bos.example/mcp")
    seen = Recorder()
    with httpx.Client(transport=httpx.MockTransport(seen), auth=auth) as client, pytest.raises(
            BosConfigurationError, match="plain http"):
        client.post("http://bos.example/mcp", json={})
    assert seen.requests == []
    store.dispose()


def test_a_refresh_token_is_never_posted_over_plain_http_to_another_host() -> None:
    seen = Recorder()
    with httpx.Client(transport=httpx.MockTransport(seen)) as client, pytest.raises(
            BosConfigurationError, match="token endpoint"):
        request_token(client, "http://auth.example/token", {"grant_type": "refresh_token", "refresh_token": "rt_1x"})
    assert seen.requests == []


def _connection(host: str, auth_type: str) -> Any:
    return SimpleNamespace(conn_id="bos_x", host=host, schema="", port=None, password=KEY,
                           extra_dejson={"auth_type": auth_type, "client_id": "c1"})


def test_an_api_key_connection_to_a_plain_http_host_is_refused_when_read() -> None:
    from airflow_provider_bos.hooks.bos import BosConnectionConfig

    with pytest.raises(BosConfigurationError, match=r"Connection 'bos_x'.*https") as caught:
        BosConnectionConfig.from_connection(_connection("http://bos.example/mcp", "api_key"))
    assert KEY not in str(caught.value)
    local = BosConnectionConfig.from_connection(_connection("http://127.0.0.1:8765/mcp", "api_key"))
    assert local.resource_url == "http://127.0.0.1:8765/mcp"
    assert BosConnectionConfig.from_connection(_connection("bos.example/mcp", "api_key")).resource_url == (
        "https://bos.example/mcp")

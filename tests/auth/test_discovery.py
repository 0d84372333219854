"""Discovery: the contract's example chain over real loopback HTTP, and every check rejected alone."""

from __future__ import annotations

import json

import httpx
import pytest
from authfakes import ORIGIN, PRM_URL, RESOURCE, FakeBos

from airflow_provider_bos.auth import discovery as d
from airflow_provider_bos.auth.discovery import discover
from airflow_provider_bos.exceptions import BosDiscoveryError


def test_discovers_the_reference_server(bos_server) -> None:
    info = discover(bos_server.mcp_url)
    assert info.resource == bos_server.mcp_url
    assert info.issuer == bos_server.issuer
    for endpoint in (info.authorization_endpoint, info.token_endpoint, info.registration_endpoint):
        assert endpoint and endpoint.startswith(bos_server.issuer + "/")
    assert "mcp:tools" in info.scopes_supported


def test_fake_chain_is_valid_and_initialize_is_unauthenticated() -> None:
    fake = FakeBos()
    with fake.client() as client:
        info = discover(RESOURCE, http_client=client)
    assert info.issuer == ORIGIN and info.token_endpoint == f"{ORIGIN}/token"
    post = fake.requests[0]
    assert post.method == "POST" and "authorization" not in post.headers
    body = json.loads(post.content)
    assert body["method"] == "initialize" and body["params"]["protocolVersion"] == "2025-11-25"


def _rejects(fake: FakeBos, rule: str, resource: str = RESOURCE) -> BosDiscoveryError:
    with fake.client() as client, pytest.raises(BosDiscoveryError) as caught:
        discover(resource, http_client=client)
    assert caught.value.rule == rule, str(caught.value)
    assert caught.value.url  # every failure names the URL that failed
    return caught.value


# --- the URL rule, on each URL discovery trusts ----------------------------------------------


@pytest.mark.parametrize(
    ("bad_url", "rule"),
    [
        ("http://bos.example/mcp/apps/bos/platform", d.RULE_HTTPS_REQUIRED),
        ("https://user:pw@bos.example/mcp/apps/bos/platform", d.RULE_USERINFO),
        ("https://bos.example/mcp/apps/bos/platform#frag", d.RULE_FRAGMENT),
        ("bos.example/mcp", d.RULE_INVALID_URL),
    ],
)
def test_resource_url_rule(bad_url: str, rule: str) -> None:
    error = _rejects(FakeBos(), rule, resource=bad_url)
    assert "pw" not in str(error)  # userinfo is never echoed


@pytest.mark.parametrize(
    ("bad_url", "rule"),
    [
        ("http://bos.example/.well-known/oauth-protected-resource", d.RULE_HTTPS_REQUIRED),
        ("https://u:secret@bos.example/.well-known/oauth-protected-resource", d.RULE_USERINFO),
        ("https://bos.example/.well-known/oauth-protected-resource#x", d.RULE_FRAGMENT),
        ("https://evil.example/.well-known/oauth-protected-resource", d.RULE_METADATA_ORIGIN),
        ("https://bos.example:8443/.well-known/oauth-protected-resource", d.RULE_METADATA_ORIGIN),
        ("/.well-known/oauth-protected-resource", d.RULE_INVALID_URL),
    ],
)
def test_resource_metadata_url_rules(bad_url: str, rule: str) -> None:
    error = _rejects(FakeBos(challenge_header=f'Bearer resource_metadata="{bad_url}"'), rule)
    assert "secret" not in str(error)


def test_plain_http_is_accepted_for_loopback_only() -> None:
    local = "http://127.0.0.5:8080"
    fake = FakeBos(
        challenge_header=f'Bearer resource_metadata="{local}/prm"',
        protected={"resource": f"{local}/mcp", "authorization_servers": [local]},
    )
    fake.as_metadata.update(
        issuer=local,
        authorization_endpoint=f"{local}/authorize",
        token_endpoint=f"{local}/token",
        registration_endpoint=f"{local}/register",
    )

    def handler(request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        if request.method == "POST":
            return httpx.Response(401, headers={"WWW-Authenticate": fake.challenge_header})
        if url == f"{local}/prm":
            return httpx.Response(200, json=fake.protected)
        return httpx.Response(200, json=fake.as_metadata)

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        assert discover(f"{local}/mcp", http_client=client).issuer == local


def test_challenge_must_be_401() -> None:
    _rejects(FakeBos(challenge_status=200), d.RULE_CHALLENGE_STATUS)


def test_challenge_must_carry_resource_metadata() -> None:
    _rejects(FakeBos(challenge_header='Bearer realm="bos"'), d.RULE_CHALLENGE_HEADER)
    _rejects(FakeBos(challenge_header=None), d.RULE_CHALLENGE_HEADER)


def test_resource_must_equal_the_mcp_url() -> None:
    fake = FakeBos()
    fake.protected["resource"] = f"{ORIGIN}/mcp/apps/bos/other"
    _rejects(fake, d.RULE_RESOURCE_MISMATCH)


def test_authorization_servers_must_be_listed() -> None:
    fake = FakeBos()
    fake.protected["authorization_servers"] = []
    _rejects(fake, d.RULE_NO_AUTHORIZATION_SERVER)


@pytest.mark.parametrize(
    ("issuer", "rule"),
    [
        ("https://login.evil.example", d.RULE_ISSUER_ORIGIN),
        ("https://bos.example/tenant", d.RULE_ISSUER_PATH),
        ("http://bos.example", d.RULE_HTTPS_REQUIRED),
        ("https://bos.example/#x", d.RULE_FRAGMENT),
    ],
)
def test_issuer_rules(issuer: str, rule: str) -> None:
    fake = FakeBos()
    fake.protected["authorization_servers"] = [issuer]
    _rejects(fake, rule)


def test_issuer_with_trailing_slash_is_the_same_issuer() -> None:
    fake = FakeBos()
    fake.protected["authorization_servers"] = [ORIGIN + "/"]
    with fake.client() as client:
        assert discover(RESOURCE, http_client=client).issuer == ORIGIN


def test_as_metadata_issuer_must_match_exactly() -> None:
    fake = FakeBos()
    fake.as_metadata["issuer"] = ORIGIN + "/"
    _rejects(fake, d.RULE_ISSUER_MISMATCH)


@pytest.mark.parametrize("key", ["registration_endpoint", "authorization_endpoint", "token_endpoint"])
def test_endpoints_must_be_on_the_trusted_origin(key: str) -> None:
    fake = FakeBos()
    fake.as_metadata[key] = "https://evil.example/steal"
    _rejects(fake, d.RULE_ENDPOINT_ORIGIN)


@pytest.mark.parametrize("key", ["authorization_endpoint", "token_endpoint"])
def test_endpoints_must_be_present(key: str) -> None:
    fake = FakeBos()
    del fake.as_metadata[key]
    _rejects(fake, d.RULE_ENDPOINT_MISSING)


def test_endpoint_url_rules_apply() -> None:
    fake = FakeBos()
    fake.as_metadata["token_endpoint"] = "http://bos.example/token"
    _rejects(fake, d.RULE_HTTPS_REQUIRED)


@pytest.mark.parametrize("methods", [["plain"], [], None])
def test_s256_is_required(methods) -> None:
    fake = FakeBos()
    if methods is None:
        del fake.as_metadata["code_challenge_methods_supported"]
    else:
        fake.as_metadata["code_challenge_methods_supported"] = methods
    _rejects(fake, d.RULE_S256_UNAVAILABLE)


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(503, text="<html>Service Unavailable from proxy</html>"),
        httpx.Response(200, text="<html>login page</html>", headers={"content-type": "text/html"}),
        httpx.Response(200, json=["not", "an", "object"]),
    ],
)
def test_metadata_must_be_a_2xx_json_object(response: httpx.Response) -> None:
    error = _rejects(FakeBos(overrides={PRM_URL: response}), d.RULE_METADATA_HTTP)
    if response.status_code == 503:
        assert "503" in str(error)
    # The endpoint is not a verified BOS resource yet: nothing it answered is repeated.
    assert "Service Unavailable" not in str(error) and "login page" not in str(error)


def test_as_metadata_http_failure() -> None:
    url = f"{ORIGIN}/.well-known/oauth-authorization-server"
    error = _rejects(FakeBos(overrides={url: httpx.Response(404, text="nope")}), d.RULE_METADATA_HTTP)
    assert error.url == url


def test_every_rule_has_a_distinct_name() -> None:
    names = [value for name, value in vars(d).items() if name.startswith("RULE_")]
    assert len(names) == len(set(names)) == len(d.ALL_RULES)


@pytest.mark.parametrize("url", [PRM_URL, f"{ORIGIN}/.well-known/oauth-authorization-server"])
def test_deeply_nested_metadata_is_a_discovery_error(url: str) -> None:
    fake = FakeBos()
    fake.overrides[url] = httpx.Response(200, content=b"[" * 200_000 + b"]" * 200_000)
    _rejects(fake, d.RULE_METADATA_HTTP)


def test_metadata_is_read_with_a_size_bound() -> None:
    from airflow_provider_bos.auth.bounded import MAX_JSON_BYTES

    produced: list[int] = []

    class Endless(httpx.SyncByteStream):
        def __iter__(self):
            for _ in range(4096):  # 64 MiB if read to the end
                produced.append(1)
                yield b" " * 16384

    fake = FakeBos()
    fake.overrides[PRM_URL] = httpx.Response(200, stream=Endless())
    assert "larger than" in str(_rejects(fake, d.RULE_METADATA_HTTP))
    assert len(produced) * 16384 <= MAX_JSON_BYTES + 16384


INTERNAL = "https://bos.example/internal/admin?secret-looking=1"


def test_a_redirect_target_is_never_echoed() -> None:
    moved = httpx.Response(302, headers={"Location": INTERNAL})
    error = _rejects(FakeBos(overrides={RESOURCE: moved}), d.RULE_CHALLENGE_STATUS)
    assert "302" in str(error) and "redirect" in str(error)
    assert "internal" not in str(error) and "secret-looking" not in str(error)
    metadata_moved = _rejects(FakeBos(overrides={PRM_URL: moved}), d.RULE_METADATA_HTTP)
    assert "internal" not in str(metadata_moved)


def test_a_trailing_slash_redirect_still_says_what_to_fix() -> None:
    moved = httpx.Response(307, headers={"Location": RESOURCE})
    with FakeBos(overrides={RESOURCE + "/": moved}).client() as client, pytest.raises(BosDiscoveryError) as caught:
        discover(RESOURCE + "/", http_client=client)
    assert "got 307 (a redirect to" in str(caught.value) and "trailing slash" in str(caught.value)


def test_metadata_values_from_another_origin_are_not_echoed() -> None:
    fake = FakeBos()
    fake.protected["resource"] = "https://intranet.example/payroll-export"
    error = _rejects(fake, d.RULE_RESOURCE_MISMATCH)
    assert "intranet" not in str(error) and "payroll" not in str(error)
    other = FakeBos()
    other.as_metadata["issuer"] = "https://intranet.example/payroll-export"
    assert "payroll" not in str(_rejects(other, d.RULE_ISSUER_MISMATCH))

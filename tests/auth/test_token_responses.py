"""What the client sends to and accepts from the token endpoint, with a scripted endpoint:
``resource`` in every grant request, storable values only, bounded and depth-safe JSON."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs

import httpx
import pytest
import sqlalchemy as sa

from airflow_provider_bos.auth.connect import PendingAuthorization, exchange_code
from airflow_provider_bos.auth.discovery import AuthServerInfo
from airflow_provider_bos.auth.grants import OAuthGrantAuth, request_token
from airflow_provider_bos.auth.token_store import SqlTokenStore
from airflow_provider_bos.exceptions import BosError

KEY = "bos_default"
ORIGIN = "https://bos.example"
RESOURCE = f"{ORIGIN}/mcp/apps/bos/platform"
TOKEN_URL = f"{ORIGIN}/token"
MAX_JSON_BYTES = 1024 * 1024  # the documented bound on a token response
MAX_EXPIRES_IN_S = 366 * 24 * 3600  # the documented cap on a token lifetime


class TokenEndpoint:
    """Answers every POST with ``body`` and records the forms it received."""

    def __init__(self, body: bytes | Iterator[bytes], status: int = 200) -> None:
        self.body, self.status = body, status
        self.forms: list[dict[str, list[str]]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.forms.append(parse_qs(request.content.decode()))
        if isinstance(self.body, bytes):
            return httpx.Response(self.status, content=self.body, headers={"content-type": "application/json"})
        return httpx.Response(self.status, stream=_Stream(self.body))

    def client(self) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(self.handler))


class _Stream(httpx.SyncByteStream):
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks


def rotated(expires_in: str = "3600") -> bytes:
    suffix = uuid.uuid4().hex
    return (
        f'{{"access_token": "at-{suffix}", "refresh_token": "rt-{suffix}", "token_type": "Bearer", '
        f'"expires_in": {expires_in}}}'
    ).encode()


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres),
            pytest.param("mysql", marks=pytest.mark.mysql)]
)
def store(request: pytest.FixtureRequest, tmp_path: Path):
    url = (f"sqlite:///{tmp_path / 'tokens.db'}" if request.param == "sqlite"
           else request.getfixturevalue(f"{request.param}_url"))
    store = SqlTokenStore(url, table=f"grants_{uuid.uuid4().hex[:10]}")
    store.seed(KEY, client_id="cid", token_endpoint=TOKEN_URL, resource=RESOURCE, scope="mcp:tools offline_access",
               refresh_token="rt-the-seed-0001")
    yield store
    with store.engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE IF EXISTS {store.table_name}"))
    store.dispose()


def refresh_with(store: SqlTokenStore, endpoint: TokenEndpoint) -> OAuthGrantAuth:
    auth = OAuthGrantAuth(store, KEY, token_endpoint=TOKEN_URL, client_id="cid", resource=RESOURCE,
                          http_client=endpoint.client())
    auth.access_token()
    return auth


def test_the_refresh_sends_the_resource(store) -> None:
    endpoint = TokenEndpoint(rotated())
    refresh_with(store, endpoint)
    assert endpoint.forms[0]["grant_type"] == ["refresh_token"]
    assert endpoint.forms[0]["resource"] == [RESOURCE]


def test_the_code_exchange_sends_the_resource() -> None:
    endpoint = TokenEndpoint(rotated())
    info = AuthServerInfo(resource=RESOURCE, resource_metadata_url=f"{ORIGIN}/prm", issuer=ORIGIN,
                          authorization_endpoint=f"{ORIGIN}/authorize", token_endpoint=TOKEN_URL,
                          registration_endpoint=None)
    pending = PendingAuthorization(client_id="cid", redirect_uri="http://127.0.0.1:5/callback",
                                   verifier="v" * 43, state="s" * 20, issuer=ORIGIN, resource=RESOURCE,
                                   authorization_url=f"{ORIGIN}/authorize?x")
    exchange_code(info, pending, "bos_code_0001", http_client=endpoint.client())
    assert endpoint.forms[0]["grant_type"] == ["authorization_code"]
    assert endpoint.forms[0]["resource"] == [RESOURCE]


@pytest.mark.parametrize(
    ("expires_in", "lifetime"),
    [("NaN", 300.0), ("Infinity", 300.0), ("-Infinity", 300.0), ("-5", 0.0), ("1e400", 300.0),
     ("1" + "0" * 30, MAX_EXPIRES_IN_S), ("3.5e12", MAX_EXPIRES_IN_S), ('"soon"', 300.0), ("true", 300.0)],
)
def test_an_unusable_expires_in_never_breaks_storing_the_rotated_grant(store, expires_in, lifetime) -> None:
    """The old refresh token is spent once the server answered: the new one must be committed."""
    endpoint = TokenEndpoint(rotated(expires_in))
    started = time.time()
    auth = refresh_with(store, endpoint)
    row = store.load(KEY)
    assert row.generation == 2 and row.refresh_token == auth.grant.refresh_token != "rt-the-seed-0001"
    assert row.expires_at is not None and math.isfinite(row.expires_at)
    assert started + lifetime - 5 <= row.expires_at <= time.time() + lifetime + 5


@pytest.mark.parametrize("field", ["access_token", "refresh_token"])
@pytest.mark.parametrize("value", ['"\\ud800"', '"has space"', '"caf\\u00e9"', '"' + "x" * 20000 + '"', "42"])
def test_a_token_that_cannot_be_stored_is_refused_before_writing(field: str, value: str) -> None:
    body = rotated().decode().replace(f'"{field}": "', f'"{field}": {value}, "_was": "')
    with pytest.raises(BosError, match=field):
        request_token(TokenEndpoint(body.encode()).client(), TOKEN_URL, {"grant_type": "refresh_token"})


@pytest.mark.parametrize("status", [200, 400])
def test_deeply_nested_json_from_the_token_endpoint_is_a_bos_error(status: int) -> None:
    endpoint = TokenEndpoint(b"[" * 200_000 + b"]" * 200_000, status=status)
    with pytest.raises(BosError):
        request_token(endpoint.client(), TOKEN_URL, {"grant_type": "refresh_token"})


def test_the_token_response_is_read_with_a_size_bound() -> None:
    sent: list[int] = []

    def endless() -> Iterator[bytes]:
        for _ in range(4096):  # 64 MiB if read to the end
            sent.append(1)
            yield b" " * 16384

    with pytest.raises(BosError, match="larger than"):
        request_token(TokenEndpoint(endless()).client(), TOKEN_URL, {"grant_type": "refresh_token"})
    assert len(sent) * 16384 <= MAX_JSON_BYTES + 16384

"""Using a grant: bearer injection, refresh ahead of expiry, and rotation-safe refresh.

:class:`OAuthGrantAuth` is an ``httpx.Auth``. Before each request it makes sure it holds an access
token that does not expire within ``refresh_margin_s``; on a 401 it refreshes once and retries the
request once. Every refresh runs under the token store's row lock (see
:mod:`airflow_provider_bos.auth.token_store`): the row is re-read after the lock is taken, a token
another worker just refreshed is reused, and otherwise the refresh call is made and the rotated
refresh token committed before the new access token is used. ``invalid_grant`` re-reads the row:
if its generation moved (someone else refreshed, or the Connection was re-connected) that grant is
used, otherwise :class:`~airflow_provider_bos.exceptions.BosReconnectRequired` tells the user to
run the connect command again.

Trust boundaries: a stored row is used only for the Connection's current resource, client and
token endpoint (the one the caller discovered for that resource), checked on every read; an
encrypted row's tokens are sealed to those columns and its key (:mod:`.sealed`), so a table writer
cannot move them to a row that points elsewhere.

Rows of the earlier unbound format (``enc:v1:``) are refused by the store (a table writer could have
moved them); the admin command ``airflow-provider-bos token-store reseal`` re-seals them.
A Connection password that cannot be a token (``***``, empty) or whose seed the row has already
consumed never replaces the stored grant.
Everything in a token response is validated and normalised before the row is written, so the
write that follows a rotation cannot fail on what the server sent.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import httpx

from airflow_provider_bos.auth.bounded import BodyTooLarge, parse_json, send_bounded
from airflow_provider_bos.auth.token_store import (
    SqlTokenStore,
    StoredGrant,
    refresh_token_fingerprint,
    token_problem,
)
from airflow_provider_bos.auth.urls import require_credential_url
from airflow_provider_bos.exceptions import (
    BosAuthError,
    BosConfigurationError,
    BosReconnectRequired,
    BosTransportError,
    excerpt,
)
from airflow_provider_bos.redaction import register_secret

logger = logging.getLogger(__name__)

__all__ = [
    "TokenSet",
    "BosTokenEndpointError",
    "request_token",
    "OAuthGrantAuth",
    "ApiKeyAuth",
    "check_api_key",
    "DEFAULT_SCOPES",
]

DEFAULT_SCOPES = "mcp:tools offline_access"
# Longest access-token lifetime believed; a longer expires_in is cut to this.
MAX_EXPIRES_IN_S = 366 * 24 * 3600.0
# Lifetime assumed when expires_in is present but not a usable number (NaN, Infinity, text):
# short, so the token is refreshed soon rather than trusted forever.
UNUSABLE_EXPIRES_IN_S = 300.0
_MAX_SCOPE_CHARS = 1000


def _lifetime(expires_in: Any) -> float | None:
    """``expires_in`` as seconds in ``[0, MAX_EXPIRES_IN_S]``; None when the server gave none.

    Never raises: by the time a refresh answer arrives the old refresh token is spent, so a
    lifetime that cannot be used must not stop the new grant from being stored.
    """
    if expires_in is None:
        return None
    seconds: float | None = None
    if isinstance(expires_in, int | float) and not isinstance(expires_in, bool):
        try:
            seconds = float(expires_in)
        except OverflowError:  # an integer beyond float range: absurd, capped below
            seconds = MAX_EXPIRES_IN_S + 1
    elif isinstance(expires_in, str) and expires_in.strip().isdigit():
        seconds = float(expires_in.strip()[:12])
    if seconds is None or not math.isfinite(seconds):
        logger.warning(
            "The token response's expires_in %s is not a finite number; assuming %g s.",
            excerpt(repr(expires_in), 40),
            UNUSABLE_EXPIRES_IN_S,
        )
        return UNUSABLE_EXPIRES_IN_S
    if seconds < 0:
        logger.warning("The token response's expires_in is negative; treating the token as expired.")
        return 0.0
    if seconds > MAX_EXPIRES_IN_S:
        logger.warning(
            "The token response's expires_in is over a year; capping it at %g s.", MAX_EXPIRES_IN_S
        )
        return MAX_EXPIRES_IN_S
    return seconds


class BosTokenEndpointError(BosAuthError):
    """The token endpoint refused a request; ``oauth_error`` is the RFC 6749 error code."""

    def __init__(self, message: str, *, oauth_error: str | None, status_code: int | None, url: str) -> None:
        self.oauth_error = oauth_error
        self.status_code = status_code
        self.url = url
        super().__init__(message)


@dataclass(frozen=True)
class TokenSet:
    """A token response with an absolute expiry. The repr never shows a token."""

    access_token: str
    refresh_token: str | None
    expires_at: float | None  # epoch seconds; None when the server gave no expires_in
    scope: str
    token_type: str = "Bearer"  # noqa: S105 - a token type, not a secret

    def __repr__(self) -> str:
        return (
            f"TokenSet(access_token=***, refresh_token={'***' if self.refresh_token else None}, "
            f"expires_at={self.expires_at!r}, scope={self.scope!r}, token_type={self.token_type!r})"
        )

    __str__ = __repr__

    @classmethod
    def from_response(cls, payload: Mapping[str, Any], *, now: float, default_scope: str = "") -> TokenSet:
        """Validate and normalise a token response: every value in the result can be stored."""
        access_token = payload.get("access_token")
        problem = token_problem(access_token)
        if problem is not None:
            raise BosAuthError(f"The token response's access_token is {problem}.")
        assert isinstance(access_token, str)  # token_problem() accepts strings only
        register_secret(access_token)
        refresh_token = payload.get("refresh_token")
        if refresh_token is not None:
            problem = token_problem(refresh_token)
            if problem is not None:
                raise BosAuthError(f"The token response's refresh_token is {problem}.")
            register_secret(refresh_token)
        token_type = payload.get("token_type") or "Bearer"
        if not isinstance(token_type, str) or token_type.lower() != "bearer":
            raise BosAuthError(
                f"The token response has token_type {excerpt(repr(token_type), 40)}; "
                "only Bearer is supported."
            )
        lifetime = _lifetime(payload.get("expires_in"))
        scope = payload.get("scope")
        if not (
            isinstance(scope, str)
            and len(scope) <= _MAX_SCOPE_CHARS
            and scope.isprintable()
            and scope.isascii()
        ):
            scope = default_scope
        return cls(
            access_token=access_token,
            refresh_token=refresh_token,
            expires_at=None if lifetime is None else now + lifetime,
            scope=scope,
            token_type="Bearer",  # noqa: S106 - a token type, not a secret
        )


def request_token(
    http_client: httpx.Client, token_endpoint: str, form: Mapping[str, str], *, default_scope: str = ""
) -> TokenSet:
    """POST a form to the token endpoint and parse the answer; errors carry only the OAuth code."""
    require_credential_url(token_endpoint, "a token request to the token endpoint")
    started = time.time()
    try:
        response, body = send_bounded(
            http_client, "POST", token_endpoint, data=dict(form), headers={"Accept": "application/json"}
        )
    except httpx.HTTPError as exc:
        raise BosTransportError(
            f"The token endpoint {token_endpoint} is unreachable: {type(exc).__name__}"
        ) from None
    except BodyTooLarge as exc:
        raise BosTokenEndpointError(
            f"The token endpoint {token_endpoint} answered with a body larger than {exc.limit} bytes.",
            oauth_error=None,
            status_code=None,
            url=token_endpoint,
        ) from None
    try:
        payload = parse_json(body)
    except ValueError:
        payload = None
    if not 200 <= response.status_code < 300:
        error = payload.get("error") if isinstance(payload, dict) else None
        description = payload.get("error_description") if isinstance(payload, dict) else None
        detail = f"{excerpt(error, 60)}" if isinstance(error, str) else "no OAuth error code"
        if isinstance(description, str) and description:
            detail += f" ({excerpt(description, 160)})"
        if not isinstance(payload, dict):
            detail += f"; body: {excerpt(body, 120)!r}"
        if response.is_redirect:
            detail += "; redirects are not followed"
        raise BosTokenEndpointError(
            f"The token endpoint {token_endpoint} refused the {form.get('grant_type', 'token')} request: "
            f"HTTP {response.status_code}, {detail}.",
            oauth_error=error if isinstance(error, str) else None,
            status_code=response.status_code,
            url=token_endpoint,
        )
    if not isinstance(payload, dict):
        raise BosTokenEndpointError(
            f"The token endpoint {token_endpoint} answered HTTP {response.status_code} "
            "without a JSON object: "
            f"{excerpt(body, 120)!r}",
            oauth_error=None,
            status_code=response.status_code,
            url=token_endpoint,
        )
    return TokenSet.from_response(payload, now=started, default_scope=default_scope)


def check_api_key(api_key: str, where: str = "The BOS API key") -> None:
    """Refuse a key that cannot be sent as a header, without quoting it.

    httpx would refuse the header and quote it, key included, in its error; a secrets masker
    registered with a raw line break does not match the escaped ``\\n`` of a traceback.
    """
    if not all("\x21" <= char <= "\x7e" for char in api_key):
        raise BosConfigurationError(
            f"{where} holds whitespace or control characters (a pasted line break?); store it again without them."
        )


class ApiKeyAuth(httpx.Auth):
    """``Authorization: Bearer <api key>`` (the contract's API-key alternative: no refresh)."""

    def __init__(self, api_key: str) -> None:
        if not api_key:
            raise BosConfigurationError("The BOS API key is empty.")
        register_secret(api_key)
        check_api_key(api_key)
        self._api_key = api_key

    def __repr__(self) -> str:
        return "ApiKeyAuth(api_key=***)"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        require_credential_url(str(request.url), "the BOS API key")
        request.headers["Authorization"] = f"Bearer {self._api_key}"
        yield request


class OAuthGrantAuth(httpx.Auth):
    """Bearer auth from a rotating OAuth grant kept in a :class:`SqlTokenStore` row ``key``.

    ``token_endpoint`` must come from discovery of ``resource`` (the hook discovers it on every
    connect): refreshes go there, whatever the row records. The row is used only while its
    ``resource`` and ``client_id`` are the ones given here.

    ``seed_refresh_token`` is the Airflow Connection's password. It (re)seeds the row only when the
    row has never consumed it (a fresh Connection, or a re-connect); a seed the row already used (an
    old copy of the Connection) is ignored, and a value that cannot be a token (``***``, empty) is
    ignored with a warning when a grant is stored, else fails. None means "no Connection seed".
    Thread-safe; one instance per process is enough.
    """

    requires_request_body = True  # a retried request must be re-sendable

    def __init__(
        self,
        store: SqlTokenStore,
        key: str,
        *,
        token_endpoint: str,
        client_id: str,
        resource: str,
        refresh_margin_s: float = 60.0,
        http_client: httpx.Client | None = None,
        seed_refresh_token: str | None = None,
        scope: str = DEFAULT_SCOPES,
    ) -> None:
        self._store = store
        self._key = key
        self._token_endpoint = token_endpoint
        self._client_id = client_id
        self._resource = resource
        self._margin = float(refresh_margin_s)
        self._http = http_client
        self._owns_http = http_client is None
        self._seed = seed_refresh_token
        self._scope = scope
        register_secret(seed_refresh_token)
        self._lock = threading.Lock()
        self._grant: StoredGrant | None = None
        self.refresh_count = 0  # refresh calls this instance made (diagnostics)

    def __repr__(self) -> str:
        return (
            f"OAuthGrantAuth(key={self._key!r}, resource={self._resource!r}, client_id={self._client_id!r})"
        )

    def close(self) -> None:
        if self._owns_http and self._http is not None:
            self._http.close()
            self._http = None

    @property
    def grant(self) -> StoredGrant | None:
        """The grant this instance currently uses (tokens hidden in its repr)."""
        return self._grant

    # --- httpx.Auth ---------------------------------------------------------------------------

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        require_credential_url(str(request.url), "an OAuth access token")
        token = self.access_token()
        request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code != 401:
            return
        token = self.access_token(rejected=token)
        request.headers["Authorization"] = f"Bearer {token}"
        yield request

    # --- grant handling ----------------------------------------------------------------------

    def access_token(self, *, rejected: str | None = None) -> str:
        """A usable access token; ``rejected`` is one the server just refused with 401."""
        with self._lock:
            grant = self._grant or self._load_or_seed()
            if rejected is None and grant.access_token_valid(margin_s=self._margin_for(grant)):
                assert grant.access_token is not None
                return grant.access_token
            if rejected is not None and grant.access_token and grant.access_token != rejected:
                # Another thread already replaced the token the server refused.
                return grant.access_token
            grant = self._refresh(grant, rejected=rejected)
            assert grant.access_token is not None
            return grant.access_token

    def _margin_for(self, grant: StoredGrant) -> float:
        """Refresh-ahead margin: the configured one while it is shorter than the token's lifetime,
        else half the lifetime — a margin longer than the lifetime would refresh (and rotate) on
        every request. The lifetime is counted from when the row was last written.
        """
        if grant.expires_at is None or grant.updated_at is None:
            return self._margin
        lifetime = max(grant.expires_at - grant.updated_at, 0.0)
        return self._margin if self._margin < lifetime else lifetime / 2

    def _load_or_seed(self) -> StoredGrant:
        grant = self._store.load(self._key)
        seed = self._seed
        problem = None if seed is None else token_problem(seed)
        if problem is not None:
            fix = (
                "set the Connection's password to the refresh token printed by "
                f"`airflow-provider-bos connect --conn-id {self._key} --show-secrets` "
                "(or connect with --save-connection)"
            )
            if grant is None:
                raise BosReconnectRequired(
                    f"The Connection {self._key!r} holds no refresh token (its password is {problem}) and "
                    f"the token store has no grant for it: {fix}.",
                    conn_id=self._key,
                )
            logger.warning(
                "The Connection %r's password is %s, not a refresh token; using the grant in the token "
                "store. To fix: %s.",
                self._key,
                problem,
                fix,
            )
        elif seed is not None and (
            grant is None or refresh_token_fingerprint(seed) not in grant.consumed_seeds
        ):
            # Under the lock the store re-checks: a seed another worker just consumed is a no-op.
            grant = self._store.seed(
                self._key,
                client_id=self._client_id,
                token_endpoint=self._token_endpoint,
                resource=self._resource,
                scope=self._scope,
                refresh_token=seed,
            )
        if grant is None:
            raise BosReconnectRequired(
                f"No OAuth grant is stored for {self._key!r} and the connection holds no refresh token: "
                "connect it on the Airflow UI's Admin -> BOS page, or run "
                f"`airflow-provider-bos connect --conn-id {self._key}`.",
                conn_id=self._key,
            )
        self._grant = self._bound(grant)
        return self._grant

    def _bound(self, grant: StoredGrant) -> StoredGrant:
        """``grant`` if it belongs to this Connection's resource, client and token endpoint; else a
        clear error."""
        if grant.resource != self._resource or grant.client_id != self._client_id:
            raise BosReconnectRequired(
                f"The grant stored for {self._key!r} was issued to client {grant.client_id!r} for "
                f"{grant.resource}, but the Connection now names client {self._client_id!r} and "
                f"{self._resource}; its tokens are not sent elsewhere. Reconnect for the new target.",
                conn_id=self._key,
            )
        if grant.token_endpoint != self._token_endpoint:
            raise BosReconnectRequired(
                f"The grant stored for {self._key!r} was issued by the token endpoint {grant.token_endpoint}, "
                f"but {self._resource} now names {self._token_endpoint}; its refresh token is sent only to the "
                "endpoint that issued it.",
                conn_id=self._key,
            )
        return grant

    def _http_client(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(timeout=30.0)
        return self._http

    def _refresh(self, seen: StoredGrant, *, rejected: str | None, follow_moved: bool = True) -> StoredGrant:
        """Refresh under the row lock, reusing a newer row when another worker got there first."""
        attempted_generation: list[int] = []

        def update(current: StoredGrant | None) -> StoredGrant | None:
            if current is None:
                raise BosReconnectRequired(
                    f"The OAuth grant for {self._key!r} is no longer in the token store.", conn_id=self._key
                )
            self._bound(current)
            moved = current.generation != seen.generation or current.access_token != seen.access_token
            if moved and current.access_token != rejected and current.access_token_valid():
                return None  # somebody else refreshed: reuse, do not refresh again
            if not current.refresh_token:
                raise BosReconnectRequired(
                    f"The OAuth grant for {self._key!r} has no refresh token.", conn_id=self._key
                )
            attempted_generation.append(current.generation)
            form = {
                "grant_type": "refresh_token",
                "refresh_token": current.refresh_token,
                "client_id": self._client_id,
                "resource": self._resource,
            }
            tokens = request_token(
                self._http_client(), self._token_endpoint, form, default_scope=current.scope
            )
            self.refresh_count += 1
            # Returned to the store, which commits it before we hand out the new access token.
            # Only plain assignments from here on: TokenSet already validated every value.
            return replace(
                current,
                token_endpoint=self._token_endpoint,
                access_token=tokens.access_token,
                refresh_token=tokens.refresh_token or current.refresh_token,
                expires_at=tokens.expires_at,
                scope=tokens.scope or current.scope,
                generation=current.generation + 1,
                updated_at=time.time(),
            )

        try:
            grant = self._store.refresh_locked(self._key, update, spends_grant=True)
        except BosTokenEndpointError as exc:
            if exc.oauth_error != "invalid_grant":
                raise
            tried = attempted_generation[-1] if attempted_generation else seen.generation
            grant = self._after_invalid_grant(tried, follow_moved=follow_moved)
        assert grant is not None
        self._grant = grant
        return grant

    def _after_invalid_grant(self, generation: int, *, follow_moved: bool) -> StoredGrant:
        current = self._store.load(self._key)
        if follow_moved and current is not None and current.generation != generation:
            self._bound(current)
            if current.access_token_valid():
                return current
            # The moved row's access token is already stale: one more locked refresh from it.
            self._grant = current
            return self._refresh(current, rejected=None, follow_moved=False)
        raise BosReconnectRequired(
            f"BOS rejected the stored refresh token for {self._key!r} (invalid_grant): "
            "the grant was revoked, expired, or used elsewhere.",
            conn_id=self._key,
        )

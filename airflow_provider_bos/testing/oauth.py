"""The reference server's OAuth side: authorization server, token verification, API keys.

Built on the MCP SDK's ``mcp.server.auth`` handlers (authorize, token, register, metadata) with
:class:`BosOAuthProvider` as their ``OAuthAuthorizationServerProvider``. Thin wrappers fill the
SDK's gaps (mcp 2.3.0), each marked where it is defined:

- the token handler never passes ``resource`` to the provider: :func:`token_endpoint` checks it;
- DCR defaults a missing ``token_endpoint_auth_method`` to ``client_secret_post``: BOS clients are
  public, so :func:`registration_endpoint` registers them as ``none`` and refuses secrets;
- the AS metadata omits ``none`` and the RFC 9207 ``iss`` flag: :func:`build_as_metadata` sets them;
- ``RequireAuthMiddleware`` always sends ``error="invalid_token"``, even with no token:
  :class:`BearerGate` (raw ASGI) sends the bare challenge when no credential was presented.

State is in memory, per server instance, behind one lock (the provider is called from the
server's event loop; tests call ``mint_grant`` etc. from their own thread).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from mcp.server.auth.handlers.metadata import MetadataHandler
from mcp.server.auth.handlers.register import RegistrationHandler
from mcp.server.auth.handlers.token import TokenHandler
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.middleware.client_auth import ClientAuthenticator
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    AuthorizeError,
    IdentityAssertionParams,
    RefreshToken,
    RegistrationError,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.routes import build_metadata
from mcp.server.auth.settings import ClientRegistrationOptions, RevocationOptions
from mcp.shared.auth import OAuthClientInformationFull, OAuthMetadata, OAuthToken
from pydantic import AnyHttpUrl
from starlette.authentication import AuthCredentials
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from airflow_provider_bos.testing.counters import ServerCounters

__all__ = [
    "SCOPES",
    "BosOAuthProvider",
    "BearerGate",
    "build_as_metadata",
    "token_endpoint",
    "registration_endpoint",
]

SCOPES = ["mcp:tools", "offline_access"]
CODE_LIFETIME_S = 60.0
_PKCE_CHALLENGE = re.compile(r"^[A-Za-z0-9_-]{43}$")  # base64url(SHA-256), unpadded


def _new_secret(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


@dataclass
class _Grant:
    """One user authorization of one client: its live refresh token and every token it minted."""

    grant_id: str
    client_id: str
    scopes: list[str]
    resource: str
    subject: str
    refresh_token: str | None = field(default=None, repr=False)
    rotated: set[str] = field(default_factory=set, repr=False)  # refresh tokens already exchanged
    access_tokens: set[str] = field(default_factory=set, repr=False)
    revoked: bool = False


@dataclass
class _AccessRecord:
    grant_id: str | None  # None for an API key
    client_id: str
    scopes: list[str]
    resource: str
    subject: str
    expires_at: float | None
    requests: int = 0


class BosOAuthProvider:
    """In-memory authorization server state, implementing the SDK's provider protocol."""

    def __init__(self, *, issuer: str, resource: str, local_user: str, counters: ServerCounters,
                 access_token_ttl_s: float = 3600.0) -> None:
        self.issuer = issuer
        self.resource = resource
        self.local_user = local_user
        self.access_token_ttl_s = float(access_token_ttl_s)
        self.expire_after_requests: int | None = None  # FaultSpec.expire_access_token_after_requests
        self._counters = counters
        self._lock = threading.RLock()
        self._clients: dict[str, OAuthClientInformationFull] = {}
        self._codes: dict[str, AuthorizationCode] = {}
        self._used_codes: dict[str, str | None] = {}  # code -> grant it produced
        self._grants: dict[str, _Grant] = {}
        self._refresh_index: dict[str, str] = {}  # refresh token (live or rotated) -> grant id
        self._access: dict[str, _AccessRecord] = {}

    # -- clients -------------------------------------------------------------------------------
    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        with self._lock:
            return self._clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        if client_info.token_endpoint_auth_method != "none" or client_info.client_secret:
            raise RegistrationError("invalid_client_metadata", "BOS registers public clients only "
                                    "(token_endpoint_auth_method 'none')")
        if not client_info.redirect_uris:
            raise RegistrationError("invalid_redirect_uri", "redirect_uris is required")
        with self._lock:
            self._clients[client_info.client_id] = client_info

    def register_public_client(self, redirect_uris: list[str], client_name: str = "test client") -> str:
        client_id = secrets.token_hex(16)
        info = OAuthClientInformationFull.model_validate({
            "client_id": client_id,
            "client_id_issued_at": int(time.time()),
            "client_name": client_name,
            "redirect_uris": redirect_uris,
            "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "scope": " ".join(SCOPES),
        })
        with self._lock:
            self._clients[client_id] = info
        return client_id

    # -- authorization endpoint ------------------------------------------------------------------
    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        # The SDK already checked client_id, the registered redirect_uri, response_type=code,
        # code_challenge_method=S256 and the scope. BOS additionally requires these:
        if not params.redirect_uri_provided_explicitly:
            raise AuthorizeError("invalid_request", "redirect_uri is required")
        if not params.state:
            raise AuthorizeError("invalid_request", "state is required")
        if not _PKCE_CHALLENGE.fullmatch(params.code_challenge):
            raise AuthorizeError("invalid_request", "code_challenge must be an S256 challenge (43 base64url chars)")
        if params.resource is not None and params.resource != self.resource:
            raise AuthorizeError("invalid_target", "resource must be the BOS Platform MCP URL")
        scopes = params.scopes or (client.scope or " ".join(SCOPES)).split()
        if "mcp:tools" not in scopes:
            raise AuthorizeError("invalid_scope", "scope must include mcp:tools")
        code = _new_secret("bos_code")
        # Auto-consent: the configured local user "signs in" and approves immediately.
        with self._lock:
            self._codes[code] = AuthorizationCode(
                code=code, scopes=scopes, expires_at=time.time() + CODE_LIFETIME_S,
                client_id=client.client_id, code_challenge=params.code_challenge,
                redirect_uri=params.redirect_uri, redirect_uri_provided_explicitly=True,
                resource=self.resource, subject=self.local_user)
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state, iss=self.issuer)

    # -- token endpoint --------------------------------------------------------------------------
    async def load_authorization_code(self, client: OAuthClientInformationFull,
                                      authorization_code: str) -> AuthorizationCode | None:
        with self._lock:
            code = self._codes.get(authorization_code)
            if code is None and authorization_code in self._used_codes:
                # RFC 6749 §4.1.2: a replayed code revokes what it produced.
                grant_id = self._used_codes[authorization_code]
                if grant_id is not None:
                    self._revoke_locked(grant_id)
            return code

    async def exchange_authorization_code(self, client: OAuthClientInformationFull,
                                          authorization_code: AuthorizationCode) -> OAuthToken:
        with self._lock:
            if self._codes.pop(authorization_code.code, None) is None:  # one-time, even under races
                raise TokenError("invalid_grant", "authorization code already used")
            grant = self._new_grant_locked(client.client_id, authorization_code.scopes,
                                           authorization_code.subject or self.local_user)
            self._used_codes[authorization_code.code] = grant.grant_id
            return self._issue_locked(grant)

    async def load_refresh_token(self, client: OAuthClientInformationFull,
                                 refresh_token: str) -> RefreshToken | None:
        with self._lock:
            grant_id = self._refresh_index.get(refresh_token)
            grant = self._grants.get(grant_id) if grant_id else None
            if grant is None or grant.revoked:
                return None
            if refresh_token in grant.rotated:
                # Reuse of an already-rotated refresh token: treat the grant as compromised.
                self._counters.incr("refresh_reuse_detected")
                self._revoke_locked(grant.grant_id)
                return None
            return RefreshToken(token=refresh_token, client_id=grant.client_id, scopes=grant.scopes,
                                resource=grant.resource, subject=grant.subject)

    async def exchange_refresh_token(self, client: OAuthClientInformationFull, refresh_token: RefreshToken,
                                     scopes: list[str]) -> OAuthToken:
        with self._lock:
            grant_id = self._refresh_index.get(refresh_token.token)
            grant = self._grants.get(grant_id) if grant_id else None
            if grant is None or grant.revoked or grant.refresh_token != refresh_token.token:
                raise TokenError("invalid_grant", "refresh token is no longer valid")
            grant.rotated.add(refresh_token.token)
            grant.refresh_token = None
            self._counters.incr("refreshes")
            return self._issue_locked(grant, scopes=scopes)

    async def load_access_token(self, token: str) -> AccessToken | None:
        with self._lock:
            rec = self._access.get(token)
            if rec is None:
                return None
            return AccessToken(token=token, client_id=rec.client_id, scopes=rec.scopes, resource=rec.resource,
                               subject=rec.subject, claims={"iss": self.issuer})

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        with self._lock:
            grant_id = self._refresh_index.get(token.token)
            if grant_id is None and token.token in self._access:
                grant_id = self._access[token.token].grant_id
            if grant_id is not None:
                self._revoke_locked(grant_id)

    async def exchange_identity_assertion(
        self, client: OAuthClientInformationFull, params: IdentityAssertionParams
    ) -> OAuthToken:
        """The reference server grants by authorization code and refresh token only (no SEP-990)."""
        raise TokenError("unsupported_grant_type", "this server does not accept identity assertions")

    # -- bearer verification (used by BearerGate) -------------------------------------------------
    def verify_bearer(self, token: str) -> tuple[AccessToken | None, str]:
        """Check a presented bearer credential and count the request against it.

        Returns ``(access_token, "")`` when accepted, else ``(None, reason)``.
        """
        with self._lock:
            rec = self._access.get(token)
            if rec is None:
                return None, "The access token is not recognised"
            if rec.grant_id is not None:
                grant = self._grants.get(rec.grant_id)
                if grant is None or grant.revoked:
                    return None, "The access token was revoked"
            if rec.expires_at is not None and time.time() >= rec.expires_at:
                return None, "The access token expired"
            limit = self.expire_after_requests
            if rec.grant_id is not None and limit is not None and rec.requests >= limit:
                return None, "The access token expired"
            rec.requests += 1
            return AccessToken(token=token, client_id=rec.client_id, scopes=rec.scopes, resource=rec.resource,
                               subject=rec.subject, claims={"iss": self.issuer}), ""

    # -- test helpers ---------------------------------------------------------------------------
    def mint_grant(self, *, client_id: str, scope: str) -> dict[str, Any]:
        with self._lock:
            if client_id not in self._clients:
                raise ValueError("unknown client_id")
            grant = self._new_grant_locked(client_id, scope.split(), self.local_user)
            token = self._issue_locked(grant)
        out = token.model_dump(exclude_none=True)
        out["client_id"] = client_id
        out.setdefault("refresh_token", None)
        return out

    def create_api_key(self) -> str:
        key = _new_secret("bos_key")
        with self._lock:
            self._access[key] = _AccessRecord(grant_id=None, client_id=f"api-key:{secrets.token_hex(4)}",
                                              scopes=["mcp:tools"],
                                              resource=self.resource, subject=self.local_user, expires_at=None)
        return key

    def revoke_grant_of(self, refresh_token: str) -> None:
        with self._lock:
            grant_id = self._refresh_index.get(refresh_token)
            if grant_id is None:
                raise ValueError("unknown refresh token")
            self._revoke_locked(grant_id)

    # -- internals ------------------------------------------------------------------------------
    def _new_grant_locked(self, client_id: str, scopes: list[str], subject: str) -> _Grant:
        grant = _Grant(grant_id=secrets.token_hex(8), client_id=client_id, scopes=list(scopes),
                       resource=self.resource, subject=subject)
        self._grants[grant.grant_id] = grant
        return grant

    def _issue_locked(self, grant: _Grant, scopes: list[str] | None = None) -> OAuthToken:
        ttl = self.access_token_ttl_s
        access = _new_secret("bos_at")
        self._access[access] = _AccessRecord(grant_id=grant.grant_id, client_id=grant.client_id,
                                             scopes=list(scopes or grant.scopes), resource=grant.resource,
                                             subject=grant.subject, expires_at=time.time() + ttl)
        grant.access_tokens.add(access)
        refresh = None
        if "offline_access" in grant.scopes:
            refresh = _new_secret("bos_rt")
            grant.refresh_token = refresh
            self._refresh_index[refresh] = grant.grant_id
        # expires_in never overstates the real lifetime (clients refresh ahead of it).
        return OAuthToken(access_token=access, token_type="Bearer", expires_in=int(ttl),
                          scope=" ".join(scopes or grant.scopes), refresh_token=refresh)

    def _revoke_locked(self, grant_id: str) -> None:
        grant = self._grants.get(grant_id)
        if grant is None or grant.revoked:
            return
        grant.revoked = True
        grant.refresh_token = None
        for token in grant.access_tokens:
            self._access.pop(token, None)
        self._counters.incr("grants_revoked")


# -- SDK gap fillers ------------------------------------------------------------------------------

def registration_options() -> ClientRegistrationOptions:
    return ClientRegistrationOptions(enabled=True, valid_scopes=list(SCOPES), default_scopes=list(SCOPES))


def build_as_metadata(*, issuer: str, docs_url: str) -> OAuthMetadata:
    """RFC 8414 metadata: the SDK's, plus the public-client and RFC 9207 fields it omits."""
    metadata = build_metadata(AnyHttpUrl(issuer), AnyHttpUrl(docs_url), registration_options(),
                              RevocationOptions(enabled=False))
    fields = metadata.model_dump(exclude_none=True, mode="json")
    fields.update(
        issuer=issuer,  # exact, without the trailing slash AnyHttpUrl would add
        token_endpoint_auth_methods_supported=["none"],
        authorization_response_iss_parameter_supported=True,
        code_challenge_methods_supported=["S256"],
    )
    return OAuthMetadata.model_validate(fields)


def metadata_endpoint(metadata: OAuthMetadata) -> Any:
    return MetadataHandler(metadata).handle


def token_endpoint(provider: BosOAuthProvider) -> Any:
    """SDK TokenHandler behind an RFC 8707 ``resource`` check (the SDK never passes it on)."""
    handler = TokenHandler(provider, ClientAuthenticator(provider))

    async def endpoint(request: Request) -> Response:
        form = await request.form()  # cached on the request: the SDK handler re-reads it
        resource = form.get("resource")
        if resource is not None and resource != provider.resource:
            return JSONResponse({"error": "invalid_target",
                                 "error_description": "resource must be the BOS Platform MCP URL"},
                                status_code=400, headers={"Cache-Control": "no-store", "Pragma": "no-cache"})
        return await handler.handle(request)

    return endpoint


def registration_endpoint(provider: BosOAuthProvider) -> Any:
    """SDK RegistrationHandler for public clients: a missing auth method means ``none``."""
    handler = RegistrationHandler(provider, options=registration_options())

    async def endpoint(request: Request) -> Response:
        body = await request.body()
        try:
            document = json.loads(body)
        except ValueError:
            document = None
        if isinstance(document, dict) and document.get("token_endpoint_auth_method") is None:
            document["token_endpoint_auth_method"] = "none"
            request._body = json.dumps(document).encode()  # the SDK handler reads request.body()
        elif isinstance(document, dict) and document.get("token_endpoint_auth_method") != "none":
            return JSONResponse({"error": "invalid_client_metadata",
                                 "error_description": "BOS registers public clients only "
                                                      "(token_endpoint_auth_method 'none')"}, status_code=400)
        return await handler.handle(request)

    return endpoint


def pkce_challenge(verifier: str) -> str:
    """S256 challenge of a PKCE verifier (helper for tests and the CLI)."""
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")


class BearerGate:
    """Raw ASGI bearer check in front of the MCP endpoint.

    Raw because the SDK's ``RequireAuthMiddleware`` always answers ``error="invalid_token"``, while
    RFC 6750 §3.1 says a request without credentials gets the bare challenge. Sets ``scope["user"]``
    to the SDK's ``AuthenticatedUser`` so the session manager's per-credential session binding works.
    """

    def __init__(self, app: ASGIApp, provider: BosOAuthProvider, *, resource_metadata_url: str,
                 counters: ServerCounters) -> None:
        self.app = app
        self.provider = provider
        self.resource_metadata_url = resource_metadata_url
        self.counters = counters

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None)
        if header is None or header[:7].lower() != "bearer " or not header[7:].strip():
            await self._challenge(send, None, "Authentication required")
            return
        access, reason = self.provider.verify_bearer(header[7:].strip())
        if access is None:
            await self._challenge(send, "invalid_token", reason)
            return
        scope["user"] = AuthenticatedUser(access)
        scope["auth"] = AuthCredentials(access.scopes)
        await self.app(scope, receive, send)

    async def _challenge(self, send: Send, error: str | None, description: str) -> None:
        self.counters.incr("unauthorized")
        parts = []
        if error is not None:
            parts += [f'error="{error}"', f'error_description="{description}"']
        parts.append(f'resource_metadata="{self.resource_metadata_url}"')
        body = json.dumps({"error": error or "unauthorized", "error_description": description}).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", ("Bearer " + ", ".join(parts)).encode()),
        ]})
        await send({"type": "http.response.body", "body": body})


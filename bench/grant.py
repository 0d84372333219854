"""A bearer token for the bench, minted over plain HTTP against the loopback reference server.

The server runs in a subprocess and has no admin mint route, so this walks the OAuth flow it
auto-consents: dynamic client registration, ``/authorize`` with PKCE (read the 302, never follow
it off loopback), ``/token``. Bench-only code: the provider's real flow lives in ``auth/``.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from urllib.parse import parse_qs, urlsplit

import httpx

__all__ = ["BearerAuth", "mint_access_token"]

_REDIRECT_URI = "http://127.0.0.1:9/callback"  # never contacted: we read the Location header
_SCOPE = "mcp:tools offline_access"


class BearerAuth(httpx.Auth):
    """Sends a fixed bearer token (no refresh: the bench server's tokens outlive the run)."""

    def __init__(self, token: str) -> None:
        self._token = token

    def __repr__(self) -> str:
        return "BearerAuth(token='***')"

    def auth_flow(self, request: httpx.Request):  # type: ignore[no-untyped-def]
        request.headers["Authorization"] = f"Bearer {self._token}"
        yield request


class GrantError(RuntimeError):
    """The bench could not obtain a token from the reference server."""


def _base_url(mcp_url: str) -> str:
    parts = urlsplit(mcp_url)
    return f"{parts.scheme}://{parts.netloc}"


def mint_access_token(mcp_url: str, *, timeout: float = 30.0) -> str:
    """Register a public client, authorize with PKCE (auto-consent), and return the access token."""
    base = _base_url(mcp_url)
    with httpx.Client(timeout=timeout, follow_redirects=False) as client:
        meta = client.get(f"{base}/.well-known/oauth-authorization-server")
        meta.raise_for_status()
        endpoints = meta.json()
        reg = client.post(
            endpoints.get("registration_endpoint") or f"{base}/register",
            json={
                "redirect_uris": [_REDIRECT_URI],
                "client_name": "bos-bench",
                "token_endpoint_auth_method": "none",
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
                "scope": _SCOPE,
            },
        )
        if reg.status_code not in (200, 201):
            raise GrantError(f"client registration failed: HTTP {reg.status_code}")
        client_id = reg.json()["client_id"]

        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
        state = secrets.token_urlsafe(16)
        auth = client.get(
            endpoints["authorization_endpoint"],
            params={
                "response_type": "code",
                "client_id": client_id,
                "redirect_uri": _REDIRECT_URI,
                "state": state,
                "code_challenge": challenge,
                "code_challenge_method": "S256",
                "scope": _SCOPE,
                "resource": mcp_url,
            },
        )
        if auth.status_code not in (302, 303, 307):
            raise GrantError(f"authorization did not redirect: HTTP {auth.status_code}")
        query = parse_qs(urlsplit(auth.headers["location"]).query)
        if query.get("state") != [state] or "code" not in query:
            raise GrantError("authorization redirect lacks the code or carries another state")

        token = client.post(
            endpoints["token_endpoint"],
            data={
                "grant_type": "authorization_code",
                "code": query["code"][0],
                "redirect_uri": _REDIRECT_URI,
                "client_id": client_id,
                "code_verifier": verifier,
                "resource": mcp_url,
            },
        )
        if token.status_code != 200:
            raise GrantError(f"token exchange failed: HTTP {token.status_code}")
        return str(token.json()["access_token"])

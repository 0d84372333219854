"""CSRF protection for the BOS page's forms: a token only the signed-in browser's page can know.

The token is an HMAC keyed by the request's own Airflow credential (the JWT in the ``_token``
cookie or the ``Authorization`` header), so another site cannot compute it, and every api-server
worker derives the same one without shared state. A POST must carry it and, when the browser sends
an ``Origin``, come from this server's origin.
"""

from __future__ import annotations

import hashlib
import hmac

from airflow_provider_bos.auth.pkce import b64url
from airflow_provider_bos.auth.urls import parse_url

__all__ = ["csrf_token", "csrf_valid", "same_origin"]

_PURPOSE = b"airflow-provider-bos/ui/csrf/v1"


def csrf_token(credential: str) -> str:
    return b64url(hmac.new(credential.encode("utf-8"), _PURPOSE, hashlib.sha256).digest())


def csrf_valid(credential: str | None, submitted: str | None) -> bool:
    if not credential or not submitted:
        return False
    return hmac.compare_digest(csrf_token(credential).encode(), submitted.encode())


def same_origin(origin_header: str | None, server_url: str) -> bool:
    """True when no ``Origin`` was sent (non-browser client) or it is the server's own origin."""
    if origin_header is None:
        return True
    try:
        return parse_url(origin_header).origin == parse_url(server_url).origin
    except ValueError:
        return False

"""CSRF protection for the BOS page's forms: a token only a page this server rendered can know.

The token is ``v2.<expiry>.<mac>``: an HMAC, under a key derived from a server-side secret (the API
server's ``[api] secret_key``, the same on every api-server instance), of the signed-in user's id
and the expiry. Another site cannot compute it, another user's token does not fit, and it does not
depend on the session credential: it works without a session cookie
(``simple_auth_manager_all_admins``) and keeps working when the auth manager re-issues the JWT.
A POST must carry it and, when the browser sends an ``Origin``, come from this server's origin.

The same construction, under another purpose, signs the page's "Connected" notice
(:func:`notice_token`): the callback redirects to ``?connected=<id>&sig=<token>``, and the page shows
the notice only for a token it issued to this user for that Connection id in the last
:data:`NOTICE_TTL_S` seconds, so a link cannot put text of its choosing into the page's success notice.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from airflow_provider_bos.auth.pkce import b64url
from airflow_provider_bos.auth.urls import parse_url

__all__ = [
    "CSRF_TTL_S", "NOTICE_TTL_S", "csrf_token", "csrf_valid", "notice_token", "notice_valid", "page_csrf_key",
    "same_origin",
]

CSRF_TTL_S = 12 * 3600.0
NOTICE_TTL_S = 600.0
_PURPOSE = b"airflow-provider-bos/ui/csrf/v2"
_NOTICE_PURPOSE = b"airflow-provider-bos/ui/connected-notice/v1"
_VERSION = "v2"


def _mac(key: bytes, user_id: str, expires: int, *, purpose: bytes = _PURPOSE, subject: str | None = None) -> str:
    subkey = hmac.new(key, purpose, hashlib.sha256).digest()
    message = f"{len(user_id)}:{user_id}:{expires}".encode()
    if subject is not None:
        message += f":{len(subject)}:{subject}".encode()
    return b64url(hmac.new(subkey, message, hashlib.sha256).digest())


def notice_token(user_id: str, conn_id: str, *, key: bytes, now: float | None = None) -> str:
    """What the callback signs for the "Connected" notice: ``<expiry>.<mac>`` of user, Connection id
    and expiry (:data:`NOTICE_TTL_S`)."""
    expires = int((time.time() if now is None else now) + NOTICE_TTL_S)
    return f"{expires}.{_mac(key, user_id, expires, purpose=_NOTICE_PURPOSE, subject=conn_id)}"


def notice_valid(user_id: str, conn_id: str, submitted: str | None, *, key: bytes, now: float | None = None) -> bool:
    if not submitted:
        return False
    expires_text, _, mac = submitted.partition(".")
    if not expires_text.isdigit() or not mac:
        return False
    expires = int(expires_text)
    current = time.time() if now is None else now
    if expires < current or expires > current + NOTICE_TTL_S:
        return False
    expected = _mac(key, user_id, expires, purpose=_NOTICE_PURPOSE, subject=conn_id)
    return hmac.compare_digest(expected.encode(), mac.encode())


def csrf_token(user_id: str, *, key: bytes, now: float | None = None) -> str:
    """A token for ``user_id``'s forms, valid for :data:`CSRF_TTL_S` from ``now``."""
    expires = int((time.time() if now is None else now) + CSRF_TTL_S)
    return f"{_VERSION}.{expires}.{_mac(key, user_id, expires)}"


def csrf_valid(user_id: str, submitted: str | None, *, key: bytes, now: float | None = None) -> bool:
    if not submitted:
        return False
    parts = submitted.split(".")
    if len(parts) != 3 or parts[0] != _VERSION or not parts[1].isdigit():
        return False
    expires = int(parts[1])
    current = time.time() if now is None else now
    if expires < current or expires > current + CSRF_TTL_S:
        return False
    return hmac.compare_digest(_mac(key, user_id, expires).encode(), parts[2].encode())


def page_csrf_key() -> bytes:
    """The server-side secret: ``[api] secret_key`` (else ``[api_auth] jwt_secret``)."""
    from airflow.configuration import conf

    secret = conf.get("api", "secret_key", fallback="") or conf.get("api_auth", "jwt_secret", fallback="")
    if not secret:
        from airflow_provider_bos.exceptions import BosConfigurationError

        raise BosConfigurationError(
            "The BOS page needs [api] secret_key (the same on every api-server) to protect its forms."
        )
    return secret.encode("utf-8")


def same_origin(origin_header: str | None, server_url: str) -> bool:
    """True when no ``Origin`` was sent (non-browser client) or it is the server's own origin."""
    if origin_header is None:
        return True
    try:
        return parse_url(origin_header).origin == parse_url(server_url).origin
    except ValueError:
        return False

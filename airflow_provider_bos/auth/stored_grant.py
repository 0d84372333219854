"""One token store row as the code sees it, and the checks a value must pass to become one.

:class:`StoredGrant` is a row with its tokens decrypted (its repr never shows one);
:func:`token_problem` says why a value cannot be an OAuth token (a masked ``***``, an empty or
pasted line), and :func:`refresh_token_fingerprint` names a seed without storing it twice.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from airflow_provider_bos.auth.sealed import RowBinding

__all__ = ["StoredGrant", "token_problem", "refresh_token_fingerprint", "MAX_TOKEN_CHARS"]

# Longest token stored: its ciphertext must fit a TEXT column everywhere (MySQL's holds 64 KiB).
MAX_TOKEN_CHARS = 16_384


def refresh_token_fingerprint(refresh_token: str) -> str:
    """sha256 hex of a refresh token: identifies the seed without storing it twice."""
    return hashlib.sha256(refresh_token.encode("utf-8")).hexdigest()


def token_problem(value: object) -> str | None:
    """Why ``value`` cannot be an OAuth token, or None when it can.

    RFC 6749 tokens are printable ASCII without spaces (VSCHAR). That rules out what a copied,
    masked or emptied Connection password holds: ``***`` (the connect command's and Airflow's
    masked placeholder), an empty or whitespace value, or a pasted line with a space in it.
    """
    if not isinstance(value, str):
        return "not a string"
    if not value.strip():
        return "empty"
    if set(value) <= {"*", "\u2022"}:
        return "a masked placeholder"
    if len(value) > MAX_TOKEN_CHARS:
        return f"longer than {MAX_TOKEN_CHARS} characters"
    if not all("\x21" <= char <= "\x7e" for char in value):
        return "not printable ASCII without spaces"
    return None


@dataclass(frozen=True)
class StoredGrant:
    """One row of the token store, tokens decrypted. The repr never shows a token."""

    key: str
    client_id: str
    token_endpoint: str
    resource: str
    scope: str
    access_token: str | None
    refresh_token: str | None
    expires_at: float | None  # epoch seconds; None = the server gave no lifetime
    generation: int
    seed_fingerprint: str | None
    updated_at: float
    consumed_seeds: frozenset[str] = frozenset()  # sha256 of every seed this row ever used

    def __repr__(self) -> str:
        return (
            f"StoredGrant(key={self.key!r}, client_id={self.client_id!r}, resource={self.resource!r}, "
            f"generation={self.generation}, expires_at={self.expires_at!r}, "
            f"access_token={'***' if self.access_token else None}, "
            f"refresh_token={'***' if self.refresh_token else None})"
        )

    __str__ = __repr__

    @property
    def binding(self) -> RowBinding:
        """What this row's sealed tokens are bound to."""
        return RowBinding(self.key, self.client_id, self.resource, self.token_endpoint)

    def access_token_valid(self, *, margin_s: float = 0.0, now: float | None = None) -> bool:
        """An access token is present and does not expire within ``margin_s``."""
        if not self.access_token:
            return False
        if self.expires_at is None:
            return True
        return self.expires_at - margin_s > (time.time() if now is None else now)


"""PKCE (RFC 7636) S256 and the random values of an authorization request."""

from __future__ import annotations

import base64
import hashlib
import secrets

__all__ = ["b64url", "random_value", "new_verifier", "s256_challenge"]


def b64url(data: bytes) -> str:
    """base64url without padding, as the contract's example computes it."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def random_value(num_bytes: int = 32) -> str:
    """A random base64url string from ``secrets`` (32 bytes -> 43 characters)."""
    return b64url(secrets.token_bytes(num_bytes))


def new_verifier() -> str:
    """A code verifier: 43 characters of base64url from 256 random bits."""
    return random_value(32)


def s256_challenge(verifier: str) -> str:
    """``BASE64URL(SHA256(ASCII(verifier)))``."""
    return b64url(hashlib.sha256(verifier.encode("ascii")).digest())

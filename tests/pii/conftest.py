"""Keys for the personal-data tests: fixed texts, so known-answer hashes can be written down (random ones,
made as ``airflow-provider-bos pii-keygen`` makes them: the provider refuses a guessable key)."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from airflow_provider_bos.pii import PiiKey

KEY_TEXT = "8jEnT4VZErCLSxNguJx_ZjY-2qzsSIQCa28IroK6AAk"
OTHER_KEY_TEXT = "ycNuUYPvVngAdOYdgKL7yYgLtLbPAaIvRfjjDx_2erU"


def reference_wire_hash(key_text: str, raw_wire_hash: str) -> str:
    """The keyed wire hash a table under a policy stores, written independently of the package:
    BLAKE2b-256 of the raw hash's hex, keyed with HMAC-SHA-256(key, "bos-pii-wire-hash")."""
    wire_key = hmac.new(key_text.encode("utf-8"), b"bos-pii-wire-hash", hashlib.sha256).digest()
    return hashlib.blake2b(raw_wire_hash.encode("ascii"), key=wire_key, digest_size=32).hexdigest()


def hmac_wire_hash(key_text: str, raw_wire_hash: str) -> str:
    """The keyed wire hash of tables written before BLAKE2b: HMAC-SHA-256 of the raw hash's hex."""
    return hmac.new(key_text.encode("utf-8"), raw_wire_hash.encode("ascii"), hashlib.sha256).hexdigest()


@pytest.fixture()
def key() -> PiiKey:
    return PiiKey.from_text(KEY_TEXT, source="a test")


@pytest.fixture()
def other_key() -> PiiKey:
    return PiiKey.from_text(OTHER_KEY_TEXT, source="a test")

"""Keys for the personal-data tests: fixed texts, so known-answer hashes can be written down."""

from __future__ import annotations

import pytest

from airflow_provider_bos.pii import PiiKey

KEY_TEXT = "test-pii-key-0123456789-abcdefghijklmnop"
OTHER_KEY_TEXT = "another-pii-key-9876543210-zyxwvutsrqpon"


@pytest.fixture()
def key() -> PiiKey:
    return PiiKey.from_text(KEY_TEXT, source="a test")


@pytest.fixture()
def other_key() -> PiiKey:
    return PiiKey.from_text(OTHER_KEY_TEXT, source="a test")

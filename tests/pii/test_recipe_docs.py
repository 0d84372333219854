"""The recipe as docs/personal-data.md prints it (Python and PostgreSQL) gives the hashes the provider stores."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_provider_bos.pii import PiiKey, PiiPolicy, hash_value, lookup_hash
from tests.pii.conftest import KEY_TEXT

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "personal-data.md").read_text()
EMAILS = [" Alice@Example.ORG\n", "bob.smith@example.org", "Zoe\u0301@example.org"]


def _block(language: str, containing: str) -> str:
    return next(b for b in re.findall(rf"```{language}\n(.*?)```", PAGE, re.DOTALL) if containing in b)


PHONES = ["+49 (30) 1234-56", "0049 30 123456", "+\u0664\u0669 \u0663\u0660 \u0661\u0662\u0663",
          "\uff0b\uff14\uff19 30", "\u096f\u0967 11 3333"]


def test_the_pages_python_recipe_gives_the_stored_hash(key: PiiKey) -> None:
    names: dict[str, Any] = {}
    exec(_block("python", "def email_hash"), names)  # noqa: S102 - the page's own example
    for email in EMAILS:
        assert names["email_hash"](KEY_TEXT + "\n", email) == lookup_hash(key, "email", email)
    for phone in PHONES:
        assert names["phone_hash"](KEY_TEXT, phone) == lookup_hash(key, "phone", phone)
    assert names["email_hash"](KEY_TEXT, " \t") is None and names["phone_hash"](KEY_TEXT, "n/a") is None
    assert hash_value(key, "email", " ") is None and hash_value(key, "phone", "n/a") is None
    recipe_hash = names["recipe_hash"]
    assert recipe_hash(KEY_TEXT, "sources[].external_id", " E-1 ") == lookup_hash(key, "sources[].external_id", " E-1 ")
    assert recipe_hash(KEY_TEXT, "sources[].external_id", 4711) == hash_value(key, "sources[].external_id", 4711)
    assert recipe_hash(KEY_TEXT, "attributes.contacts.phone", "x") == lookup_hash(key, "attributes.contacts.phone", "x")
    assert recipe_hash(KEY_TEXT, "lifecycle", True) == hash_value(key, "lifecycle", True)
    assert recipe_hash(KEY_TEXT, "attributes.score", 1.5) == hash_value(key, "attributes.score", 1.5)
    assert recipe_hash(KEY_TEXT, "attributes.a\\.b", "v") == PiiPolicy.parse({"attributes": "hash"}).plan(key).apply(
        {"record_ref": "r", "attributes": {"a.b": "v"}})["attributes"]["a.b"]


@pytest.mark.postgres
def test_the_pages_postgresql_recipe_gives_the_stored_hash(postgres_url: str, key: PiiKey) -> None:
    engine = sa.create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            if conn.exec_driver_sql("SELECT 1 FROM pg_available_extensions WHERE name = 'pgcrypto'").first() is None:
                pytest.skip("pgcrypto is not available on this PostgreSQL server")
            # Created inside the transaction that is rolled back: the test database is left as it was.
            conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pgcrypto")
            statement = sa.text(_block("sql", "hmac("))
            for email in EMAILS[:2]:  # ASCII addresses: where the page says SQL and Python agree
                got = conn.execute(statement, {"email": email, "key_text": KEY_TEXT}).scalar()
                assert got == lookup_hash(key, "email", email)
            conn.rollback()
    finally:
        engine.dispose()

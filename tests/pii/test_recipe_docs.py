"""The recipe as docs/personal-data.md prints it (Python and PostgreSQL) gives the hashes the provider stores."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sqlalchemy as sa

from airflow_provider_bos.pii import PiiKey, lookup_hash
from tests.pii.conftest import KEY_TEXT

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "personal-data.md").read_text()
EMAILS = [" Alice@Example.ORG\n", "bob.smith@example.org", "Zoe\u0301@example.org"]


def _block(language: str, containing: str) -> str:
    return next(b for b in re.findall(rf"```{language}\n(.*?)```", PAGE, re.DOTALL) if containing in b)


def test_the_pages_python_recipe_gives_the_stored_hash(key: PiiKey) -> None:
    names: dict[str, object] = {}
    exec(_block("python", "def email_hash"), names)  # noqa: S102 - the page's own example
    for email in EMAILS:
        assert names["email_hash"](KEY_TEXT + "\n", email) == lookup_hash(key, "email", email)  # type: ignore[operator]


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

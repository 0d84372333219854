"""A Snowflake URL as the token store is refused up front, saying what to use instead."""

from __future__ import annotations

import pytest
from fakesnow_support import fakesnow_server, snowflake_url  # noqa: F401 - fixtures

from airflow_provider_bos.auth.token_store import SqlTokenStore
from airflow_provider_bos.exceptions import BosConfigurationError

pytestmark = pytest.mark.snowflake


def test_snowflake_is_not_a_token_store(snowflake_url: str) -> None:  # noqa: F811
    with pytest.raises(BosConfigurationError, match="SQLite, PostgreSQL or MySQL/MariaDB") as raised:
        SqlTokenStore(snowflake_url)
    assert "snow" not in str(raised.value).replace("'snowflake'", "")  # no URL, no password in the message

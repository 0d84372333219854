"""Duplicate record_refs whose copy arrives as a claim, on Snowflake: the suite of every other dialect
(imported, so it cannot drift apart), run against fakesnow."""

from __future__ import annotations

import pytest
from fakesnow_support import fakesnow_server, snowflake_url  # noqa: F401 - fixtures

from tests.warehouse.test_duplicate_claims_e2e import *  # noqa: F403 - the shared suite runs again on this destination

pytestmark = pytest.mark.snowflake


@pytest.fixture()
def warehouse_url(snowflake_url: str) -> str:  # noqa: F811
    return snowflake_url

"""A restarted final frame on Snowflake (no savepoints: the staging tables are emptied instead).

The suite every dialect runs (imported), with ``warehouse_url`` on the fakesnow server.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
import test_frame_restart as restart_suite
from fakesnow_support import fakesnow_server, snowflake_url  # noqa: F401 - fixtures
from test_frame_restart import *  # noqa: F403 - the shared suite runs again on this destination
from test_snowflake_lifecycle import _sql_reads  # noqa: F401 - fixture: the provenance checks read in SQL

pytestmark = pytest.mark.snowflake


@pytest.fixture()
def warehouse_url(snowflake_url: str) -> str:  # noqa: F811
    return snowflake_url


def _dump(engine: sa.Engine, table: str, schema: str | None = None) -> list[tuple[str, ...]]:
    # Plain SQL: fakesnow cannot answer snowflake-sqlalchemy's reflection of a busy schema.
    name = f"{schema}.{table}" if schema else table
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(f"SELECT * FROM {name} ORDER BY record_ref")
        return [tuple(repr(v) for v in row) for row in rows]


@pytest.fixture(autouse=True)
def _sql_dump(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(restart_suite, "dump", _dump)

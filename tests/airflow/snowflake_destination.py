"""Fixtures that make an end-to-end suite's destination Snowflake: a Connection of type ``snowflake``
on the fakesnow server, reached through SnowflakeHook. A module that imports a suite's tests imports
these too (their names, so pytest finds them there)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "warehouse"))
from fakesnow_support import fakesnow_server, snowflake_connection_json, snowflake_url

__all__ = ["fakesnow_server", "snowflake_url", "snowflake_warehouse_connection", "warehouse_url"]


@pytest.fixture()
def warehouse_url(snowflake_url: str) -> str:
    return snowflake_url


@pytest.fixture(autouse=True)
def snowflake_warehouse_connection(bos_airflow: dict[str, Any], fakesnow_server: dict[str, Any],
                                   monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The DAGs' warehouse Connection (``bos_warehouse``) points at the fakesnow server."""
    monkeypatch.setenv("AIRFLOW_CONN_BOS_WAREHOUSE", json.dumps(snowflake_connection_json(fakesnow_server)))
    yield  # noqa: PT022 - monkeypatch undoes it at teardown

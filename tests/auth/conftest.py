"""Fixtures shared by the grant tests: a SQLite token store and the reference server's token endpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_bos.auth.discovery import discover
from airflow_provider_bos.auth.token_store import SqlTokenStore


@pytest.fixture()
def store(tmp_path: Path):
    store = SqlTokenStore(f"sqlite:///{tmp_path / 'tokens.db'}")
    yield store
    store.dispose()


@pytest.fixture()
def token_endpoint(bos_server) -> str:
    return discover(bos_server.mcp_url).token_endpoint

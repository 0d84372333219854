"""Airflow's own API app, built in this process with the BOS plugin, for the page's security tests.

``build_page(all_admins=...)`` returns a Starlette TestClient over ``airflow.api_fastapi.app.create_app``
(the app ``airflow api-server`` serves), with SimpleAuthManager in all-admins mode or with password
users ``admin`` (Admin) and ``viewer`` (Viewer).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

USERS = {"admin": "admin", "viewer": "viewer"}
BASE_URL = "http://localhost:8080"  # loopback: the callback may be plain http
API_SECRET_KEY = "bos-ui-test-api-secret-key"  # [api] secret_key: the page's CSRF tokens derive from it
ORIGIN = {"Origin": BASE_URL}  # the header a same-origin POST from the page carries


@contextmanager
def build_page(tmp: Path, *, all_admins: bool) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    passwords = tmp / "passwords.json"
    passwords.write_text(json.dumps(USERS))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", str(all_admins))
        patch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,viewer:viewer")
        patch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(passwords))
        patch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "bos-page-test-jwt-secret-0123456789abcdef0123456789")
        patch.setenv("AIRFLOW__API__SECRET_KEY", API_SECRET_KEY)
        patch.setenv("AIRFLOW__API__BASE_URL", BASE_URL)
        patch.setenv("_AIRFLOW_PROCESS_CONTEXT", "server")  # what `airflow api-server` sets: DB connections
        from airflow.api_fastapi.app import create_app

        # The auth manager is a process-wide singleton; each app gets its own middlewares
        # (all-admins mode adds one that signs every request in).
        client = TestClient(create_app(apps="core"), base_url=BASE_URL)
        try:
            yield client
        finally:
            client.close()


def bearer(client: Any, user: str) -> dict[str, str]:
    response = client.post("/auth/token", json={"username": user, "password": USERS[user]})
    response.raise_for_status()
    return {"Authorization": f"Bearer {response.json()['access_token']}"}


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, html[:2000]
    return match.group(1)


def add_connection(conn_id: str, **fields: Any) -> None:
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    extra = fields.pop("extra", None)
    with create_session() as session:
        session.execute(sa.delete(Connection).where(Connection.conn_id == conn_id))
        session.add(Connection(conn_id=conn_id, extra=json.dumps(extra) if extra else None, **fields))


def delete_connections(*conn_ids: str) -> None:
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    with create_session() as session:
        session.execute(sa.delete(Connection).where(Connection.conn_id.in_(conn_ids)))

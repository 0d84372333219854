"""Airflow's side of the BOS page: ``bos`` Connections in the metadata database and their token stores.

A connected Connection is written from the CLI's own :func:`~airflow_provider_bos.cli.connection_document`
minus the secret: the token store row is the source of truth, so the password is cleared (a stale
refresh token left there would re-seed the row with a rotated, dead token). The page opens token
stores through :mod:`.stores`, never as the CLI does.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_bos.auth.connect import ConnectOutcome
from airflow_provider_bos.cli import connection_document, save_bos_connection
from airflow_provider_bos.hooks.bos import extra_of, resource_url_of
from airflow_provider_bos.plugins.pending import ConnectTarget

__all__ = ["bos_connections", "extra_of", "save_connected", "target_of", "token_store_label"]


def bos_connections() -> list[Any]:
    """Every ``bos`` Connection in the metadata database, by conn_id."""
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(Connection).where(Connection.conn_type == "bos").order_by(Connection.conn_id)
        ).all()
        session.expunge_all()
    return list(rows)


def find_connection(conn_id: str) -> Any | None:
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        conn = session.scalars(select(Connection).where(Connection.conn_id == conn_id)).one_or_none()
        if conn is not None:
            session.expunge(conn)
    return conn


def target_of(conn: Any) -> ConnectTarget:
    extra = extra_of(conn)
    return ConnectTarget(
        conn_id=conn.conn_id,
        resource_url=resource_url_of(conn),  # as the hook reads it (the URI form too)
        token_store_conn_id=extra.get("token_store_conn_id"),
        token_store_url=extra.get("token_store_url"),
    )


def token_store_label(target: ConnectTarget) -> str:
    if target.token_store_conn_id:
        return f"Airflow connection {target.token_store_conn_id!r}"
    return (
        "SQL URL from the Connection" if target.token_store_url else "default SQLite file under AIRFLOW_HOME"
    )


def save_connected(target: ConnectTarget, outcome: ConnectOutcome) -> None:
    """Create or update the ``bos`` Connection for a finished sign-in, with no secret in it."""
    document = connection_document(
        outcome, token_store_url=None, token_store_conn_id=target.token_store_conn_id, show_secrets=False
    )
    ours = dict(document["extra"])
    if target.token_store_url:
        ours["token_store_url"] = target.token_store_url  # as configured, not the printable form
    save_bos_connection(target.conn_id, conn_type=document["conn_type"], host=document["host"], extra=ours)

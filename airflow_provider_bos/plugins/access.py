"""Who may do what on the BOS page: Airflow's auth manager, asked per connection id.

A route's generic dependency (may the user edit *some* Connection?) is not enough: a custom auth
manager can grant per connection id, so every Connection the page lists, probes, connects or
checks is authorized by its own id, and so is every token-store connection it opens.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.plugins.pending import ConnectTarget
from airflow_provider_bos.plugins.stores import require_store_allowed

__all__ = ["check_token_store", "is_authorized"]


def is_authorized(user: Any, conn_id: str, method: str) -> bool:
    """May ``user`` do ``method`` (``GET`` read, ``PUT`` edit, ``POST`` create) on Connection ``conn_id``?"""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import ConnectionDetails

    return bool(
        get_auth_manager().is_authorized_connection(
            method=method,  # type: ignore[arg-type]
            details=ConnectionDetails(conn_id=conn_id),
            user=user,
        )
    )


def check_token_store(user: Any, target: ConnectTarget) -> None:
    """Refuse a token store ``user`` may not use, before it is opened.

    The operator's gate first (:func:`.stores.require_store_allowed`: the default SQLite store, a
    connection listed in ``[bos] token_store_conn_ids``, anything else only with ``[bos]
    allow_token_store_urls``); then a store named by an Airflow connection needs the user's read
    access to that connection (its credentials are what the page would use).
    """
    require_store_allowed(target)
    if target.token_store_conn_id and not is_authorized(user, target.token_store_conn_id, "GET"):
        raise BosConfigurationError(
            f"You may not use the token store connection {target.token_store_conn_id!r} (Airflow's "
            "auth manager does not let you read it); ask an admin for access or name another one."
        )

"""What the BOS page shows about one Connection's grant: facts from the token store row, never a token.

The row says when the grant was connected or last refreshed, its generation and access-token
expiry. Whether BOS still honours it only a request can tell (a revoked grant looks like any other
row): :func:`grant_status` takes the outcome of such a probe, made by the caller through the same
hook a task uses.

What it shows of a token store's failure is :func:`store_error_text`: the page's own refusals and
the store's own findings (a row sealed for another row, a row of the earlier format), never a
database driver's text: the store is a database the Connection's editor may have chosen, and the
driver's answer (refused, timed out, not PostgreSQL...) would tell them what listens where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_provider_bos.auth.sealed import LegacyTokenError
from airflow_provider_bos.exceptions import (
    BosConfigurationError,
    BosError,
    BosReconnectRequired,
    BosTokenBindingError,
    BosTokenStoreError,
)

__all__ = [
    "API_KEY_MODE",
    "CONNECTED",
    "NOT_CONNECTED",
    "NOT_PROBED",
    "RECONNECT_NEEDED",
    "UNAVAILABLE",
    "STORE_UNREADABLE",
    "GrantStatus",
    "grant_status",
    "store_error_text",
]

CONNECTED = "connected"
NOT_CONNECTED = "not connected"
RECONNECT_NEEDED = "reconnect needed"
API_KEY_MODE = "API key mode"
UNAVAILABLE = "check failed"
STORE_UNREADABLE = "The token store could not be read; the API server's log has the details."
NOT_PROBED = (
    "From the token store only: the page checks grants with BOS when Airflow's [core] test_connection "
    "is Enabled."
)


def store_error_text(exc: BaseException) -> str:
    """What the page shows of a token store's failure (see the module docstring)."""
    if isinstance(exc, (BosTokenBindingError, LegacyTokenError)):
        return str(exc)
    if isinstance(exc, BosConfigurationError):  # the page's own refusals (gates, host policy, settings)
        return str(exc)
    return STORE_UNREADABLE


@dataclass(frozen=True)
class GrantStatus:
    """One row of the page. Only non-secret columns of the store row are ever copied here."""

    conn_id: str
    resource: str
    state: str
    detail: str = ""
    client_id: str | None = None
    generation: int | None = None
    expires_at: float | None = None
    last_refresh: float | None = None
    scope: str | None = None
    token_store: str = ""


def grant_status(
    conn_id: str,
    resource: str,
    *,
    auth_type: str,
    row: dict[str, Any] | None,
    token_store: str,
    probe_error: BaseException | None = None,
    store_error: BaseException | None = None,
    probed: bool = True,
) -> GrantStatus:
    """Combine the Connection, its raw token store row and the probe's outcome (``None``: it worked;
    ``probed=False``: no probe was made, the state is the row's alone)."""
    if auth_type == "api_key":
        return GrantStatus(conn_id, resource, API_KEY_MODE, "The Connection holds a BOS identity API key.")
    if store_error is not None:
        detail = store_error_text(store_error)
        return GrantStatus(
            conn_id, resource, UNAVAILABLE, f"Token store unreadable: {detail}", token_store=token_store
        )
    if row is None:
        return GrantStatus(
            conn_id, resource, NOT_CONNECTED, "No grant in the token store yet.", token_store=token_store
        )
    facts: dict[str, Any] = {  # the row's columns, typed by the store
        "client_id": row.get("client_id"),
        "generation": row.get("generation"),
        "expires_at": row.get("expires_at"),
        "last_refresh": row.get("updated_at"),
        "scope": row.get("scope"),
        "token_store": token_store,
    }
    if row.get("refresh_token") is None:
        return GrantStatus(
            conn_id, resource, RECONNECT_NEEDED, "The stored grant has no refresh token.", **facts
        )
    if isinstance(probe_error, BosReconnectRequired):
        return GrantStatus(
            conn_id,
            resource,
            RECONNECT_NEEDED,
            "BOS no longer accepts this grant (revoked or expired).",
            **facts,
        )
    if probe_error is not None:
        if isinstance(probe_error, BosTokenStoreError):  # the probe opens the store too
            detail = store_error_text(probe_error)
        else:
            detail = str(probe_error) if isinstance(probe_error, BosError) else type(probe_error).__name__
        return GrantStatus(conn_id, resource, UNAVAILABLE, detail, **facts)
    if not probed:
        return GrantStatus(conn_id, resource, CONNECTED, NOT_PROBED, **facts)
    return GrantStatus(conn_id, resource, CONNECTED, "", **facts)

"""The Airflow settings the BOS page obeys (read on every request, so a changed setting applies at once).

- ``[core] test_connection`` (Airflow's own, default ``Disabled``): the page's live probe and its
  Check button, which make the API server call the Connection's endpoint, run only when it is
  ``Enabled``, as Airflow's own connection test does. ``Hidden`` also hides the Check button.
- ``[bos] allowed_hosts``: see :mod:`.outbound`.
- ``[bos] token_store_conn_ids`` (default empty): the Airflow connections (ids, comma- or
  space-separated) the page may open as a token store, when a ``bos`` Connection names one
  (``token_store_conn_id``) and the user may read it. Any other id is refused: whoever may create
  Connections could otherwise create one pointing at any file or database and name it.
- ``[bos] allow_token_store_urls`` (default ``False``): whether the page may open a token store
  the operator did not list: one given as a SQL URL in a Connection's extra (``token_store_url``),
  or named by a connection not in ``token_store_conn_ids``. Either is any database the
  Connection's editor chose; by default only the default SQLite store and the listed connections
  are opened (:mod:`.stores`).
"""

from __future__ import annotations

from airflow_provider_bos.plugins.outbound import OutboundPolicy

__all__ = [
    "TEST_CONNECTION_DISABLED",
    "allowed_token_store_conn_ids",
    "TEST_CONNECTION_ENABLED",
    "TEST_CONNECTION_HIDDEN",
    "outbound_policy",
    "test_connection_mode",
    "token_store_urls_allowed",
]

TEST_CONNECTION_ENABLED = "enabled"
TEST_CONNECTION_DISABLED = "disabled"
TEST_CONNECTION_HIDDEN = "hidden"


def test_connection_mode() -> str:
    """``enabled``, ``disabled`` or ``hidden``; anything else counts as disabled (as in Airflow)."""
    from airflow.configuration import conf

    value = (conf.get("core", "test_connection", fallback="Disabled") or "").strip().lower()
    return value if value in (TEST_CONNECTION_ENABLED, TEST_CONNECTION_HIDDEN) else TEST_CONNECTION_DISABLED


def outbound_policy() -> OutboundPolicy:
    from airflow.configuration import conf

    return OutboundPolicy.from_setting(conf.get("bos", "allowed_hosts", fallback=""))


def token_store_urls_allowed() -> bool:
    from airflow.configuration import conf

    return conf.getboolean("bos", "allow_token_store_urls", fallback=False)


def allowed_token_store_conn_ids() -> frozenset[str]:
    """``[bos] token_store_conn_ids``: the connection ids the page may open as token stores."""
    from airflow.configuration import conf

    value = conf.get("bos", "token_store_conn_ids", fallback="") or ""
    return frozenset(item for item in value.replace(",", " ").split() if item)

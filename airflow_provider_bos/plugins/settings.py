"""The Airflow settings the BOS page obeys (read on every request, so a changed setting applies at once).

- ``[core] test_connection`` (Airflow's own, default ``Disabled``): the page's live probe and its
  Check button, which make the API server call the Connection's endpoint, run only when it is
  ``Enabled``, as Airflow's own connection test does. ``Hidden`` also hides the Check button.
- ``[bos] allowed_hosts``: see :mod:`.outbound`.
- ``[bos] allow_token_store_urls`` (default ``False``): whether the page may open a token store
  given as a SQL URL in a Connection's extra (``token_store_url``). Such a URL is any database the
  Connection's editor chose; by default only the default SQLite store and stores named by an Airflow
  connection the user may read are opened.
"""

from __future__ import annotations

from airflow_provider_bos.plugins.outbound import OutboundPolicy

__all__ = [
    "TEST_CONNECTION_DISABLED",
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

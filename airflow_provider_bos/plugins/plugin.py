"""The Airflow plugin: the BOS FastAPI app mounted in the API server, and its Admin menu entry."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_bos.plugins.app import URL_PREFIX, create_app

__all__ = ["BosUiPlugin"]


class BosUiPlugin(AirflowPlugin):
    """Admin -> BOS: every ``bos`` Connection's grant, with Connect / Reconnect / Check; Admin -> Sync health:
    the runs of every table BOS syncs write."""

    name = "bos"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "BOS connections"}]  # noqa: RUF012 - AirflowPlugin's attribute
    # No url_route: the Admin menu then opens the page in its own tab instead of Airflow's sandboxed
    # iframe, which forbids the top-level navigation an OAuth sign-in needs.
    # Admin -> Sync health: every table BOS syncs write, for users who may read the DAGs writing it. Its
    # name does not contain "BOS": a menu item is found by its name, and "BOS" would then name two.
    external_views = [  # noqa: RUF012 - AirflowPlugin's attribute
        {"name": "BOS", "href": f"{URL_PREFIX}/", "destination": "nav", "category": "admin"},
        {"name": "Sync health", "href": f"{URL_PREFIX}/health/", "destination": "nav", "category": "admin"},
    ]

"""The sync-health page's routes, on the BOS plugin's FastAPI app (mounted at ``/bos``).

- ``GET /health/?window=7|30|90``: every destination the user may see (HTML); ``GET /health/api``: the same as JSON.
- ``GET /health/tables/{key}``: one destination's charts (HTML); ``GET /health/api/tables/{key}``: JSON.
- ``GET /health/tables/{key}/runs/{run_id}``: one run in words (HTML); ``GET /health/api/tables/{key}/runs/{run_id}``.

Every route needs a signed-in user (Airflow's auth manager; a browser without a session is sent to
the login) and shows only what :mod:`.health_access` lets that user see: a destination or run the
user may not see answers 404, as one that does not exist. Responses are never cached, never framed,
and run no script (:func:`.health_pages.health_policy`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import HTMLResponse, JSONResponse

from airflow_provider_bos.plugins.health_access import Viewer
from airflow_provider_bos.plugins.health_discovery import configured_destinations, load_dags
from airflow_provider_bos.plugins.health_pages import (
    Links,
    health_policy,
    overview_page,
    run_page,
    table_page,
)
from airflow_provider_bos.plugins.health_queries import WINDOWS, Window
from airflow_provider_bos.plugins.health_schedule import grace
from airflow_provider_bos.plugins.health_views import HealthService, TableView

__all__ = ["health_router"]

_NO_TABLE = "No such destination table, or you may not see it."
_NO_RUN = "No such run of this table, or you may not see it."


def _days(window: int) -> int:
    if window not in WINDOWS:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"window is one of {', '.join(map(str, WINDOWS))} (days).")
    return window


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _html(content: str) -> HTMLResponse:
    return HTMLResponse(content, headers={"Cache-Control": "no-store", "Content-Security-Policy": health_policy()})


def _json(content: Any) -> JSONResponse:
    return JSONResponse(_jsonable(content), headers={"Cache-Control": "no-store"})


def health_router(url_prefix: str) -> APIRouter:
    """The routes, for the app mounted at ``url_prefix`` (the Airflow UI's root is the mount's parent)."""
    router = APIRouter(prefix="/health")

    def links(request: Request, days: int) -> Links:
        root = str(request.scope.get("root_path", "")).rstrip("/")
        ui_base = root[: -len(url_prefix)] if url_prefix and root.endswith(url_prefix) else ""
        return Links(root + "/", ui_base, days)

    def service(user: Any) -> HealthService:
        return HealthService(load_dags(), configured_destinations(), viewer=Viewer.of(user), max_grace=grace())

    def one_table(user: Any, key: str, days: int, *, full: bool = True) -> tuple[HealthService, TableView]:
        health = service(user)
        destination = health.find(key)
        if destination is None:
            health.close()
            raise HTTPException(status.HTTP_404_NOT_FOUND, _NO_TABLE)
        return health, health.table(destination, Window(days, health.now), full=full)

    @router.get("/", response_class=HTMLResponse)
    def overview(request: Request, user: GetUserDep, window: int = 7) -> HTMLResponse:
        days = _days(window)
        with service(user) as health:
            views = health.overview(Window(days, health.now))
            return _html(overview_page(views, window=Window(days, health.now), links=links(request, days),
                                       unlocatable=health.unlocatable()))

    @router.get("/api")
    def overview_json(user: GetUserDep, window: int = 7) -> JSONResponse:
        days = _days(window)
        with service(user) as health:
            views = health.overview(Window(days, health.now))
            return _json({"window": days, "destinations": [v.as_json() for v in views],
                          "unlocatable": [{"dag_id": d, "task_id": t} for d, t in health.unlocatable()]})

    @router.get("/tables/{key}", response_class=HTMLResponse)
    def table(request: Request, key: str, user: GetUserDep, window: int = 7) -> HTMLResponse:
        days = _days(window)
        health, view = one_table(user, key, days)
        with health:
            return _html(table_page(view, window=Window(days, health.now), links=links(request, days)))

    @router.get("/api/tables/{key}")
    def table_json(key: str, user: GetUserDep, window: int = 7) -> JSONResponse:
        health, view = one_table(user, key, _days(window))
        with health:
            return _json(view.as_json())

    def one_run(user: Any, key: str, run_id: str) -> tuple[TableView, dict[str, Any]]:
        with service(user) as health:
            destination = health.find(key)
            if destination is None:
                raise HTTPException(status.HTTP_404_NOT_FOUND, _NO_TABLE)
            view = TableView(destination, writers=destination.writers)
            try:
                run = health.run(destination, run_id)
            except Exception as exc:  # noqa: BLE001 - an unreadable destination is shown as such
                view.error = health.failure_text(destination, exc)
                run = None
            if run is None:
                raise HTTPException(status.HTTP_404_NOT_FOUND, view.error or _NO_RUN)
            return view, run

    @router.get("/tables/{key}/runs/{run_id}", response_class=HTMLResponse)
    def run(request: Request, key: str, run_id: str, user: GetUserDep, window: int = 7) -> HTMLResponse:
        view, found = one_run(user, key, run_id)
        return _html(run_page(view, found, links=links(request, _days(window))))

    @router.get("/api/tables/{key}/runs/{run_id}")
    def run_json(key: str, run_id: str, user: GetUserDep) -> JSONResponse:
        _view, found = one_run(user, key, run_id)
        return _json(found)

    return router

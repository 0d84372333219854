"""What the page shows for each kind of grant, and how Airflow finds the plugin."""

from __future__ import annotations

import tomllib
from pathlib import Path

from airflow_provider_bos.exceptions import BosReconnectRequired, BosTokenStoreError, BosTransportError
from airflow_provider_bos.get_provider_info import get_provider_info
from airflow_provider_bos.plugins.grant_status import grant_status

ROW = {
    "client_id": "c1",
    "generation": 3,
    "expires_at": 1.0,
    "updated_at": 2.0,
    "scope": "mcp:tools",
    "refresh_token": "enc:v1:ciphertext",
    "access_token": "enc:v1:ciphertext",
}


def _state(**kwargs) -> str:
    return grant_status("bos_x", "https://bos.example/mcp", token_store="default", **kwargs).state


def test_each_grant_state() -> None:
    assert _state(auth_type="api_key", row=None) == "API key mode"
    assert _state(auth_type="oauth", row=None) == "not connected"
    assert _state(auth_type="oauth", row=ROW) == "connected"
    assert _state(auth_type="oauth", row={**ROW, "refresh_token": None}) == "reconnect needed"
    assert (
        _state(auth_type="oauth", row=ROW, probe_error=BosReconnectRequired("revoked")) == "reconnect needed"
    )
    assert _state(auth_type="oauth", row=ROW, probe_error=BosTransportError("down")) == "check failed"
    assert _state(auth_type="oauth", row=None, store_error=BosTokenStoreError("locked")) == "check failed"


def test_the_status_copies_no_token_column() -> None:
    status = grant_status(
        "bos_x", "https://bos.example/mcp", auth_type="oauth", row=ROW, token_store="default"
    )
    assert (status.generation, status.last_refresh, status.expires_at, status.client_id) == (
        3,
        2.0,
        1.0,
        "c1",
    )
    assert "ciphertext" not in repr(status)


def test_the_plugin_is_registered_by_provider_info_and_entry_point_alike() -> None:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    entry_point = pyproject["project"]["entry-points"]["airflow.plugins"]["bos"]
    [plugin] = get_provider_info()["plugins"]
    assert plugin["plugin-class"] == entry_point.replace(":", ".")
    assert get_provider_info()["package-name"] == pyproject["project"]["name"]

    from airflow_provider_bos.plugins.plugin import BosUiPlugin

    [app] = BosUiPlugin.fastapi_apps
    view, health_view = BosUiPlugin.external_views
    assert health_view["href"].startswith("/bos/")  # the sync-health page, beside the BOS page
    assert app["url_prefix"] == "/bos" and view["href"] == "/bos/" and view["category"] == "admin"
    assert "url_route" not in view  # its own tab: Airflow's plugin iframe forbids a top-level sign-in

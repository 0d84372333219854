"""The shipped BOS reference server and pytest helpers (``pip install airflow-provider-bos[server]``).

    from airflow_provider_bos.testing import BosReferenceServer
    with BosReferenceServer(scenario="partial") as server:
        print(server.mcp_url)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["BosReferenceServer", "Scenario", "load_scenario"]

if TYPE_CHECKING:
    from airflow_provider_bos.testing.scenario import Scenario, load_scenario
    from airflow_provider_bos.testing.server import BosReferenceServer


def __getattr__(name: str) -> Any:
    # Lazy: importing the package (e.g. for the scenario models) must not require the server extras.
    if name == "BosReferenceServer":
        from airflow_provider_bos.testing.server import BosReferenceServer

        return BosReferenceServer
    if name in ("Scenario", "load_scenario"):
        from airflow_provider_bos.testing import scenario

        return getattr(scenario, name)
    raise AttributeError(name)

"""pytest fixtures for the BOS reference server: ``bos_server`` and ``bos_server_factory``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from airflow_provider_bos.testing.server import BosReferenceServer


@pytest.fixture()
def bos_server_factory() -> Iterator[Callable[..., BosReferenceServer]]:
    """A callable ``(**kwargs) -> started BosReferenceServer``; every server is stopped at teardown."""
    from airflow_provider_bos.testing.server import BosReferenceServer

    started: list[BosReferenceServer] = []

    def factory(**kwargs: Any) -> BosReferenceServer:
        server = BosReferenceServer(**kwargs)
        server.start()
        started.append(server)
        return server

    try:
        yield factory
    finally:
        for server in reversed(started):
            server.stop()


@pytest.fixture()
def bos_server(bos_server_factory: Callable[..., BosReferenceServer]) -> BosReferenceServer:
    """A started reference server on a free loopback port, scenario ``complete``."""
    return bos_server_factory(scenario="complete")

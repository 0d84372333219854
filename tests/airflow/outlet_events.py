"""``outlet_events`` as a task gets it, for tests that call ``execute`` directly: keyed by the alias's
name (an ``AssetAlias`` is not hashable on Airflow 3.1), each alias collecting the assets added to it."""

from __future__ import annotations

from collections import defaultdict
from typing import Any


class AliasEvents:
    def __init__(self) -> None:
        self.added: list[tuple[Any, dict]] = []

    def add(self, asset: Any, extra: dict | None = None) -> None:
        self.added.append((asset, extra or {}))


class OutletEvents(defaultdict[Any, AliasEvents]):
    def __init__(self) -> None:
        super().__init__(AliasEvents)

    def __getitem__(self, key: Any) -> AliasEvents:
        return super().__getitem__(getattr(key, "name", key))

"""The load strategies by name: a dialect's ``load_strategy`` picks how its rows travel.

Kept apart from :mod:`.loads` and :mod:`.file_load` (which implement them) so a new strategy is one
module and one line here, never a branch inside another strategy.
"""

from __future__ import annotations

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse.dialects import WarehouseDialect
from airflow_provider_bos.warehouse.file_load import FILE_LOAD
from airflow_provider_bos.warehouse.loads import COPY_LOAD, ROWS_LOAD, LoadStrategy

__all__ = ["LOAD_STRATEGIES", "strategy_for"]

LOAD_STRATEGIES: dict[str, LoadStrategy] = {
    "copy": COPY_LOAD,
    "executemany": ROWS_LOAD,
    "staged_file": FILE_LOAD,
}


def strategy_for(dialect: WarehouseDialect) -> LoadStrategy:
    """The strategy ``dialect.load_strategy`` names."""
    try:
        return LOAD_STRATEGIES[dialect.load_strategy]
    except KeyError:  # pragma: no cover - a dialect naming a strategy nobody registered
        raise BosWarehouseError(f"No load strategy {dialect.load_strategy!r} (dialect {dialect.name}).") from None

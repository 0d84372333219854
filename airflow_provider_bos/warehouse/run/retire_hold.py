"""``on_retire_guard="ask"``: a complete full read's retirements past ``max_retire_fraction`` held, not done.

The read lands its inserts and updates as any complete read; the rows it would retire stay current
and their refs go to ``<table>_pending_retirements`` under the run's id, with its scope, read time
and the scope's current rows. A person then approves (the held refs are retired, if no newer read
wrote the table since) or rejects (nothing is retired): :mod:`~..upkeep.retirements`. Every
complete full read of the scope forgets what earlier runs of it held (:func:`forget_older_holds`):
it is the newer read, and decided instead (a late decision on an older hold says so).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from airflow_provider_bos.warehouse.dialects import retirements as sql
from airflow_provider_bos.warehouse.run.audit_fields import with_note
from airflow_provider_bos.warehouse.run.transaction import RunTransaction
from airflow_provider_bos.warehouse.tables.companions import PENDING_RETIREMENTS

__all__ = ["forget_older_holds", "hold_retirements"]

log = logging.getLogger(__name__)


def hold_retirements(tx: RunTransaction, audit: dict[str, Any], retired: str, *, scope: str, count: int,
                     current: int, limit: float, read_at: datetime, held_at: datetime) -> dict[str, Any]:
    """Hold the ``count`` refs of the work table ``retired`` for a decision; the audit fields with a
    note saying so (the status stays: the read was complete, and retired nothing yet)."""
    d = tx.dialect
    pending = PENDING_RETIREMENTS.name(tx.table)
    tx.exec(sql.hold(d, pending, retired, tx.schema, run_id=tx.run_id, scope=scope, read_at=read_at,
                     held_at=held_at))
    tx.exec(sql.set_scope_rows(d, pending, tx.schema, run_id=tx.run_id, rows=current))
    where = f"{tx.schema}.{pending}" if tx.schema else pending
    note = (
        f"Retirement held for approval: this complete full read did not return {count} of its scope's {current} "
        f"current rows ({count / max(current, 1):.0%}), more than max_retire_fraction={limit:g}; they stay "
        f"current and are listed in {where} under this run's id until a person approves (they are "
        "retired then, unless a newer read wrote the table since) or rejects (nothing is retired)."
    )
    log.warning("BOS run %s: %s", tx.run_id, note)
    return with_note(audit, note)


def forget_older_holds(tx: RunTransaction, scope: str) -> None:
    """Drop what earlier runs of ``scope`` held: this complete full read decided for the scope since."""
    pending = PENDING_RETIREMENTS.name(tx.table)
    tx.exec(sql.drop_older_holds(tx.dialect, pending, tx.schema, scope=scope, run_id=tx.run_id))

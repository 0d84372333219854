"""``history=True``: every version of every record in ``<table>_history``, SCD2 style.

A second target of the same run, in its transaction, after the merge and the retirements (as dlt's
``scd2`` strategy retires and inserts versions after its merge): every row this run wrote, retired
or superseded has its open version closed (``_bos_valid_to`` set); every one of them still current
gets a new open version (``_bos_valid_from`` the run's time, ``_bos_valid_to`` NULL). A row the run
did not touch (unchanged) adds nothing. The rows a run touched are the ones carrying its
``_bos_run_id``: the merge and the retirements set it.

The first run with ``history=True`` on a table that already holds rows first gives each current
row a version valid from that row's ``_bos_synced_at`` (:func:`seed_history`, under the writers'
lock, before any record is loaded): history starts there.

Versions carry the run's promoted attribute columns too (``RunTransaction.carried_columns``).
"""

from __future__ import annotations

from datetime import datetime

from airflow_provider_bos.warehouse.run.transaction import RunTransaction

__all__ = ["record_history", "seed_history"]


def seed_history(tx: RunTransaction, history: str) -> None:
    """If ``history`` is empty, a first version of every current row (before this run changes any)."""
    d = tx.dialect
    if tx.exec(d.probe_empty(d.table_ref(history, tx.schema))).first() is None:
        tx.lock()  # the rows seeded are the rows the merge then compares with
        tx.exec(d.history_seed(history, tx.table, tx.schema, tx.carried_columns))


def record_history(tx: RunTransaction, history: str, *, run_id: str, at: datetime, touched: bool) -> None:
    """Close and open the versions of the rows this run touched (``touched``: any at all)."""
    d = tx.dialect
    if not touched:
        return
    tx.exec(d.history_close(history, tx.table, tx.schema, run_id=run_id, closed_at=at))
    tx.exec(d.history_open(history, tx.table, tx.schema, run_id=run_id, opened_at=at, carried=tx.carried_columns))

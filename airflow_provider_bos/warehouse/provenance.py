"""``<table>_sources``: one row per provenance entry, kept beside the records table in the run's transaction.

Analysts join it instead of unnesting the ``sources`` JSON, and supersession finds the current
record holding an entry with one index look-up (see :meth:`~.dialects.lifecycle.LifecycleSql.collect_others`).

The rows a run wrote (inserted, updated, brought back: the ones carrying its ``_bos_run_id`` after
the merge) have their entries deleted and written anew from their stored ``sources``, before
supersession reads them; a run that wrote nothing touches nothing (an entry holds no observation
time, so a re-stamped read changes none). Retiring or superseding a row marks its entries not
current (deletes them with ``deletions="hard"``); erasure deletes them; ``pii-apply`` writes them
anew from the re-written JSON.

A records table stored before its provenance table gets it built from its ``sources`` column, in
SQL, by the first run (:func:`seed_provenance`, under the writers' lock, before any record is loaded).
"""

from __future__ import annotations

from airflow_provider_bos.warehouse.transaction import RunTransaction

__all__ = ["rebuild_provenance", "record_provenance", "seed_provenance"]


def seed_provenance(tx: RunTransaction, sources: str) -> None:
    """If ``sources`` is empty and the records table is not, the entries of every row (before this
    run changes any). Every record has at least one entry, so a filled table is never seeded twice."""
    d = tx.dialect
    probe = d.probe_empty(d.table_ref(sources, tx.schema))
    if tx.exec(probe).first() is not None or tx.target_is_empty():
        return
    tx.lock()  # the rows expanded are the rows the merge then compares with
    # Looked at again under the lock: a writer that held it may have filled both tables meanwhile.
    if tx.exec(probe).first() is None:
        tx.exec(d.write_provenance(sources, tx.table, tx.schema, run_id=None))


def record_provenance(tx: RunTransaction, sources: str, *, fresh: bool, touched: bool) -> None:
    """Write anew the entries of the rows this run wrote (``touched``: any at all; ``fresh``: the
    records table held no row before this run, so any entry left is of rows deleted by hand)."""
    if not touched:
        return
    d = tx.dialect
    if fresh:
        tx.exec(d.delete_all(sources, tx.schema))
    else:
        tx.exec(d.clear_provenance(sources, tx.table, tx.schema, run_id=tx.run_id))
    tx.exec(d.write_provenance(sources, tx.table, tx.schema, run_id=tx.run_id))


def rebuild_provenance(tx: RunTransaction, sources: str) -> None:
    """Every entry written anew from the stored ``sources`` (after a change to them in place)."""
    d = tx.dialect
    tx.exec(d.delete_all(sources, tx.schema))
    tx.exec(d.write_provenance(sources, tx.table, tx.schema, run_id=None))

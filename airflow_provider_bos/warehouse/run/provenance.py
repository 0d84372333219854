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

from airflow_provider_bos.warehouse.run.transaction import RunTransaction, UpsertCounts

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


def record_provenance(tx: RunTransaction, sources: str, *, direct: bool, counts: UpsertCounts) -> None:
    """Write anew the entries of the rows this run wrote (``direct``: it loaded an empty table directly).

    When every row of the records table is one this run wrote (a first run, or a run that rewrote
    them all), all entries go at once instead of the written rows' one by one; any entry left of a
    row deleted by hand goes with them.
    """
    if not counts.inserted + counts.updated:
        return
    d = tx.dialect
    if direct or _every_row_is_the_runs(tx, counts):
        tx.exec(d.delete_all(sources, tx.schema))
    else:
        tx.exec(d.clear_provenance(sources, tx.table, tx.schema, run_id=tx.run_id))
    tx.exec(d.write_provenance(sources, tx.table, tx.schema, run_id=tx.run_id))


def _every_row_is_the_runs(tx: RunTransaction, counts: UpsertCounts) -> bool:
    """Whether every row of the records table carries this run's id (after the merge, under the lock)."""
    if counts.unchanged:  # a row left unchanged keeps the run that wrote it: no need to look
        return False
    return tx.exec(tx.dialect.probe_other_rows(tx.table, tx.schema, run_id=tx.run_id)).first() is None


def rebuild_provenance(tx: RunTransaction, sources: str) -> None:
    """Every entry written anew from the stored ``sources`` (after a change to them in place)."""
    d = tx.dialect
    tx.exec(d.delete_all(sources, tx.schema))
    tx.exec(d.write_provenance(sources, tx.table, tx.schema, run_id=None))

"""Coverage: how many of a run's rows had a value in each watched column (the audit row's ``coverage``).

``{"records": N, "columns": {"display_name": n1, "email": n2, "phone": n3, ...}}``: ``N`` current
rows whose record_ref the run returned, ``n`` of them with a value in the column (not NULL, not the
empty string). A field a source stopped sending shows as a falling ratio ``n / N`` long before
anyone notices the empty column; :class:`~airflow_provider_bos.sensors.BosCompletenessSensor`'s
``min_coverage`` turns it into a failure or an alert.

Counted in SQL, after the merge, in the run's transaction, never while decoding: an unchanged
re-run hands most records over as claims that are never decoded (:mod:`.claims`). The rows the
run returned are the ones the lifecycle steps anti-join against (:class:`~.dialects.lifecycle.RunKeys`:
the staging table, a keyed copy of it, or the current rows the run did NOT return), collected once
per run; when the run loaded an empty table or returned every current row, every current row; when
it wrote every record it returned, the current rows carrying its id.
Complete and partial runs are counted; a failed run writes nothing and records no coverage.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse.dialects.lifecycle import RunKeys
from airflow_provider_bos.warehouse.run.reconcile import run_keys
from airflow_provider_bos.warehouse.run.settle import DirectLoad, LoadOutcome, StagedWithKeptClaims
from airflow_provider_bos.warehouse.run.transaction import RunTransaction, UpsertCounts
from airflow_provider_bos.warehouse.tables.identifiers import validate_identifier
from airflow_provider_bos.warehouse.tables.schema import COVERED_COLUMNS

if TYPE_CHECKING:
    from airflow_provider_bos.pii import PolicyFingerprint

__all__ = ["count_coverage", "watched_columns"]


def watched_columns(
    extra: Sequence[str], pii: PolicyFingerprint | None, present: Callable[[], Collection[str]], *,
    table: str, promoted: Sequence[str] = (),
) -> dict[str, bool]:
    """The columns a run counts, each mapped to whether it holds text: ``display_name``, ``email`` and
    ``phone``, the ``promoted`` attribute columns (added to the table before the run), then ``extra``
    (``WriteOptions.coverage_columns``; validated names of columns the records table has:
    ``present()`` lists them, asked only when there are some).

    A field the personal-data policy drops is left out: it is NULL in every row by design, and a
    coverage of 0 would only raise a false alarm.
    """
    if isinstance(extra, str) or not isinstance(extra, Sequence):
        raise BosWarehouseError(
            f"coverage_columns must be a tuple of column names, not {type(extra).__name__} {str(extra)[:40]!r}."
        )
    names = [validate_identifier(name, kind="coverage column") for name in extra]
    dropped = {field for field, action in (pii.rules if pii is not None else {}).items() if action == "drop"}
    watched = {name: True for name in COVERED_COLUMNS if name not in dropped}
    watched.update((name, False) for name in promoted)
    added = [name for name in dict.fromkeys(names) if name not in watched and name not in dropped]
    if added:
        missing = sorted(set(added) - set(present()))
        if missing:
            raise BosWarehouseError(
                f"coverage_columns names {missing}, which {table} does not have; add the columns (nullable) "
                "or leave them out of coverage_columns. Nothing was written."
            )
        watched.update((name, False) for name in added)  # of any type: counted by their text
    return watched


def count_coverage(
    tx: RunTransaction, counts: UpsertCounts, loaded: LoadOutcome, columns: dict[str, bool] | None,
) -> dict[str, Any] | None:
    """The run's coverage of ``columns`` (None: the audit table has no coverage column, nothing counted).

    Run after the merge and the lifecycle steps (which may have collected the run's keys already),
    before the staging tables are dropped. A run that wrote every key it returned counts the rows
    carrying its id. Otherwise, without the keys, every current row is counted first:
    when they are as many as the run's keys (and no record was stale), they are all the run's (the
    test of ``reconcile._returned_every_current_row``, answered by the count itself); else the keys
    are collected and the run's rows counted.
    """
    if columns is None:
        return None
    if not isinstance(loaded, DirectLoad) and not counts.unchanged and not counts.skipped_stale:
        # The run wrote every key it returned: its rows are the current rows carrying its id, found
        # in one pass over the table instead of a join with the run's keys.
        return _count(tx, columns, None, written_by=tx.run_id)
    if tx.run_keys is None:
        every = _count(tx, columns, None)
        returned = counts.inserted + counts.updated + counts.unchanged
        if isinstance(loaded, DirectLoad) or (not counts.skipped_stale and every["records"] == returned):
            return every
        tx.run_keys = run_keys(tx, loaded.kept if isinstance(loaded, StagedWithKeptClaims) else None)
    for statement in tx.dialect.reconcile_settings():  # the same join shapes as the lifecycle steps
        tx.exec(statement)
    return _count(tx, columns, tx.run_keys)


def _count(tx: RunTransaction, columns: dict[str, bool], keys: RunKeys | None, *,
           written_by: str | None = None) -> dict[str, Any]:
    """``{"records": N, "columns": {...}}`` of the current rows in ``keys`` (None: every current row),
    or those ``written_by`` a run."""
    records, *filled = (int(v or 0) for v in tx.exec(tx.dialect.count_coverage(
        tx.table, tx.schema, columns, keys, written_by=written_by)).one())
    return {"records": records, "columns": dict(zip(columns, filled, strict=True))}

"""Promoted attribute columns in a run's transaction: fill them once, then fill each run's rows.

``<table>_columns`` holds one row per column the records table is filled for (its path and type).
A configured column without its row, or with another path, is filled from the stored
``attributes`` of every row of the records table and of ``<table>_history`` (no re-read, no
rewrite of the hashes or the sync time), under the writers' lock and in the run's transaction, so
a failed run leaves it to the next one. A column filled under another personal-data policy
(``pii-apply`` rewrote the stored values since) is filled again. A column whose row is there but
that this run does not configure loses its row: its values stay, new rows get NULL there, and configuring it again fills
it again. After the merge, the rows the run wrote are filled by the same SQL.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosConfigurationError, BosWarehouseError
from airflow_provider_bos.warehouse.run.audit import utcnow
from airflow_provider_bos.warehouse.run.rejects import Rejects
from airflow_provider_bos.warehouse.run.transaction import RunTransaction
from airflow_provider_bos.warehouse.tables.attribute_columns import (
    AttributeColumn,
    AttributeColumns,
    AttributeTypeError,
    attribute_column,
)

__all__ = ["AttributeFillError", "PromotedRun", "StoredFill", "WrongTypes", "fill_written", "refill_promoted",
           "settle_promoted"]

log = logging.getLogger(__name__)


class WrongTypes:
    """What a run does with a promoted value of the wrong type, and how many it stored as NULL."""

    def __init__(self, promoted: AttributeColumns, rejects: Rejects | None) -> None:
        self.store_null = promoted.type_errors == "null"
        self.rejects = rejects
        self.nulls: Counter[str] = Counter()  # column -> values stored as NULL

    def __call__(self, record: Any, error: AttributeTypeError) -> bool:
        """Keep the record (True, its column NULL), leave it out (False: quarantined), or raise."""
        if self.store_null:
            self.nulls[error.column.name] += 1
            return True
        if self.rejects is not None:
            self.rejects.add(record, error)
            return False
        raise error

    def note(self) -> str:
        """The audit note of the values stored as NULL (column names and counts, never a value)."""
        per_column = ", ".join(f"{name}: {n}" for name, n in sorted(self.nulls.items()))
        return (f"{sum(self.nulls.values())} promoted attribute value(s) of the wrong type were stored as NULL "
                f"({per_column}).")


@dataclass(frozen=True)
class StoredFill:
    """What filling columns from the stored rows did: the audit note (how many stored values of the
    records table did not fit each column, stored as NULL), and whether that makes the run ``partial``
    (it quarantines invalid records: a stored row stays stored, so the run says so instead). The
    run's own records are checked as they are read, and counted apart."""

    note: str
    partial: bool


def settle_promoted(tx: RunTransaction, marker: sa.Table, promoted: AttributeColumns, history: str | None,
                    *, policy: str | None, invalid_records: str, run_id: str, at: datetime) -> StoredFill | None:
    """Fill the configured columns ``marker`` has no matching row for; forget the unconfigured ones.

    ``policy``: the run's personal-data policy (its fingerprint text; None: none): the stored
    ``attributes`` are in its form, so a column filled under another one is filled again.

    A stored value of the wrong type follows ``attribute_type_errors`` as a read one does, as far as a
    row already stored can: ``"null"`` stores NULL and counts it; else ``invalid_records="fail"`` fails
    the run (nothing written) and ``"quarantine"`` stores NULL, counts it and makes the run ``partial``
    (the row is not taken out of the table; the run still retires and supersedes as a complete read
    does). Only current rows count: a retired row's or a history version's value of the wrong type is
    NULL, as BOS no longer sends either to be fixed.

    Returns what the fill did, or None when nothing was filled.
    :raises BosConfigurationError: a column configured with another type than it was filled with.
    :raises AttributeFillError: stored values of the wrong type, under ``invalid_records="fail"``.
    """
    policy_key = hashlib.sha256(policy.encode("utf-8")).hexdigest() if policy else None
    stored = _stored(tx, marker)
    wanted = {c.name: (c.path, c.type, policy_key) for c in promoted.columns}
    if all(stored.get(name) == value for name, value in wanted.items()) and set(stored) <= set(wanted):
        return None
    tx.lock()  # the rows filled are the rows the merge then compares with
    stored = _stored(tx, marker)
    for column in promoted.columns:
        if column.name in stored and stored[column.name][1] != column.type:
            raise BosConfigurationError(
                f"attribute_columns: {column.name!r} holds {stored[column.name][1]} values; it cannot become "
                f"{column.type}. Promote {column.path} under another column name (or drop the column and "
                f"its row in {marker.name}, then run again)."
            )
    fill = [c for c in promoted.columns if stored.get(c.name) != wanted[c.name]]
    forget = [name for name in stored if name not in promoted.names]
    d = tx.dialect
    filled = None
    if fill:
        for table in (tx.table, history):
            if table is not None:
                tx.exec(d.fill_attribute_columns(table, tx.schema, fill))
        misfits = {c: tx.exec(d.count_attribute_type_errors(tx.table, tx.schema, c)).scalar() or 0 for c in fill}
        wrong = {c: n for c, n in misfits.items() if n}
        if wrong and promoted.type_errors != "null" and invalid_records == "fail":
            raise AttributeFillError(tx.table, wrong)
        note = (f"Filled the promoted column(s) {', '.join(c.name for c in fill)} from the stored attributes"
                + (f"; values of the wrong type stored as NULL: "
                   f"{', '.join(f'{c.name}: {n}' for c, n in wrong.items())}." if wrong else "."))
        log.info("BOS run %s: %s", run_id, note)
        filled = StoredFill(note, partial=bool(wrong) and promoted.type_errors != "null")
    if forget:
        log.info("BOS run %s: the column(s) %s are no longer promoted; they keep their values, new rows get NULL.",
                 run_id, ", ".join(forget))
    changed = [*forget, *(c.name for c in fill)]
    tx.conn.execute(marker.delete().where(marker.c.column_name.in_(changed)))
    if fill:
        tx.conn.execute(marker.insert(), [{"column_name": c.name, "path": c.path, "type": c.type,
                                           "policy": policy_key, "filled_at": at, "run_id": run_id} for c in fill])
    return filled


class AttributeFillError(BosWarehouseError):
    """Stored rows hold values of the wrong type for a column being filled, and the run fails on invalid
    records. Names the columns, paths and counts, never a value or a ref."""

    def __init__(self, table: str, wrong: dict[AttributeColumn, int]) -> None:
        each = "; ".join(f"{n} at {c.path} are not of type {c.type} (column {c.name!r})" for c, n in wrong.items())
        super().__init__(
            f"attribute_columns: stored rows of {table} hold values of the wrong type for the column(s) being "
            f"filled: {each}. With invalid_records='fail' they are not stored as NULL, and nothing was written. "
            "Set attribute_type_errors='null' to store NULL there and count them (or "
            "invalid_records='quarantine': the same, and the run is partial), or promote the path under "
            "another name with the type its values have.")


def refill_promoted(tx: RunTransaction, marker: sa.Table, history: str | None, *, policy: str, run_id: str,
                    at: datetime) -> list[str]:
    """Fill every column ``marker`` lists again from the stored ``attributes`` (rewritten in ``tx``
    under the personal-data ``policy``, its fingerprint text), in the records table and ``history``:
    a value the policy now hashes or drops leaves its column with the attributes, in the same
    transaction. Returns the columns filled."""
    rows = tx.conn.execute(sa.select(marker.c.column_name, marker.c.path, marker.c.type)).all()
    if not rows:
        return []
    columns = [attribute_column(name, {"path": path, "type": kind}) for name, path, kind in rows]
    for table in (tx.table, history):
        if table is not None:
            tx.exec(tx.dialect.fill_attribute_columns(table, tx.schema, columns))
    tx.conn.execute(marker.update().values(policy=hashlib.sha256(policy.encode("utf-8")).hexdigest(),
                                           filled_at=at, run_id=run_id))
    return [c.name for c in columns]


def fill_written(tx: RunTransaction, promoted: AttributeColumns, run_id: str) -> None:
    """The promoted columns of the rows this run wrote (the merge wrote ``attributes`` only)."""
    tx.exec(tx.dialect.fill_attribute_columns(tx.table, tx.schema, promoted.columns, run_id=run_id))


def _stored(tx: RunTransaction, marker: sa.Table) -> dict[str, tuple[str, str, str | None]]:
    rows = tx.conn.execute(sa.select(marker.c.column_name, marker.c.path, marker.c.type, marker.c.policy)).all()
    return {name: (path, kind, policy) for name, path, kind, policy in rows}


class PromotedRun:
    """A run's promoted columns with the tables they live in (see ``WarehouseWriter._ensure_promoted_columns``)."""

    def __init__(self, marker: sa.Table, columns: AttributeColumns, history: str | None, policy: str | None) -> None:
        self.marker, self.columns, self.history, self.policy = marker, columns, history, policy

    def settle(self, tx: RunTransaction, run_id: str, invalid_records: str) -> StoredFill | None:
        """Fill what is new since the last run, in ``tx`` (what a fill did, or None)."""
        return settle_promoted(tx, self.marker, self.columns, self.history, policy=self.policy,
                               invalid_records=invalid_records, run_id=run_id, at=utcnow())

"""Tables written before the content hash left out observation stamps: re-hashed once, in the run.

Until the content hash took ``sources`` unstamped and unordered (see :mod:`.records`), a row's
``_bos_record_hash`` covered every provenance ``observed_at``: on such a table every re-stamped
record of the first run after the upgrade would look changed (a rewrite and a history version per
person). So the first run finds out, from one row, whether the table's hashes are of that earlier
form (the row's stored hash is the earlier hash of its stored content), and if so re-hashes every
row from its stored content, under the writers' lock, in the run's own transaction: a one-time
rewrite of the records table, counted in the run's audit note. No history version is added: the
content did not change. The same run then gives each unchanged row its new wire hash
(:meth:`~.transaction.RunTransaction.classify_and_merge`), so the next re-run skips it undecoded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.warehouse.run.transaction import RunTransaction
from airflow_provider_bos.warehouse.tables.records import (
    CONTENT_FIELDS,
    canonical_json,
    parse_timestamp,
    record_to_row,
    stored_json_columns,
    stored_record,
)
from airflow_provider_bos.warehouse.tables.stored_json import JsonColumns

__all__ = ["rehash_stamped_rows"]

_BATCH = 5000


def _stamped_hash(record: Mapping[str, Any]) -> str:
    """The earlier content hash: the canonical JSON of the content fields, stamps and order included."""
    content = {name: record.get(name) for name in CONTENT_FIELDS}
    if content["attributes"] is None:
        content["attributes"] = {}
    return hashlib.sha256(canonical_json(content).encode("utf-8")).hexdigest()


def _content_hash(row: sa.RowMapping, json_columns: JsonColumns) -> str:
    record = stored_record(row, json_columns)
    return record_to_row(record, default_observed_at=parse_timestamp(row["_bos_observed_at"]), stored=True).record_hash


def _columns(table: sa.Table) -> list[sa.ColumnElement[Any]]:
    return [*(table.c[name] for name in CONTENT_FIELDS), table.c["_bos_observed_at"], table.c["_bos_record_hash"]]


def _batches(tx: RunTransaction, table: sa.Table) -> Iterator[list[sa.RowMapping]]:
    """Every row, in record_ref order, a batch at a time (keyset pagination: no open cursor while the
    batch's updates run on the same connection)."""
    last: str | None = None
    while True:
        query = sa.select(*_columns(table)).order_by(table.c.record_ref).limit(_BATCH)
        if last is not None:
            query = query.where(table.c.record_ref > last)
        rows = list(tx.conn.execute(query).mappings())
        if not rows:
            return
        yield rows
        last = rows[-1]["record_ref"]


def rehash_stamped_rows(tx: RunTransaction, table: sa.Table) -> int:
    """Re-hash every row of a table whose hashes cover observation stamps; the rows rewritten (0 if
    the table's hashes are content hashes already, or it is empty)."""
    sample = tx.conn.execute(sa.select(*_columns(table)).order_by(table.c.record_ref).limit(1)).mappings().first()
    if sample is None:
        return 0
    stored = sample["_bos_record_hash"]
    json_columns = stored_json_columns(table)
    if stored != _stamped_hash(stored_record(sample, json_columns)) or stored == _content_hash(sample, json_columns):
        return 0
    tx.lock()  # the hashes rewritten are the ones the merge then compares with
    update = (sa.update(table).where(table.c.record_ref == sa.bindparam("ref"))
              .values(_bos_record_hash=sa.bindparam("content_hash")))
    rewritten = 0
    for rows in _batches(tx, table):
        changes = [{"ref": row["record_ref"], "content_hash": new} for row in rows
                   if (new := _content_hash(row, json_columns)) != row["_bos_record_hash"]]
        if changes:
            tx.conn.execute(update, changes)
            rewritten += len(changes)
    tx.rehashed = rewritten
    return rewritten

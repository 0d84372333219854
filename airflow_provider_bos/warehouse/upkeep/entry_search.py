"""The rows that may hold a provenance entry, found by the database: an erasure's external-id finder.

Each function gives *candidates*: every ref whose row holds an entry asked for, and maybe a few more
(a number stored where a text was asked for, a text equal under a collation that ignores case or
trailing spaces, an object nested deeper than the entries). :mod:`.erase_finders` reads the
candidates' stored ``sources`` and keeps only the refs whose entries hold the value exactly.

* The records table: through ``<table>_sources`` (one row per entry of every row) and its entry
  index on (source_type, source_identity, external_id), never the records' JSON. On PostgreSQL the
  index's leading columns are walked first (the distinct source types, and a type's identities: one
  index probe each), so a request by source_identity alone still looks up whole keys; the other
  databases filter the provenance table itself (DuckDB keeps no index on it: its zone maps answer).
* A table of versions (``<table>_history``: an old id is only there): one pass the database makes
  over the stored ``sources``: a containment test on PostgreSQL (``@>``: typed, exact) and DuckDB
  (``json_contains``) for a few values, the entries expanded and compared with a list otherwise (a
  test per value would read every row once per value).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from airflow_provider_bos.warehouse.dialects import WarehouseDialect
from airflow_provider_bos.warehouse.dialects.upkeep_sql import (
    contains_entries,
    distinct_leading_values,
    provenance_refs,
)
from airflow_provider_bos.warehouse.run.transaction import execute

__all__ = ["EntryProbe", "provenance_candidates", "versions_candidates"]

# Bound values per statement (SQLite before 3.32 allows 999).
_VALUES_PER_QUERY = 500
# Up to this many values a version table is tested once per row and value; beyond, its entries are
# expanded once and compared with the list (each containment test reads the whole table again).
_CONTAINMENT_VALUES = 4


@dataclass(frozen=True)
class EntryProbe:
    """Entries whose ``by`` (``source_identity``, or ``source_type``) is ``source`` and whose
    external_id is one of ``ids`` (as stored: raw, or the keyed hash)."""

    by: str
    source: str
    ids: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.by not in ("source_identity", "source_type"):  # pragma: no cover - a caller's typo
            raise ValueError(self.by)


def _chunks(values: Sequence[str]) -> list[list[str]]:
    ordered = sorted(set(values))
    return [ordered[i : i + _VALUES_PER_QUERY] for i in range(0, len(ordered), _VALUES_PER_QUERY)]


def provenance_candidates(conn: sa.Connection, d: WarehouseDialect, provenance: sa.Table,
                          probes: Iterable[EntryProbe]) -> set[str]:
    """Refs of the provenance table's entries a probe names (candidates: see the module)."""
    found: set[str] = set()
    name, schema = provenance.name, provenance.schema
    for probe in probes:
        leading: list[str] | None = None
        if d.name == "postgresql":  # whole keys of the entry index, not its leading column's range
            source_type = probe.source if probe.by == "source_type" else None
            leading = [row[0] for row in execute(conn, distinct_leading_values(d, name, schema,
                                                                               source_type=source_type))]
        for chunk in _chunks(probe.ids):
            statement = provenance_refs(d, name, schema, by=probe.by, source=probe.source, ids=chunk, leading=leading)
            found.update(row[0] for row in execute(conn, statement))
    return found


def versions_candidates(conn: sa.Connection, d: WarehouseDialect, table: sa.Table,
                        probes: Sequence[EntryProbe]) -> set[str]:
    """Refs of the rows of ``table`` whose stored ``sources`` may hold an entry a probe names
    (candidates: see the module); one pass over the table, or one per list of values."""
    entries = [json.dumps(_entry(d, probe, ident), ensure_ascii=False)
               for probe in probes for ident in sorted(set(probe.ids))]
    if len(entries) <= _CONTAINMENT_VALUES and d.name in ("postgresql", "duckdb"):
        return {row[0] for row in execute(conn, contains_entries(d, table.name, table.schema, entries))}
    found: set[str] = set()
    for probe in probes:
        for chunk in _chunks(probe.ids):
            found.update(row[0] for row in execute(
                conn, d.refs_with_external_id(table.name, table.schema, probe.source, chunk, by=probe.by)))
    return found


def _entry(d: WarehouseDialect, probe: EntryProbe, ident: str) -> object:
    """The entry to look for, as :func:`~..dialects.upkeep_sql.contains_entries` takes it: an array of
    it on PostgreSQL (``@>`` compares arrays element by element), the object on DuckDB."""
    entry = {probe.by: probe.source, "external_id": ident}
    return [entry] if d.name == "postgresql" else entry

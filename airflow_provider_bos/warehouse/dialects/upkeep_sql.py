"""The SQL of the upkeep commands' fast paths: an erasure's external-id look-ups, ``pii-apply``'s staged updates.

Built here, beside the dialects, as :class:`Statement` objects (identifiers validated and quoted by the
dialect, every value bound); :mod:`..upkeep.entry_search` and :mod:`..upkeep.policy_rewrite` decide
which to run. Only values a row already stores (or a request names) are bound: a personal-data key
never is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from airflow_provider_bos.warehouse.dialects.base import WarehouseDialect
from airflow_provider_bos.warehouse.dialects.statement import Statement
from airflow_provider_bos.warehouse.tables.records import CONTENT_FIELDS

__all__ = [
    "contains_entries",
    "copy_staged_updates",
    "create_staged_updates",
    "distinct_leading_values",
    "drop_staged_updates",
    "empty_staged_updates",
    "export_snapshot",
    "import_snapshot",
    "lock_to_read",
    "provenance_refs",
    "same_stored_content",
    "unlike_any_row_of",
    "update_from_staged",
]


def _marks(d: WarehouseDialect, count: int) -> str:
    return ", ".join([d.placeholder] * count)


def provenance_refs(d: WarehouseDialect, sources: str, schema: str | None, *, by: str, source: str,
                    ids: Sequence[str], leading: Sequence[str] | None = None) -> Statement:
    """The refs of ``sources``' entries whose ``by`` (source_identity or source_type) is ``source`` and
    whose external_id is one of ``ids``.

    ``leading``: the entry index's other leading column's values to look up (the source types, for a
    request by source_identity; the identities of the type, for one by type), NULL always among them,
    so the database looks up whole keys of the index (source_type, source_identity, external_id)
    instead of filtering the table. ``None``: filter by the two columns alone."""
    if by not in ("source_identity", "source_type"):  # pragma: no cover - a caller's typo
        raise ValueError(by)
    q, p = d.quote, d.placeholder
    ref, external, column = q("record_ref"), q("external_id"), q(by)
    table = d.table_ref(sources, schema)
    if leading is None:
        return Statement(f"SELECT DISTINCT s.{ref} FROM {table} s WHERE s.{column} = {p} "
                         f"AND s.{external} IN ({_marks(d, len(ids))})", (source, *ids))
    other = q("source_type" if by == "source_identity" else "source_identity")
    others = (f"(s.{other} IN ({_marks(d, len(leading))}) OR s.{other} IS NULL)" if leading
              else f"s.{other} IS NULL")
    return Statement(f"SELECT DISTINCT s.{ref} FROM {table} s WHERE {others} AND s.{column} = {p} "
                     f"AND s.{external} IN ({_marks(d, len(ids))})", (*leading, source, *ids))


def distinct_leading_values(d: WarehouseDialect, sources: str, schema: str | None, *,
                            source_type: str | None = None) -> Statement:
    """The distinct non-NULL source types of ``sources`` (or, given ``source_type``, that type's
    source identities), one index probe each: a loose index scan, written as a recursive query (the
    entry index's leading columns; PostgreSQL before 18 has no skip scan)."""
    q, p = d.quote, d.placeholder
    col = f"s.{q('source_type' if source_type is None else 'source_identity')}"
    table = d.table_ref(sources, schema)
    prefix, params = (f"s.{q('source_type')} = {p} AND ", (source_type,)) if source_type is not None else ("", ())
    return Statement(
        f"WITH RECURSIVE v(x) AS ((SELECT {col} FROM {table} s WHERE {prefix}{col} IS NOT NULL "
        f"ORDER BY {col} LIMIT 1) UNION ALL SELECT (SELECT {col} FROM {table} s WHERE {prefix}{col} > v.x "
        f"ORDER BY {col} LIMIT 1) FROM v WHERE v.x IS NOT NULL) SELECT x FROM v WHERE x IS NOT NULL",
        (*params, *params))


def contains_entries(d: WarehouseDialect, table: str, schema: str | None, entries: Sequence[str]) -> Statement:
    """The refs of the rows of ``table`` whose ``sources`` contain one of ``entries`` (each a JSON text,
    bound): PostgreSQL's ``@>`` (an array of one entry object: typed, exact), DuckDB's
    ``json_contains`` (the entry object, at any depth). One pass over the table, one test per entry."""
    q, p = d.quote, d.placeholder
    if d.name == "postgresql":
        test = f"t.{q('sources')} @> CAST({p} AS JSONB)"
    elif d.name == "duckdb":
        test = f"JSON_CONTAINS(t.{q('sources')}, CAST({p} AS JSON))"
    else:  # pragma: no cover - a caller's mistake: the others expand the entries instead
        raise ValueError(d.name)
    return Statement(f"SELECT DISTINCT t.{q('record_ref')} FROM {d.table_ref(table, schema)} t "
                     f"WHERE {' OR '.join([test] * len(entries))}", tuple(entries))


def create_staged_updates(d: WarehouseDialect, staged: str, *, key: Sequence[tuple[str, str]],
                          columns: Sequence[str]) -> Statement:
    """PostgreSQL: a temporary table (dropped at the commit) for rewritten rows: ``k_<column>`` of
    each ``(column, SQL type)`` of ``key``, then ``columns`` as text."""
    q = d.quote
    defined = [*(f"{q(f'k_{name}')} {kind}" for name, kind in key), *(f"{q(c)} TEXT" for c in columns)]
    return Statement(f"CREATE TEMPORARY TABLE {q(staged)} ({', '.join(defined)}) ON COMMIT DROP")


#: What :func:`same_stored_content` compares: every column pii-apply reads as a row's content, the
#: cheap equalities first.
_CONTENT_COLUMNS = ("record_ref", "_bos_record_hash", "_bos_observed_at",
                    *(c for c in CONTENT_FIELDS if c != "record_ref"))


def same_stored_content(d: WarehouseDialect, a: str, b: str) -> str:
    """The condition that rows ``a`` and ``b`` (table aliases or references) of a records table or its
    history store the same content: the same ref, content hash, observation time and values (a NULL
    equal to a NULL), each JSON column as the database compares it. DuckDB compares a JSON column's
    text. PostgreSQL compares jsonb values, without rendering a text: ``1`` and ``1.0`` are equal
    there, but with the content hash equal too, which the writer computes from every stored value but
    the provenance entries' order and their observation stamps (both compared exactly here: arrays in
    order, stamps as strings), equal values are equal texts. (A row whose stored hash was not made
    from its own values, edited by hand, is outside that argument.)"""
    q = d.quote
    tests = [f"{a}.{q(c)} = {b}.{q(c)}" for c in _CONTENT_COLUMNS[:3]]
    tests += [f"{a}.{q(c)} IS NOT DISTINCT FROM {b}.{q(c)}" for c in _CONTENT_COLUMNS[3:]]
    return " AND ".join(tests)


def unlike_any_row_of(d: WarehouseDialect, version: str, table: str, schema: str | None) -> str:
    """The condition that the row ``version`` (as the query names it) of a history stores other
    content than its ref's row of the records table ``table`` (or that the ref has no row there)."""
    return f"NOT EXISTS (SELECT 1 FROM {d.table_ref(table, schema)} m WHERE {same_stored_content(d, version, 'm')})"


def update_from_staged(d: WarehouseDialect, target: str, schema: str | None, staged: str, *, key: Sequence[str],
                       columns: Sequence[str], json_columns: Sequence[str],
                       within: tuple[Any, Any] = (None, None), alike_in: str | None = None) -> Statement:
    """PostgreSQL: one ``UPDATE`` of ``target``'s rows named by ``staged``'s key columns, setting
    ``columns`` (those in ``json_columns`` parsed from their text). ``within``: the bounds of the staged
    rows' first key column (above, up to; ``None`` unbounded), so that a batch's update reads its range
    of the target through the key's index instead of the whole table. The first round's range is
    bounded below too, by ``>= ''`` (every text is): on a table without statistics the planner takes a
    range open on one side for a third of the table, and planned the first round's update of the
    versions as a scan of the staged rows per version (3.2 s of a 50,000-row pii-apply's 6.3 s).
    Bounded on both sides, every round is planned from the records table's range (its key's index),
    each version found by the history's key: the staged rows need no statistics of their own (an
    ``ANALYZE`` of them per round cost a 200,000-row pii-apply 0.35-0.60 s and bought nothing).

    ``alike_in``: the records table whose rows ``staged`` rewrites (its key, the ref); then ``target`` is
    its history, and the rows updated are the versions of those refs that store the same content as
    the records table's row does (not updated yet)."""
    q, p = d.quote, d.placeholder
    sets = ", ".join(f"{q(c)} = " + (f"CAST(s.{q(c)} AS JSONB)" if c in json_columns else f"s.{q(c)}")
                     for c in columns)
    match = [f"t.{q(name)} = s.{q(f'k_{name}')}" for name in key]
    ranged = ("t", "m") if alike_in is not None else ("t",)  # every table's range read through its key's index
    above, up_to = within
    lower = (">=", "") if above is None and up_to is not None else (">", above)
    bounds = [(f"{a}.{q(key[0])} {op} {p}", value) for op, value in (lower, ("<=", up_to)) if value is not None
              for a in ranged]
    match.extend(test for test, _ in bounds)
    params = tuple(value for _, value in bounds)
    source = f"{q(staged)} s"
    if alike_in is not None:
        source += f" JOIN {d.table_ref(alike_in, schema)} m ON m.{q(key[0])} = s.{q(f'k_{key[0]}')}"
        match.append(same_stored_content(d, "t", "m"))
    return Statement(f"UPDATE {d.table_ref(target, schema)} AS t SET {sets} FROM {source} "
                     f"WHERE {' AND '.join(match)}", params)


def drop_staged_updates(d: WarehouseDialect, staged: str) -> Statement:
    return Statement(f"DROP TABLE IF EXISTS {d.quote(staged)}")


def empty_staged_updates(d: WarehouseDialect, staged: str) -> Statement:
    """PostgreSQL: the staged rows removed once applied (a new file: no dead rows for the next batch's join)."""
    return Statement(f"TRUNCATE {d.quote(staged)}")


def copy_staged_updates(d: WarehouseDialect, staged: str, names: Sequence[str]) -> str:
    """PostgreSQL: the binary ``COPY ... FROM STDIN`` that fills ``staged``'s ``names``."""
    return f"COPY {d.quote(staged)} ({', '.join(d.quote(n) for n in names)}) FROM STDIN (FORMAT BINARY)"


def export_snapshot(d: WarehouseDialect) -> Statement:
    """PostgreSQL: the id of the transaction's snapshot, for another connection to import."""
    return Statement("SELECT pg_export_snapshot()")


# What pg_export_snapshot returns: hexadecimal virtual transaction id parts and a decimal sequence.
_SNAPSHOT_ID = re.compile(r"[0-9A-F]+-[0-9A-F]+-[0-9]+")


def import_snapshot(d: WarehouseDialect, snapshot: str) -> list[Statement]:
    """PostgreSQL: make a REPEATABLE READ transaction read-only and see what the one that exported
    ``snapshot`` saw (the statements first in the transaction; the id is checked, since the
    statement takes no parameter)."""
    if not _SNAPSHOT_ID.fullmatch(snapshot):
        raise ValueError(f"not a snapshot id: {snapshot!r}")
    return [Statement("SET TRANSACTION READ ONLY"), Statement(f"SET TRANSACTION SNAPSHOT '{snapshot}'")]


def lock_to_read(d: WarehouseDialect, tables: Sequence[tuple[str, str | None]]) -> Statement:
    """PostgreSQL: share locks on ``tables`` (``(name, schema)``), taken at once or refused
    (``NOWAIT``) rather than queued behind another request."""
    names = ", ".join(d.table_ref(name, schema) for name, schema in tables)
    return Statement(f"LOCK TABLE {names} IN ACCESS SHARE MODE NOWAIT")

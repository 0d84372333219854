"""The SQL of a row's lifecycle: supersede, retire, history, lineage and erasure (a part of every dialect).

:class:`LifecycleSql` is a base of :class:`~.base.WarehouseDialect`: every dialect builds these
statements by inheritance and overrides only what its database spells differently (the JSON
expansion of ``sources``, UPDATE with a join). All of them are set-based: one statement per table
against the run's staged keys (the staging table holds every record_ref the run returned), never a
statement per row. :mod:`..reconcile` and :mod:`..history` execute them, in the run's transaction,
after the merge and before the audit row.

The work tables (TEMPORARY, one set per run, dropped with the staging tables):

- ``candidates`` (record_ref): the current rows holding an entry another current row holds too;
- ``others`` (record_ref, source_type, source_identity, external_id): the provenance entries of
  every candidate the result did NOT return;
- ``successors`` (same columns): the provenance entries of the result's rows that share one with
  ``others``;
- ``superseded`` (record_ref, successor_ref): the rows of ``others`` ALL of whose entries belong
  to the result's rows, with the smallest such successor record_ref (deterministic for a split);
- ``retired`` (record_ref): the current rows of the read's scope the result did not return.

The entries come from ``<table>_sources`` (one row per entry, indexed by the entry: see
:func:`~..schema.sources_table`), never from the ``sources`` JSON: only :meth:`LifecycleSql.write_provenance`
expands the JSON, for the rows a run wrote.

Each statement names each work table at most once (MySQL cannot reopen a temporary table).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_provider_bos.warehouse.dialects.statement import Statement
from airflow_provider_bos.warehouse.tables.schema import (
    CONFIRMED_AT_COLUMN,
    DELETED_AT_COLUMN,
    HISTORY_CONTENT_COLUMNS,
    SCOPE_COLUMN,
    SUPERSEDED_BY_COLUMN,
    WIRE_HASH_COLUMN,
)

__all__ = ["ENTRY_COLUMNS", "ENTRY_TEXT_COLUMNS", "PROVENANCE_KEY", "LifecycleSql", "RunKeys", "ScopeFilter"]

#: A provenance entry's identity, as the work tables hold it.
PROVENANCE_KEY = ("source_type", "source_identity", "external_id")
#: The text fields of an entry ``<table>_sources`` keeps.
ENTRY_TEXT_COLUMNS = (*PROVENANCE_KEY, "record_type", "version")
#: What ``<table>_sources`` keeps of each entry (with record_ref and is_current).
ENTRY_COLUMNS = ("entry_index", *ENTRY_TEXT_COLUMNS, "capabilities")


@dataclass(frozen=True)
class RunKeys:
    """The work table the anti-joins read the run's record_refs from.

    ``missing=False``: ``table`` holds every record_ref the run returned (staging, or a keyed copy
    of it). ``missing=True``: ``table`` holds the opposite, the current rows the run did NOT return
    (found from the claims' complement, see :meth:`~.postgres.PostgresDialect.collect_unreturned`),
    so a re-run that kept most records out of staging does not stage them all again.
    """

    table: str
    missing: bool = False


class ScopeFilter:
    """Which audit rows' runs wrote the rows of a read's scope.

    ``scope``: the scope key. ``legacy``: also runs audited without a scope (written before scopes
    existed) whose (conn_id, context_handle, tool_name[, arguments_hash]) are these values.
    """

    def __init__(self, scope: str, legacy: dict[str, str | None] | None = None) -> None:
        self.scope = scope
        self.legacy = legacy


class LifecycleSql:
    """Builders of the lifecycle statements; mixed into :class:`~.base.WarehouseDialect`."""

    #: The identity the database computes for a row of the rejects table (``{record}``: its quoted
    #: ``record`` column), by which an erasure finds a quarantined record without a ref again in the
    #: same transaction without binding the record's bytes (a statement log or query history keeps
    #: what is bound).
    reject_row_id_sql = "encode(sha256({record}), 'hex')"

    # Provided by WarehouseDialect.
    placeholder: str
    if TYPE_CHECKING:
        def quote(self, identifier: str) -> str: ...
        def table_ref(self, table: str, schema: str | None) -> str: ...
        def stage_ref(self, stage: str, schema: str | None) -> str: ...
        def type_sql(self, role: str) -> str: ...
        def bind_timestamp(self, value: datetime) -> Any: ...
        def bind_ts(self) -> str: ...
        def bind_id(self) -> str: ...
        def _temp_prefix(self) -> str: ...
        def _temp_suffix(self) -> str: ...

    # --- pieces -------------------------------------------------------------------------------

    def _current(self, t: str) -> str:
        """True for a current (not retired) row of alias ``t``."""
        return f"{t}.{self.quote(DELETED_AT_COLUMN)} IS NULL"

    def _fence(self) -> str:
        """Text ending a derived table the planner must evaluate before the join around it."""
        return ""

    def provenance_entries(self, alias: str) -> tuple[str, dict[str, str]]:
        """The join expanding ``alias``'s ``sources`` array into its entries, and the expression of
        each of :data:`ENTRY_COLUMNS` (``entry_index`` from 0).

        The SQL:2016 ``JSON_TABLE`` (MySQL 8, MariaDB 10.6+, PostgreSQL 17); dialects without it
        override this.
        """
        text = ", ".join(f"{c} VARCHAR(512) PATH '$.{c}'" for c in ENTRY_TEXT_COLUMNS)
        join = (f" CROSS JOIN JSON_TABLE({alias}.{self.quote('sources')}, '$[*]' COLUMNS (n FOR ORDINALITY, "
                f"{text}, capabilities JSON PATH '$.capabilities')) AS p")
        return join, {"entry_index": "p.n - 1", **{c: f"p.{c}" for c in ENTRY_COLUMNS[1:]}}

    def _not_returned(self, keys: RunKeys, schema: str | None, t: str = "t") -> str:
        """True for a row of alias ``t`` that the run did not return."""
        ref, table = self.quote("record_ref"), self.stage_ref(keys.table, schema)
        if keys.missing:
            return f"{t}.{ref} IN (SELECT m.{ref} FROM {table} m)"
        return f"NOT EXISTS (SELECT 1 FROM {table} s WHERE s.{ref} = {t}.{ref})"

    def _returned(self, keys: RunKeys, schema: str | None, t: str = "t") -> str:
        """True for a row of alias ``t`` that the run returned."""
        ref, table = self.quote("record_ref"), self.stage_ref(keys.table, schema)
        if keys.missing:
            return f"NOT EXISTS (SELECT 1 FROM {table} m WHERE m.{ref} = {t}.{ref})"
        return f"{t}.{ref} IN (SELECT s.{ref} FROM {table} s)"

    def _entries_match(self, a: str, b: str) -> str:
        """The entries of aliases ``a`` and ``b`` match as the entry index compares them (where a
        collation ignores trailing spaces, also entries that differ only in them)."""
        return " AND ".join(f"{a}.{c} = {b}.{c}" for c in PROVENANCE_KEY)

    def _keys_equal(self, a: str, b: str) -> str:
        """The entries of aliases ``a`` and ``b`` are the same entry."""
        return self._entries_match(a, b)

    def reconcile_settings(self) -> list[Statement]:
        """Statements run once before the lifecycle statements, for the rest of the transaction."""
        return []

    def count_current(self, target: str, schema: str | None) -> Statement:
        """One value: the target's current rows (compared with the run's keys: none missing means
        there is nothing to supersede or retire)."""
        return Statement(f"SELECT COUNT(*) FROM {self.table_ref(target, schema)} t WHERE {self._current('t')}")

    def collect_run_keys(self, keys: str, stage: str, schema: str | None) -> Statement:
        """Into the keyed work table ``keys``: every record_ref staged (see ``capabilities.keyed_run_keys``)."""
        ref = self.quote("record_ref")
        return Statement(
            f"INSERT INTO {self.stage_ref(keys, schema)} ({ref}) "
            f"SELECT DISTINCT s.{ref} FROM {self.stage_ref(stage, schema)} s"
        )

    def collect_unreturned(
        self, missing: str, stage: str, target: str, schema: str | None, unclaimed: Sequence[str],
    ) -> Statement | None:
        """Into ``missing``: the current rows neither staged nor claimed, given the stored wire-hash
        prefixes no claim matched (``unclaimed``); None where claims are never kept out of staging."""
        return None

    def _unreturned(
        self, missing: str, stage: str, target: str, schema: str | None, unclaimed: Sequence[str], *,
        hash_length: str, prefix: str, prefixes: str,
    ) -> Statement:
        """:meth:`collect_unreturned` in the words of a dialect that keeps claims: ``hash_length`` and
        ``prefix`` of the stored hash (``{w}`` in them), ``prefixes`` a subquery of the bound list.

        A current row the run did not return is not staged and its wire hash (unchanged since the
        claims were matched: the state token said so under the lock) is not one a claim matched:
        one scan with a hashed look-up of the unclaimed prefixes, instead of staging every claim.
        """
        ref, w = self.quote("record_ref"), f"t.{self.quote(WIRE_HASH_COLUMN)}"
        return Statement(
            f"INSERT INTO {self.stage_ref(missing, schema)} ({ref}) "
            f"SELECT t.{ref} FROM {self.table_ref(target, schema)} t WHERE {self._current('t')} "
            f"AND ({hash_length.format(w=w)} IS DISTINCT FROM 64 OR {prefix.format(w=w)} IN ({prefixes})) "
            f"AND NOT EXISTS (SELECT 1 FROM {self.stage_ref(stage, schema)} s WHERE s.{ref} = t.{ref})",
            (list(unclaimed),),
        )

    def unreturned_settings(self, missing: str, schema: str | None) -> list[Statement]:
        """Statements run after :meth:`collect_unreturned` filled ``missing`` (before the steps read it)."""
        return []

    # --- work tables --------------------------------------------------------------------------

    def create_work_table(self, name: str, schema: str | None, kind: str) -> Statement:
        """A work table: ``"provenance"`` (ref + entry), ``"successors"`` (ref + successor, keyed) or
        ``"keys"`` (ref, keyed)."""
        key = self.type_sql("key")
        ref = f"{self.quote('record_ref')} {key} NOT NULL"
        if kind == "provenance":
            cols = [ref, *(f"{c} {key}" for c in PROVENANCE_KEY)]
        elif kind == "successors":
            cols = [ref, f"successor_ref {key} NOT NULL", f"PRIMARY KEY ({self.quote('record_ref')})"]
        elif kind == "keys":
            cols = [ref, f"PRIMARY KEY ({self.quote('record_ref')})"]
        else:  # pragma: no cover - a caller's typo
            raise ValueError(kind)
        columns = ", ".join(cols)
        return Statement(f"{self._temp_prefix()} {self.stage_ref(name, schema)} ({columns}){self._temp_suffix()}")

    # --- the provenance table -------------------------------------------------------------------

    def write_provenance(self, sources: str, target: str, schema: str | None, *, run_id: str | None,
                         ) -> Statement:
        """Into ``sources``: the entries of the rows ``run_id`` wrote (None: of every row, to build
        the table beside records stored before it), current as their row is."""
        q = self.quote
        ref, deleted = q("record_ref"), q(DELETED_AT_COLUMN)
        join, entry = self.provenance_entries("c")
        where, params = ("", ()) if run_id is None else (f" WHERE t.{q('_bos_run_id')} = {self.placeholder}",
                                                         (run_id,))
        rows = (f"(SELECT t.{ref}, t.{q('sources')}, t.{deleted} FROM {self.table_ref(target, schema)} t"
                f"{where}{self._fence()}) c")
        columns = ", ".join((ref, *ENTRY_COLUMNS, "is_current"))
        values = ", ".join((f"c.{ref}", *(entry[c] for c in ENTRY_COLUMNS), f"(c.{deleted} IS NULL)"))
        return Statement(
            f"INSERT INTO {self.table_ref(sources, schema)} ({columns}) SELECT {values} FROM {rows}{join}",
            params,
        )

    def refs_with_external_id(self, table: str, schema: str | None, source: str, ids: list[str], *,
                              by: str = "source_identity") -> Statement:
        """The record_refs of the rows of ``table`` (the records table or its history) holding a
        provenance entry whose ``by`` (``source_identity``, or ``source_type`` when a request asks for
        every source of a type) is ``source`` and whose external_id is one of ``ids``, each compared
        exactly (:meth:`_texts_exactly_in`), the entries expanded from the stored ``sources`` (an
        erasure's finder, for ids a policy hashes: every stored id is then a hash, a text)."""
        if by not in ("source_identity", "source_type"):  # pragma: no cover - a caller's typo
            raise ValueError(by)
        q = self.quote
        ref = q("record_ref")
        join, entry = self.provenance_entries("c")
        source_is, source_params = self._texts_exactly_in(entry[by], [source])
        id_is, id_params = self._texts_exactly_in(entry["external_id"], ids)
        return Statement(
            f"SELECT DISTINCT c.{ref} FROM (SELECT t.{ref}, t.{q('sources')} FROM {self.table_ref(table, schema)} t) c"
            f"{join} WHERE {source_is} AND {id_is}",
            (*source_params, *id_params),
        )

    def _texts_exactly_in(self, expression: str, values: Sequence[str]) -> tuple[str, tuple[str | int, ...]]:
        """SQL true where the text ``expression`` is one of ``values`` exactly (bound), and its parameters.

        Plain ``IN`` where text compares by its characters; a dialect whose collation ignores case or
        trailing spaces (MySQL/MariaDB) says more."""
        return f"{expression} IN ({', '.join(self.placeholder for _ in values)})", tuple(values)

    def clear_provenance(self, sources: str, target: str, schema: str | None, *, run_id: str) -> Statement:
        """Delete the entries of the rows ``run_id`` wrote (:meth:`write_provenance` writes them anew)."""
        ref = self.quote("record_ref")
        return Statement(
            f"DELETE FROM {self.table_ref(sources, schema)} WHERE {ref} IN (SELECT t.{ref} FROM "
            f"{self.table_ref(target, schema)} t WHERE t.{self.quote('_bos_run_id')} = {self.placeholder})",
            (run_id,),
        )

    def probe_other_rows(self, target: str, schema: str | None, *, run_id: str) -> Statement:
        """One row if ``target`` holds a row that run ``run_id`` did not write."""
        run = f"t.{self.quote('_bos_run_id')}"
        return Statement(
            f"SELECT 1 FROM {self.table_ref(target, schema)} t WHERE {run} IS NULL OR {run} <> {self.placeholder} "
            "LIMIT 1",
            (run_id,),
        )

    def delete_all(self, table: str, schema: str | None) -> Statement:
        """Delete every row of ``table`` (in the transaction: not TRUNCATE, which commits on some)."""
        return Statement(f"DELETE FROM {self.table_ref(table, schema)}")

    def retire_provenance(self, sources: str, keys: str, schema: str | None) -> Statement:
        """Mark the entries of the rows listed in ``keys`` no longer current (their rows were retired)."""
        ref = self.quote("record_ref")
        return Statement(
            f"UPDATE {self.table_ref(sources, schema)} SET is_current = FALSE "
            f"WHERE {ref} IN (SELECT k.{ref} FROM {self.stage_ref(keys, schema)} k)"
        )

    # --- supersede ----------------------------------------------------------------------------

    def collect_candidates(self, candidates: str, sources: str, schema: str | None) -> Statement:
        """Into ``candidates``: the current rows holding an entry another current row holds too.

        Only such a row can be superseded. The entries held more than once (usually none) come
        from one ordered pass over the entry index; their rows are then looked up by entry.
        """
        ref, sources_ref = self.quote("record_ref"), self.table_ref(sources, schema)
        entry = ", ".join(f"g.{c}" for c in PROVENANCE_KEY)
        shared = (f"(SELECT {entry} FROM {sources_ref} g WHERE g.is_current GROUP BY {entry} "
                  f"HAVING COUNT(*) > 1{self._fence()}) d")
        return Statement(
            f"INSERT INTO {self.stage_ref(candidates, schema)} ({ref}) SELECT DISTINCT x.{ref} FROM {shared} "
            # As the index matches: a group stands for every spelling it took in, and a row too many
            # is only looked at (the next steps compare entries exactly).
            f"JOIN {sources_ref} x ON {self._entries_match('x', 'd')} WHERE x.is_current"
        )

    def collect_others(
        self, others: str, candidates: str, keys: RunKeys, target: str, sources: str, schema: str | None, *,
        observed_before: datetime,
    ) -> Statement:
        """Into ``others``: every entry of each of the ``candidates`` the result did not return, observed
        no later than the read (an older read never supersedes a newer row)."""
        ref, obs, cols = self.quote("record_ref"), self.quote("_bos_observed_at"), ", ".join(PROVENANCE_KEY)
        return Statement(
            f"INSERT INTO {self.stage_ref(others, schema)} ({ref}, {cols}) "
            f"SELECT o.{ref}, {', '.join(f'o.{c}' for c in PROVENANCE_KEY)} FROM {self.table_ref(sources, schema)} o "
            f"JOIN {self.table_ref(target, schema)} t ON t.{ref} = o.{ref} "
            f"WHERE o.is_current AND o.{ref} IN (SELECT c.{ref} FROM {self.stage_ref(candidates, schema)} c) "
            f"AND t.{obs} <= {self.placeholder} AND {self._not_returned(keys, schema, 'o')}",
            (self.bind_timestamp(observed_before),),
        )

    def entry_lookup_settings(self) -> list[Statement]:
        """Statements run before :meth:`collect_candidates` (and :meth:`reconcile_settings` again after it)."""
        return []

    def withhold_revivals(self, source: str, target: str, schema: str | None, *, observed_before: datetime,
                          ) -> Statement:
        """Remove from ``source`` (staging) the records whose row a newer read retired: a read observed
        before a row's ``_bos_deleted_at`` does not bring it back (a late retry or a backfill)."""
        ref, deleted = self.quote("record_ref"), self.quote(DELETED_AT_COLUMN)
        return Statement(
            f"DELETE FROM {self.stage_ref(source, schema)} WHERE {ref} IN (SELECT t.{ref} FROM "
            f"{self.table_ref(target, schema)} t WHERE t.{deleted} IS NOT NULL AND t.{deleted} > {self.placeholder})",
            (self.bind_timestamp(observed_before),),
        )

    def withhold_merged_away(self, source: str, target: str, schema: str | None) -> Statement:
        """Remove from ``source`` the records whose row a complete read superseded while its successor
        is still current: a partial read's fragment under an old ref does not bring that ref back."""
        ref, deleted, by = self.quote("record_ref"), self.quote(DELETED_AT_COLUMN), self.quote(SUPERSEDED_BY_COLUMN)
        target_ref = self.table_ref(target, schema)
        return Statement(
            f"DELETE FROM {self.stage_ref(source, schema)} WHERE {ref} IN (SELECT t.{ref} FROM {target_ref} t "
            f"JOIN {target_ref} n ON n.{ref} = t.{by} WHERE t.{deleted} IS NOT NULL AND n.{deleted} IS NULL)"
        )

    def withhold_answered(self, source: str, target: str, audit: str, schema: str | None, *,
                          scope: ScopeFilter) -> Statement:
        """Remove from ``source`` every decoded record a newer complete read of ``scope`` answered for:
        all but those whose row is current and either holds the same content (they count unchanged)
        or was written by another scope. A read older than its scope's newest complete read changes,
        inserts and revives nothing that read confirmed or left out."""
        ref, deleted, h = self.quote("record_ref"), self.quote(DELETED_AT_COLUMN), self.quote("_bos_record_hash")
        stage, target_ref = self.stage_ref(source, schema), self.table_ref(target, schema)
        other_scope, params = self._written_by_scope("t", audit, schema, scope, negate=True)
        return Statement(
            f"DELETE FROM {stage} WHERE {stage}.{h} IS NOT NULL "
            f"AND {ref} NOT IN (SELECT t.{ref} FROM {target_ref} t WHERE t.{deleted} IS NULL AND {other_scope}) "
            f"AND NOT EXISTS (SELECT 1 FROM {target_ref} u WHERE u.{ref} = {stage}.{ref} "
            f"AND u.{h} = {stage}.{h} AND u.{deleted} IS NULL)",
            params,
        )

    def scope_confirmed_at(self, audit: str, schema: str | None, scope: str) -> Statement:
        """One value: the read time of the scope's newest complete full read (NULL if none)."""
        confirmed = self.quote(CONFIRMED_AT_COLUMN)
        return Statement(
            f"SELECT MAX(a.{confirmed}) FROM {self.table_ref(audit, schema)} a "
            f"WHERE a.{self.quote(SCOPE_COLUMN)} = {self.placeholder}",
            (scope,),
        )

    def last_confirmed(self, target: str, audit: str, schema: str | None) -> Statement:
        """Rows ``(record_ref, _bos_observed_at, confirmed_at)`` of every current row: when its content
        was observed, and the newest ``confirmed_at`` of its scope (NULL if no complete full read of
        that scope confirmed it). A row was last confirmed at the later of the two."""
        ref, obs, run = self.quote("record_ref"), self.quote("_bos_observed_at"), self.quote("_bos_run_id")
        scope, confirmed = self.quote(SCOPE_COLUMN), self.quote(CONFIRMED_AT_COLUMN)
        audit_ref = self.table_ref(audit, schema)
        return Statement(
            f"SELECT t.{ref}, t.{obs}, c.newest FROM {self.table_ref(target, schema)} t "
            f"LEFT JOIN {audit_ref} w ON w.run_id = t.{run} "
            f"LEFT JOIN (SELECT a.{scope} AS scope_key, MAX(a.{confirmed}) AS newest FROM {audit_ref} a "
            f"WHERE a.{confirmed} IS NOT NULL GROUP BY a.{scope}) c ON c.scope_key = w.{scope} "
            f"WHERE {self._current('t')}"
        )

    def adopt_into_scope(self, target: str, audit: str, schema: str | None, *, scope: ScopeFilter, run_id: str,
                         keys: RunKeys | None) -> Statement:
        """Give this run the current rows it returned (every current row when ``keys`` is None) that a
        run of another scope wrote: a complete full read's scope holds what it returned, so its next
        read retires them when they leave. Content and ``_bos_synced_at`` stay: nothing changed."""
        run = self.quote("_bos_run_id")
        target_ref = self.table_ref(target, schema)
        other_scope, params = self._written_by_scope(target_ref, audit, schema, scope, negate=True)
        returned = "" if keys is None else f" AND {self._returned(keys, schema, target_ref)}"
        return Statement(
            f"UPDATE {target_ref} SET {run} = {self.placeholder} WHERE {self._current(target_ref)} "
            f"AND {target_ref}.{run} <> {self.placeholder} AND {other_scope}{returned}",
            (run_id, run_id, *params),
        )

    def collect_successors(
        self, successors: str, others: str, keys: RunKeys, sources: str, schema: str | None,
    ) -> Statement:
        """Into ``successors``: the entries of the result's current rows that some row of ``others``
        also has, each held by one row of the result only (see :meth:`count_shared_entries`)."""
        ref, cols = self.quote("record_ref"), ", ".join(PROVENANCE_KEY)
        sources_ref = self.table_ref(sources, schema)
        held = self._current_entries_held_by(self.stage_ref(others, schema), sources_ref)
        return Statement(
            f"INSERT INTO {self.stage_ref(successors, schema)} ({ref}, {cols}) {held} "
            f"AND {self._returned(keys, schema, 'r')} AND NOT EXISTS (SELECT 1 FROM {sources_ref} r2 "
            f"WHERE r2.is_current AND {self._keys_equal('r2', 'r')} AND r2.{ref} <> r.{ref} "
            f"AND {self._returned(keys, schema, 'r2')})"
        )

    def count_shared_entries(self, others: str, keys: RunKeys, sources: str, schema: str | None) -> Statement:
        """One value: how many entries that some row of ``others`` has are held by more than one row of
        the result. BOS merges a source's record into one final record, so such a result contradicts
        itself: nothing is superseded through those entries (R records on one entry would otherwise
        make R x R lineage rows)."""
        ref, cols = self.quote("record_ref"), ", ".join(f"r.{c}" for c in PROVENANCE_KEY)
        held = self._current_entries_held_by(self.stage_ref(others, schema), self.table_ref(sources, schema))
        return Statement(
            f"SELECT COUNT(*) FROM (SELECT {cols} FROM ({held} AND {self._returned(keys, schema, 'r')}) r "
            f"GROUP BY {cols} HAVING COUNT(DISTINCT r.{ref}) > 1) g"
        )

    def _current_entries_held_by(self, others: str, sources: str) -> str:
        """``SELECT`` of the current entries ``r`` of ``sources`` that some row ``o`` of ``others`` also
        has (record_ref and the entry), ending in its ``WHERE`` conditions."""
        entry = ", ".join(f"r.{c}" for c in (self.quote("record_ref"), *PROVENANCE_KEY))
        return (f"SELECT {entry} FROM {sources} r WHERE r.is_current "
                f"AND EXISTS (SELECT 1 FROM {others} o WHERE {self._keys_equal('o', 'r')})")

    def pick_superseded(self, superseded: str, others: str, successors: str, schema: str | None) -> Statement:
        """Into ``superseded``: each row of ``others`` whose every entry is in ``successors``, with
        the smallest successor record_ref (a split's deterministic choice)."""
        ref = self.quote("record_ref")
        return Statement(
            f"INSERT INTO {self.stage_ref(superseded, schema)} ({ref}, successor_ref) "
            f"SELECT o.{ref}, MIN(n.{ref}) FROM {self.stage_ref(others, schema)} o "
            f"LEFT JOIN {self.stage_ref(successors, schema)} n ON {self._keys_equal('n', 'o')} "
            f"GROUP BY o.{ref} HAVING COUNT(*) = COUNT(n.{ref})"
        )

    def insert_lineage(
        self, lineage: str, others: str, successors: str, superseded: str, schema: str | None, *,
        run_id: str, recorded_at: datetime,
    ) -> Statement:
        """Into ``<table>_lineage``: every (superseded ref, successor ref) pair of this run."""
        ref = self.quote("record_ref")
        return Statement(
            f"INSERT INTO {self.table_ref(lineage, schema)} (run_id, {ref}, successor_ref, recorded_at) "
            f"SELECT DISTINCT {self.bind_id()}, o.{ref}, n.{ref}, {self.bind_ts()} "
            f"FROM {self.stage_ref(others, schema)} o JOIN {self.stage_ref(successors, schema)} n "
            f"ON {self._keys_equal('n', 'o')} "
            f"WHERE o.{ref} IN (SELECT x.{ref} FROM {self.stage_ref(superseded, schema)} x)",
            (run_id, self.bind_timestamp(recorded_at)),
        )

    # --- retire -------------------------------------------------------------------------------

    def _written_by_scope(self, t: str, audit: str, schema: str | None, scope: ScopeFilter, *,
                          negate: bool = False) -> tuple[str, tuple[Any, ...]]:
        """The condition "row ``t`` was written by a run of ``scope``" (``negate``: by no run of it), and
        its parameters."""
        p, s = self.placeholder, self.quote(SCOPE_COLUMN)
        sql = f"SELECT a.run_id FROM {self.table_ref(audit, schema)} a WHERE a.{s} = {p}"
        params: list[Any] = [scope.scope]
        if scope.legacy is not None:
            parts = [f"a.{s} IS NULL"]
            for column, value in scope.legacy.items():
                if value is None:
                    parts.append(f"a.{self.quote(column)} IS NULL")
                else:
                    parts.append(f"a.{self.quote(column)} = {p}")
                    params.append(value)
            sql += f" OR ({' AND '.join(parts)})"
        return f"{t}.{self.quote('_bos_run_id')} {'NOT IN' if negate else 'IN'} ({sql})", tuple(params)

    def collect_retired(
        self, retired: str, keys: RunKeys, target: str, audit: str, schema: str | None, *, scope: ScopeFilter,
        observed_before: datetime,
    ) -> Statement:
        """Into ``retired``: the current rows of the scope that the result did not return and that
        were observed no later than the read (a backfill never retires a newer row)."""
        ref, obs = self.quote("record_ref"), self.quote("_bos_observed_at")
        in_scope, params = self._written_by_scope("t", audit, schema, scope)
        return Statement(
            f"INSERT INTO {self.stage_ref(retired, schema)} ({ref}) "
            f"SELECT t.{ref} FROM {self.table_ref(target, schema)} t "
            f"WHERE {self._current('t')} AND t.{obs} <= {self.placeholder} "
            f"AND {in_scope} AND {self._not_returned(keys, schema)}",
            (self.bind_timestamp(observed_before), *params),
        )

    def count_scope_rows(
        self, target: str, audit: str, schema: str | None, *, scope: ScopeFilter, run_id: str,
    ) -> Statement:
        """One value: the scope's current rows (this run's writes included)."""
        in_scope, params = self._written_by_scope("t", audit, schema, scope)
        return Statement(
            f"SELECT COUNT(*) FROM {self.table_ref(target, schema)} t "
            f"WHERE {self._current('t')} AND (t.{self.quote('_bos_run_id')} = {self.placeholder} OR {in_scope})",
            (run_id, *params),
        )

    # --- marking rows -------------------------------------------------------------------------

    def mark_retired(
        self, target: str, keys: str, schema: str | None, *, successor: bool, retired_at: datetime,
        synced_at: datetime, run_id: str,
    ) -> Statement:
        """Retire the target's rows listed in ``keys`` (soft): ``_bos_deleted_at`` set to ``retired_at``
        (when the read saw them gone), with ``_bos_superseded_by`` from ``keys.successor_ref`` when
        ``successor``; the run owns them now (``_bos_run_id``, ``_bos_synced_at``)."""
        q = self.quote
        ref = q("record_ref")
        target_ref, keys_ref = self.table_ref(target, schema), self.stage_ref(keys, schema)
        sets = [f"{q(DELETED_AT_COLUMN)} = {self.placeholder}"]
        if successor:
            sets.append(f"{q(SUPERSEDED_BY_COLUMN)} = (SELECT k.successor_ref FROM {keys_ref} k "
                        f"WHERE k.{ref} = {target_ref}.{ref})")
        sets += [f"{q('_bos_run_id')} = {self.placeholder}", f"{q('_bos_synced_at')} = {self.placeholder}"]
        return Statement(
            f"UPDATE {target_ref} SET {', '.join(sets)} WHERE {ref} IN (SELECT k.{ref} FROM {keys_ref} k)",
            (self.bind_timestamp(retired_at), run_id, self.bind_timestamp(synced_at)),
        )

    def delete_listed(self, target: str, keys: str, schema: str | None) -> Statement:
        """Delete the target's rows listed in ``keys`` (``deletions="hard"``)."""
        ref = self.quote("record_ref")
        return Statement(
            f"DELETE FROM {self.table_ref(target, schema)} "
            f"WHERE {ref} IN (SELECT k.{ref} FROM {self.stage_ref(keys, schema)} k)"
        )

    # --- history ------------------------------------------------------------------------------

    def _history_columns(self, carried: Sequence[str] = ()) -> str:
        return ", ".join(self.quote(c) for c in (*HISTORY_CONTENT_COLUMNS, *carried))

    def _history_tail(self) -> str:
        return ", ".join(self.quote(c) for c in ("_bos_valid_from", "_bos_valid_to", "_bos_run_id"))

    def history_seed(self, history: str, target: str, schema: str | None, carried: Sequence[str] = ()) -> Statement:
        """A first version of every current row, valid from its last write (the history of a table
        that existed before ``history=True``; run before the run loads anything). ``carried``: more
        columns both tables have (the promoted attributes)."""
        cols = self._history_columns(carried)
        select = ", ".join(f"t.{self.quote(c)}" for c in (*HISTORY_CONTENT_COLUMNS, *carried))
        return Statement(
            f"INSERT INTO {self.table_ref(history, schema)} ({cols}, {self._history_tail()}) "
            f"SELECT {select}, t.{self.quote('_bos_synced_at')}, NULL, t.{self.quote('_bos_run_id')} "
            f"FROM {self.table_ref(target, schema)} t WHERE {self._current('t')}"
        )

    def history_close(self, history: str, target: str, schema: str | None, *, run_id: str,
                      closed_at: datetime) -> Statement:
        """Close the open version of every row this run wrote, retired or superseded."""
        ref, to = self.quote("record_ref"), self.quote("_bos_valid_to")
        return Statement(
            f"UPDATE {self.table_ref(history, schema)} SET {to} = {self.placeholder} "
            f"WHERE {to} IS NULL AND {ref} IN (SELECT t.{ref} FROM {self.table_ref(target, schema)} t "
            f"WHERE t.{self.quote('_bos_run_id')} = {self.placeholder})",
            (self.bind_timestamp(closed_at), run_id),
        )

    def history_close_listed(self, history: str, keys: str, schema: str | None, *, closed_at: datetime) -> Statement:
        """Close the open version of every row listed in ``keys`` (rows a hard deletion is about to delete:
        :meth:`history_close` finds rows by their run, and a deleted row has none)."""
        ref, to = self.quote("record_ref"), self.quote("_bos_valid_to")
        return Statement(
            f"UPDATE {self.table_ref(history, schema)} SET {to} = {self.placeholder} "
            f"WHERE {to} IS NULL AND {ref} IN (SELECT k.{ref} FROM {self.stage_ref(keys, schema)} k)",
            (self.bind_timestamp(closed_at),),
        )

    def history_open(self, history: str, target: str, schema: str | None, *, run_id: str,
                     opened_at: datetime, carried: Sequence[str] = ()) -> Statement:
        """A new open version of every current row this run wrote (inserted, updated, back again)."""
        select = ", ".join(f"t.{self.quote(c)}" for c in (*HISTORY_CONTENT_COLUMNS, *carried))
        return Statement(
            f"INSERT INTO {self.table_ref(history, schema)} ({self._history_columns(carried)}, {self._history_tail()}) "
            f"SELECT {select}, {self.bind_ts()}, NULL, {self.bind_id()} FROM {self.table_ref(target, schema)} t "
            f"WHERE t.{self.quote('_bos_run_id')} = {self.placeholder} AND {self._current('t')}",
            (self.bind_timestamp(opened_at), run_id, run_id),
        )

    # --- erasure ------------------------------------------------------------------------------

    def delete_refs(self, table: str, schema: str | None, column: str, refs: Sequence[str]) -> Statement:
        """Delete the rows of ``table`` whose ``column`` is one of ``refs`` (bound values)."""
        marks = ", ".join([self.placeholder] * len(refs))
        return Statement(
            f"DELETE FROM {self.table_ref(table, schema)} WHERE {self.quote(column)} IN ({marks})", tuple(refs),
        )

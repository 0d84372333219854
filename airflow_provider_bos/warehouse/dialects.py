"""Dialect objects that BUILD the warehouse SQL; :mod:`.upsert` executes it.

Kept apart from execution (like dlt's ``sql_jobs`` and Airflow's ``common.sql`` dialects) so each
statement can be read and tested on its own. Every identifier reaching SQL text has passed
:func:`.identifiers.validate_identifier` and is quoted by the database's own preparer; every value
is a bound parameter.

The write of one run, in SQL terms:

1. ``create_staging`` - a TEMPORARY table named per run; rows go in by COPY (PostgreSQL + psycopg)
   or chunked ``executemany`` (everything else), each row tagged with its arrival ``_bos_seq``.
2. ``count_distinct`` - duplicates = staged rows - distinct ``record_ref``; only when there are
   duplicates, ``dedupe`` copies one winner per ``record_ref`` into a second staging table with a
   primary key: the latest ``_bos_observed_at`` wins, ties go to the last occurrence.
3. ``lock`` - writers of the same table are serialised so the counts stay exact.
4. ``classify`` - one join of staging against the target gives inserted / updated / unchanged /
   skipped_stale using the very predicates the merge uses.
5. ``merge`` - PostgreSQL and SQLite: one ``INSERT ... SELECT ... ON CONFLICT DO UPDATE ... WHERE``;
   MySQL/MariaDB: ``UPDATE ... JOIN`` then ``INSERT ... SELECT ... LEFT JOIN ... IS NULL``. The
   guard (stored row not newer AND hash differs) lives in SQL, so unchanged rows are never rewritten.
"""

from __future__ import annotations

import abc
import hashlib
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse.identifiers import validate_identifier, validate_schema
from airflow_provider_bos.warehouse.schema import RECORD_COLUMNS, WIRE_HASH_COLUMN, column_types

__all__ = [
    "DOCUMENT_STAGE_COLUMNS",
    "STAGE_COLUMNS",
    "Statement",
    "TargetCopyLines",
    "WarehouseDialect",
    "PostgresDialect",
    "MySqlDialect",
    "SqliteDialect",
    "dialect_for",
    "staging_table_name",
]

# Staged per row; _bos_synced_at and _bos_run_id are the same for the whole run and are bound once
# in the merge instead of travelling with every row.
#
# A *known* row (a KnownRecord: the record was not decoded because its wire hash is stored) has only
# record_ref, _bos_wire_hash and _bos_seq; every other staged column is NULL, and _bos_record_hash IS
# NULL is what marks it. Classification verifies it against the stored row and counts it unchanged;
# no merge ever writes it.
STAGE_COLUMNS = (
    *(c for c in RECORD_COLUMNS if c not in ("_bos_synced_at", "_bos_run_id")),
    WIRE_HASH_COLUMN,
    "_bos_seq",
)
_KNOWN_NULLS = (None,) * (len(STAGE_COLUMNS) - 3)  # all but record_ref, the wire hash and _bos_seq
# Document staging (PostgreSQL with COPY): the key, the guards and the hashed document; the content
# columns are derived from the document in SQL, and only for the rows actually written.
DOCUMENT_STAGE_COLUMNS = (
    "record_ref", "_bos_doc", "_bos_observed_at", "_bos_record_hash", WIRE_HASH_COLUMN, "_bos_seq",
)


@dataclass(frozen=True, slots=True)
class Statement:
    """SQL text in the driver's paramstyle plus its positional parameters."""

    sql: str
    params: tuple[Any, ...] = ()


def staging_table_name(run_id: str, suffix: str = "") -> str:
    """The per-run staging table name (a valid identifier whatever the run id looks like)."""
    digest = hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:16]
    return validate_identifier(f"bos_stage_{digest}{suffix}")


class WarehouseDialect(abc.ABC):
    """SQL builder for one database family. Subclasses override what differs."""

    name = "generic"
    # Rows of a stage chunk never need more bind parameters than this in one statement.
    max_bind_params = 32766
    uses_copy = False
    # Take the writer lock before staging instead of just before counting (see MySqlDialect).
    lock_before_staging = False
    # Isolation the run's connection is put in (None: leave the engine's).
    isolation_level: str | None = None
    # Stage (record_ref, document, observed_at, hash) instead of one column per field.
    document_staging = False
    # The target table has the _bos_wire_hash column (set by the writer once it has looked; tables
    # made before it existed sync without it, and without skipping known records).
    wire_hash_column = True
    # An empty target may be loaded directly (see PostgresDialect.copy_target).
    direct_load = False

    @property
    def written_columns(self) -> tuple[str, ...]:
        """The target's columns this run writes, in insert order."""
        return (*RECORD_COLUMNS, WIRE_HASH_COLUMN) if self.wire_hash_column else RECORD_COLUMNS

    @property
    def updated_columns(self) -> tuple[str, ...]:
        return tuple(c for c in self.written_columns if c != "record_ref")

    def _written_column_list(self) -> str:
        """The INSERT column list of the target (quoted, comma-separated)."""
        return ", ".join(self.quote(c) for c in self.written_columns)

    @property
    def stage_columns(self) -> tuple[str, ...]:
        """The staged columns, in the order rows are written to staging."""
        return DOCUMENT_STAGE_COLUMNS if self.document_staging else STAGE_COLUMNS

    def __init__(self, sa_dialect: sa.Dialect) -> None:
        self.sa_dialect = sa_dialect
        self._preparer = sa_dialect.identifier_preparer
        style = sa_dialect.paramstyle
        if style == "qmark":
            self.placeholder = "?"
        elif style in ("format", "pyformat"):
            self.placeholder = "%s"
        else:  # pragma: no cover - no supported driver uses another style
            raise BosWarehouseError(f"Unsupported DB-API paramstyle {style!r} for driver {sa_dialect.driver!r}.")
        self.types = column_types(self.name)

    # --- identifiers ------------------------------------------------------------------------

    def quote(self, identifier: str) -> str:
        return self._preparer.quote(validate_identifier(identifier))

    def table_ref(self, table: str, schema: str | None) -> str:
        schema = validate_schema(schema, self.name)
        quoted = self.quote(table)
        return f"{self.quote(schema)}.{quoted}" if schema else quoted

    def stage_ref(self, stage: str, schema: str | None) -> str:
        return self.quote(stage)

    def type_sql(self, role: str) -> str:
        return self.types[role].compile(dialect=self.sa_dialect)

    # --- values -----------------------------------------------------------------------------

    def bind_timestamp(self, value: datetime) -> Any:
        """The parameter value for an aware UTC datetime."""
        return value

    def bind_json(self) -> str:
        """Placeholder for a JSON text value."""
        return self.placeholder

    def bind_ts(self) -> str:
        """Placeholder for a timestamp value inside a SELECT list (needs a type on some dialects)."""
        return self.placeholder

    def bind_id(self) -> str:
        return self.placeholder

    # --- transaction framing ------------------------------------------------------------------

    def begin(self) -> list[Statement]:
        """Statements that open the run's transaction (after the driver's implicit BEGIN)."""
        return []

    def lock(self, target: str, *, timeout_s: float) -> list[Statement]:
        """Serialise writers of ``target`` until the transaction ends (or :meth:`unlock`)."""
        return []

    def lock_is_flag(self) -> bool:
        """True when the last :meth:`lock` statement is a SELECT whose single value must be 1."""
        return False

    def unlock(self, target: str) -> Statement | None:
        return None

    # --- staging ------------------------------------------------------------------------------

    def _stage_column_defs(self, *, with_seq: bool, parse_json: bool = False) -> list[str]:
        roles = {
            "record_ref": "key",
            "display_name": "text",
            "email": "text",
            "phone": "text",
            "lifecycle": "json",
            "identity_match": "json",
            "attributes": "json",
            "sources": "json",
            "_bos_observed_at": "ts",
            "_bos_record_hash": "hash",
            WIRE_HASH_COLUMN: "hash",
        }
        # Only the key is required: a known row (see STAGE_COLUMNS) has nothing else.
        defs = [
            f"{self.quote(col)} {self.type_sql(role)}{' NOT NULL' if col == 'record_ref' else ''}"
            for col, role in roles.items()
        ]
        if with_seq:
            defs.append(f"{self.quote('_bos_seq')} BIGINT NOT NULL")
        return defs

    def _temp_prefix(self) -> str:
        return "CREATE TEMPORARY TABLE"

    def _temp_suffix(self) -> str:
        return ""

    def create_staging(self, stage: str, schema: str | None, *, parse_json: bool = False) -> Statement:
        """The raw staging table (duplicates allowed, rows tagged with ``_bos_seq``).

        ``parse_json``: a hint that most rows will be written (e.g. the target is empty), so a
        dialect that stages JSON as text may parse it while staging instead (PostgreSQL).
        """
        cols = ", ".join(self._stage_column_defs(with_seq=True, parse_json=parse_json))
        return Statement(f"{self._temp_prefix()} {self.stage_ref(stage, schema)} ({cols}){self._temp_suffix()}")

    def create_deduped(self, stage: str, schema: str | None, *, parse_json: bool = False) -> Statement:
        """The second staging table: one row per ``record_ref``."""
        cols = self._stage_column_defs(with_seq=False, parse_json=parse_json)
        cols.append(f"PRIMARY KEY ({self.quote('record_ref')})")
        return Statement(
            f"{self._temp_prefix()} {self.stage_ref(stage, schema)} ({', '.join(cols)}){self._temp_suffix()}"
        )

    def drop_staging(self, stage: str, schema: str | None) -> Statement:
        return Statement(f"DROP TABLE IF EXISTS {self.stage_ref(stage, schema)}")

    def probe_empty(self, target: str) -> Statement:
        """One row if ``target`` has any row (a staging hint only; decisions are made under the lock)."""
        return Statement(f"SELECT 1 FROM {target} LIMIT 1")

    def insert_staging(self, stage: str, schema: str | None) -> Statement:
        """Single-row INSERT for ``executemany`` (one bind per column)."""
        cols = ", ".join(self.quote(c) for c in STAGE_COLUMNS)
        marks = ", ".join([self.placeholder] * len(STAGE_COLUMNS))
        return Statement(f"INSERT INTO {self.stage_ref(stage, schema)} ({cols}) VALUES ({marks})")

    def rows_per_statement(self, columns: int = len(STAGE_COLUMNS)) -> int:
        """Most rows one multi-row VALUES statement may carry within the bind-parameter limit."""
        return max(1, self.max_bind_params // columns)

    def stage_value(self, row: Any, seq: int, wire_hash: str | None = None) -> tuple[Any, ...]:
        """The column-staged tuple of a :class:`~.records.RecordRow`, in :data:`STAGE_COLUMNS` order."""
        return (
            row.record_ref,
            row.display_name,
            row.email,
            row.phone,
            row.lifecycle,
            row.identity_match,
            row.attributes,
            row.sources,
            self.bind_timestamp(row.observed_at),
            row.record_hash,
            wire_hash,
            seq,
        )

    @staticmethod
    def known_value(record_ref: str, wire_hash: str, seq: int) -> tuple[Any, ...]:
        """The column-staged tuple of a known row (:data:`STAGE_COLUMNS` order)."""
        return (record_ref, *_KNOWN_NULLS, wire_hash, seq)

    # --- known records -----------------------------------------------------------------------

    #: :meth:`wire_hash_prefixes` returns ONE value (all prefixes, sorted, concatenated), not rows.
    wire_hash_prefixes_aggregated = False

    def wire_hash_prefixes(self, target: str, schema: str | None) -> Statement:
        """The first 16 hex digits of every stored wire hash (one per row)."""
        w = self.quote(WIRE_HASH_COLUMN)
        return Statement(f"SELECT SUBSTR({w}, 1, 16) FROM {self.table_ref(target, schema)} WHERE {w} IS NOT NULL")

    def count_distinct(self, stage: str, schema: str | None) -> Statement:
        return Statement(f"SELECT COUNT(DISTINCT {self.quote('record_ref')}) FROM {self.stage_ref(stage, schema)}")

    def staged_key_counts(self, stage: str, schema: str | None, keys: Sequence[str]) -> Statement:
        """Rows ``(record_ref, staged rows)`` for those of ``keys`` that are staged."""
        ref = self.quote("record_ref")
        marks = ", ".join([self.placeholder] * len(keys))
        return Statement(
            f"SELECT {ref}, COUNT(*) FROM {self.stage_ref(stage, schema)} WHERE {ref} IN ({marks}) GROUP BY {ref}",
            tuple(keys),
        )

    def staged_stored_prefixes(self, stage: str, target: str, schema: str | None) -> Statement:
        """The first 16 hex digits of the stored wire hash of every staged record_ref that is stored."""
        ref, w = self.quote("record_ref"), self.quote(WIRE_HASH_COLUMN)
        return Statement(
            f"SELECT SUBSTR(t.{w}, 1, 16) FROM {self.stage_ref(stage, schema)} s "
            f"JOIN {self.table_ref(target, schema)} t ON t.{ref} = s.{ref} WHERE t.{w} IS NOT NULL"
        )

    def stored_wire_state(self, target: str, schema: str | None) -> Statement | None:
        """One row: a token of every stored (record_ref, wire hash) pair, as :meth:`wire_hash_prefixes`
        also returns it in its second and third columns; None if the database has no such digest
        (claims are then always staged and verified row by row)."""
        return None

    def stage_claims(
        self, stage: str, target: str, schema: str | None, prefixes: Sequence[str], seqs: Sequence[int],
    ) -> Statement | None:
        """Stage, as known rows, the stored rows whose wire hash starts with one of ``prefixes``
        (``seqs``: the position in the read of each one's claim); None where
        :meth:`stored_wire_state` is None (claims are never kept out of staging there)."""
        return None

    def dedupe(self, src: str, dst: str, schema: str | None, target: str) -> Statement:
        """Copy the winner of each ``record_ref`` from ``src`` into ``dst``.

        Winner: latest ``_bos_observed_at``; on a tie, the last occurrence (highest ``_bos_seq``).
        A known row's observed_at is the stored row's (same bytes, same content).
        ``src`` is read once (MySQL cannot reopen a temporary table within one statement).
        """
        q = self.quote
        cols = [c for c in self.stage_columns if c != "_bos_seq"]
        col_list = ", ".join(q(c) for c in cols)
        ref, obs = q("record_ref"), q("_bos_observed_at")
        observed = (
            f"COALESCE(s.{obs}, (SELECT t.{obs} FROM {self.table_ref(target, schema)} t WHERE t.{ref} = s.{ref}))"
        )
        return Statement(
            f"INSERT INTO {self.stage_ref(dst, schema)} ({col_list}) "
            f"SELECT {col_list} FROM (SELECT {', '.join(f's.{q(c)}' for c in cols)}, ROW_NUMBER() OVER ("
            f"PARTITION BY s.{ref} ORDER BY {observed} DESC, s.{q('_bos_seq')} DESC"
            f") AS bos_rn FROM {self.stage_ref(src, schema)} s) ranked WHERE bos_rn = 1"
        )

    # --- guards shared by classification and merge ----------------------------------------------

    def _hash_differs(self, old: str, new: str) -> str:
        return f"{old} IS DISTINCT FROM {new}"

    def _stale(self, t: str, s: str) -> str:
        obs = self.quote("_bos_observed_at")
        return f"({t}.{obs} IS NOT NULL AND {s}.{obs} < {t}.{obs})"

    def _write_allowed(self, t: str, s: str) -> str:
        obs = self.quote("_bos_observed_at")
        return f"({t}.{obs} IS NULL OR {t}.{obs} <= {s}.{obs})"

    def _changed(self, t: str, s: str) -> str:
        h = self.quote("_bos_record_hash")
        return f"({self._hash_differs(f'{t}.{h}', f'{s}.{h}')})"

    def _decoded(self, s: str) -> str:
        """True for a staged row that carries its content (false for a known row)."""
        return f"{s}.{self.quote('_bos_record_hash')} IS NOT NULL"

    def _index_hint(self, index: str | None) -> str:
        """Text after the target's alias forcing ``index`` for the change test ("" where unsupported)."""
        return ""

    def classify(self, stage: str, target: str, schema: str | None, *, index: str | None = None) -> Statement:
        """One row: inserted, updated, unchanged, skipped_stale (over a duplicate-free stage), unverified.

        A known row counts as unchanged; ``unverified`` counts the known rows whose stored row is
        gone or has another wire hash (the writer refuses to commit those: their content is not
        staged). ``index``: a covering index of the target for the join (see :meth:`_index_hint`).
        """
        ref = self.quote("record_ref")
        known = f"NOT ({self._decoded('s')})"
        new = f"t.{ref} IS NULL"
        stale, changed = self._stale("t", "s"), self._changed("t", "s")
        if self.wire_hash_column:
            w = self.quote(WIRE_HASH_COLUMN)
            unverified = f"{known} AND ({new} OR {self._hash_differs(f't.{w}', f's.{w}')})"
        else:
            unverified = known
        return Statement(
            "SELECT "
            f"COALESCE(SUM(CASE WHEN {known} THEN 0 WHEN {new} THEN 1 ELSE 0 END), 0), "
            f"COALESCE(SUM(CASE WHEN {known} THEN 0 WHEN {new} THEN 0 WHEN {stale} THEN 0 WHEN {changed} THEN 1 "
            "ELSE 0 END), 0), "
            f"COALESCE(SUM(CASE WHEN {known} THEN 1 WHEN {new} THEN 0 WHEN {stale} THEN 0 WHEN {changed} THEN 0 "
            "ELSE 1 END), 0), "
            f"COALESCE(SUM(CASE WHEN {known} THEN 0 WHEN {new} THEN 0 WHEN {stale} THEN 1 ELSE 0 END), 0), "
            f"COALESCE(SUM(CASE WHEN {unverified} THEN 1 ELSE 0 END), 0) "
            f"FROM {self.stage_ref(stage, schema)} s "
            f"LEFT JOIN {self.table_ref(target, schema)} t{self._index_hint(index)} ON t.{ref} = s.{ref}"
        )

    def _select_stage_row(self, s: str) -> str:
        """The SELECT list producing one target row in RECORD_COLUMNS order from staging alias ``s``."""
        parts = []
        for col in self.written_columns:
            if col == "_bos_synced_at":
                parts.append(self.bind_ts())
            elif col == "_bos_run_id":
                parts.append(self.bind_id())
            else:
                parts.append(self._staged_value(s, col))
        return ", ".join(parts)

    def _staged_value(self, s: str, col: str) -> str:
        """The value of record column ``col`` in the staged row ``s``."""
        return f"{s}.{self.quote(col)}"

    @abc.abstractmethod
    def merge(
        self, stage: str, target: str, schema: str | None, *, synced_at: datetime, run_id: str, new_only: bool = False
    ) -> list[tuple[Statement, str]]:
        """The merge statements, each with the count its rowcount must equal (``"inserted"``,
        ``"updated"`` or ``"inserted+updated"``).

        ``new_only``: the classification (under the writer's lock) found no staged ``record_ref`` in
        the target, so every staged row is an insert: a plain ``INSERT ... SELECT`` (no join, no
        conflict handling; the primary key still refuses a duplicate, which rolls back).
        """

    def insert_all(self, stage: str, target: str, schema: str | None, *, synced_at: datetime, run_id: str) -> Statement:
        """``INSERT ... SELECT`` of every staged row (the ``new_only`` merge: there is no known row)."""
        cols = self._written_column_list()
        return Statement(
            f"INSERT INTO {self.table_ref(target, schema)} ({cols}) "
            f"SELECT {self._select_stage_row('s')} FROM {self.stage_ref(stage, schema)} s",
            (self.bind_timestamp(synced_at), run_id),
        )

    # --- audit --------------------------------------------------------------------------------

    def insert_audit(self, audit: str, schema: str | None, columns: list[str], json_columns: set[str]) -> Statement:
        cols = ", ".join(self.quote(c) for c in columns)
        marks = ", ".join(self.bind_json() if c in json_columns else self.placeholder for c in columns)
        return Statement(f"INSERT INTO {self.table_ref(audit, schema)} ({cols}) VALUES ({marks})")


class PostgresDialect(WarehouseDialect):
    """PostgreSQL: COPY into a temp table (psycopg 3), one ON CONFLICT merge, table lock."""

    name = "postgresql"
    max_bind_params = 65535
    # Each statement sees every commit made before it; with the table lock, counts stay exact.
    isolation_level = "READ COMMITTED"

    def __init__(self, sa_dialect: sa.Dialect, *, use_copy: bool | None = None) -> None:
        super().__init__(sa_dialect)
        # COPY needs psycopg 3; ``use_copy=False`` turns it off (executemany staging).
        self.uses_copy = sa_dialect.driver == "psycopg" and use_copy is not False
        # With COPY, each record travels as its hashed document (one serialisation per record on the
        # client instead of eight, five COPY fields instead of eleven); the merge derives the columns.
        self.document_staging = self.uses_copy
        # An empty target is loaded by COPY into the table itself while the records stream in
        # (WarehouseWriter's direct load), not staged and merged after the last one.
        self.direct_load = self.uses_copy

    def _temp_prefix(self) -> str:
        return "CREATE TEMPORARY TABLE"

    def _temp_suffix(self) -> str:
        # Dropped explicitly too; ON COMMIT DROP guarantees it even if that statement never runs.
        return " ON COMMIT DROP"

    def _stage_column_defs(self, *, with_seq: bool, parse_json: bool = False) -> list[str]:
        # By default JSON arrives as canonical text and stays TEXT in staging: COPY does not parse
        # it, and the merge casts to JSONB only the rows it actually writes (none on an unchanged
        # re-run; JSONB staging made that ~1.5 s slower at 200k). With parse_json (an empty
        # target: every row will be written) staging is JSONB, so PostgreSQL parses the JSON while
        # COPY streams in, beside the client's work, instead of in the merge after the last record.
        # The merge's CASTs are then no-ops.
        if self.document_staging:
            q = self.quote
            defs = [  # only the key is required: a known row has no document (see STAGE_COLUMNS)
                f"{q('record_ref')} {self.type_sql('key')} NOT NULL",
                f"{q('_bos_doc')} {self.type_sql('json') if parse_json else 'TEXT'}",
                f"{q('_bos_observed_at')} {self.type_sql('ts')}",
                f"{q('_bos_record_hash')} {self.type_sql('hash')}",
                f"{q(WIRE_HASH_COLUMN)} {self.type_sql('hash')}",
            ]
            if with_seq:
                defs.append(f"{q('_bos_seq')} BIGINT NOT NULL")
            return defs
        defs = super()._stage_column_defs(with_seq=with_seq)
        if parse_json:
            return defs
        jsonb = self.type_sql("json")
        return [d.replace(f" {jsonb}", " TEXT", 1) for d in defs]

    def _documents(self, stage: str, schema: str | None, where: str = "") -> str:
        """A derived table ``x`` of staged rows with the document as JSONB, each parsed ONCE.

        OFFSET 0 keeps the planner from inlining the subquery, which would repeat the cast for
        every column derived from it.
        """
        q = self.quote
        return (
            f"(SELECT s.{q('record_ref')}, CAST(s.{q('_bos_doc')} AS JSONB) AS bos_doc, "
            f"s.{q('_bos_observed_at')}, s.{q('_bos_record_hash')}, s.{q(WIRE_HASH_COLUMN)} "
            f"FROM {self.stage_ref(stage, schema)} s{where} OFFSET 0) x"
        )

    def insert_all(self, stage, target, schema, *, synced_at, run_id):
        if not self.document_staging:
            return super().insert_all(stage, target, schema, synced_at=synced_at, run_id=run_id)
        cols = self._written_column_list()
        return Statement(
            f"INSERT INTO {self.table_ref(target, schema)} ({cols}) "
            f"SELECT {self._select_stage_row('x')} FROM {self._documents(stage, schema)}",
            (self.bind_timestamp(synced_at), run_id),
        )

    def _staged_value(self, s: str, col: str) -> str:
        if self.document_staging:  # ``s`` is :meth:`_documents`'s row: the document as JSONB in s.bos_doc
            if col in ("display_name", "email", "phone"):
                return f"{s}.bos_doc->>'{col}'"  # JSON null -> NULL
            if col in ("lifecycle", "identity_match"):
                return f"NULLIF({s}.bos_doc->'{col}', 'null'::jsonb)"  # JSON null is stored as NULL
            if col in ("attributes", "sources"):
                return f"{s}.bos_doc->'{col}'"
        elif col in ("lifecycle", "identity_match", "attributes", "sources"):
            return f"CAST({s}.{self.quote(col)} AS JSONB)"  # staged as text unless parse_json
        return f"{s}.{self.quote(col)}"

    wire_hash_prefixes_aggregated = True

    def wire_hash_prefixes(self, target: str, schema: str | None) -> Statement:
        # One text value, sorted bytewise (COLLATE "C"), instead of a row per stored record:
        # 200k rows through the driver cost ~0.3 s, this ~0.1 s (measured). With the table's
        # state token (see stored_wire_state), taken in the same scan and snapshot.
        w = self.quote(WIRE_HASH_COLUMN)
        prefix = f'SUBSTR({w}, 1, 16) COLLATE "C"'
        # OCTET_LENGTH: LENGTH counts characters, which costs a third of the scan.
        return Statement(
            f"SELECT STRING_AGG({prefix}, '' ORDER BY {prefix}) FILTER (WHERE OCTET_LENGTH({w}) = 64), "
            f"{self._wire_state_columns()} FROM {self.table_ref(target, schema)} WHERE {w} IS NOT NULL"
        )

    def _wire_state_columns(self) -> str:
        # How many rows have a wire hash, and the sum of a 64-bit hash of each (record_ref, wire
        # hash) pair: any row with a wire hash added, removed or changed changes it. A full scan of
        # the table but no join: ~40 ms per 200k rows, where joining 200k staged claims took ~200 ms.
        ref, w = self.quote("record_ref"), self.quote(WIRE_HASH_COLUMN)
        return f"COUNT(*), COALESCE(SUM(HASHTEXTEXTENDED({w}, HASHTEXT({ref}))), 0)"

    def stored_wire_state(self, target: str, schema: str | None) -> Statement | None:
        w = self.quote(WIRE_HASH_COLUMN)
        return Statement(f"SELECT {self._wire_state_columns()} FROM {self.table_ref(target, schema)} WHERE {w} IS NOT NULL")

    def stage_claims(self, stage, target, schema, prefixes, seqs):
        q = self.quote
        ref, w = q("record_ref"), q(WIRE_HASH_COLUMN)
        return Statement(
            f"INSERT INTO {self.stage_ref(stage, schema)} ({ref}, {w}, {q('_bos_seq')}) "
            f"SELECT t.{ref}, t.{w}, c.seq FROM {self.table_ref(target, schema)} t "
            f"JOIN UNNEST(CAST({self.placeholder} AS TEXT[]), CAST({self.placeholder} AS BIGINT[])) AS c(prefix, seq) "
            f'ON SUBSTR(t.{w}, 1, 16) COLLATE "C" = c.prefix WHERE t.{w} IS NOT NULL',  # bytewise: cheap to sort
            (list(prefixes), list(seqs)),
        )

    def count_distinct(self, stage: str, schema: str | None) -> Statement:
        # A hashed DISTINCT beats COUNT(DISTINCT ...)'s sort (~30% at 200k rows).
        ref = self.quote("record_ref")
        return Statement(f"SELECT COUNT(*) FROM (SELECT DISTINCT {ref} FROM {self.stage_ref(stage, schema)}) d")

    def copy_lines(self, rows: Iterable[tuple[Any, ...]]) -> Iterator[bytes]:
        """COPY lines of document-staged rows (for :meth:`copy_staging`)."""
        return copy_document_lines(rows)

    def adopt_wire_hashes(self, source: str, target: str, schema: str | None) -> Statement:
        """Give target rows the wire hash of a staged copy with the same content (a direct load's
        later duplicate: the merge leaves identical content alone, but the later copy is the one a
        staged load would have kept, so its bytes are what the next run most likely sends)."""
        q = self.quote
        ref, h, w = q("record_ref"), q("_bos_record_hash"), q(WIRE_HASH_COLUMN)
        return Statement(
            f"UPDATE {self.table_ref(target, schema)} t SET {w} = s.{w} FROM {self.stage_ref(source, schema)} s "
            f"WHERE t.{ref} = s.{ref} AND t.{h} = s.{h} AND t.{w} IS DISTINCT FROM s.{w}"
        )

    def copy_target(self, target: str, schema: str | None) -> str:
        """COPY straight into the target's written columns (the direct load of an empty table)."""
        return f"COPY {self.table_ref(target, schema)} ({self._written_column_list()}) FROM STDIN"

    def target_lines(self, *, synced_at: datetime, run_id: str) -> TargetCopyLines:
        """Builds :meth:`copy_target`'s lines for this run."""
        return TargetCopyLines(synced_at=synced_at, run_id=run_id, wire_hash=self.wire_hash_column)

    def copy_staging(self, stage: str, schema: str | None) -> str:
        cols = ", ".join(self.quote(c) for c in self.stage_columns)
        return f"COPY {self.stage_ref(stage, schema)} ({cols}) FROM STDIN"

    def bind_json(self) -> str:
        return f"CAST({self.placeholder} AS JSONB)"

    def bind_ts(self) -> str:
        return f"CAST({self.placeholder} AS TIMESTAMPTZ)"

    def bind_id(self) -> str:
        return f"CAST({self.placeholder} AS VARCHAR(64))"

    def begin(self) -> list[Statement]:
        # The classification's hash join holds the stored table's keys and hashes: at the default
        # 4 MB it spills to 16 temp-file batches at 200k rows (measured 0.38 s -> 0.25 s in memory).
        # For this transaction only.
        return [Statement("SET LOCAL work_mem = '64MB'")]

    def lock(self, target: str, *, timeout_s: float) -> list[Statement]:
        # SHARE ROW EXCLUSIVE conflicts with itself and with writers, not with readers.
        return [
            Statement(f"SET LOCAL lock_timeout = '{int(timeout_s * 1000)}ms'"),
            Statement(f"LOCK TABLE {target} IN SHARE ROW EXCLUSIVE MODE"),
        ]

    def merge(self, stage, target, schema, *, synced_at, run_id, new_only=False):
        if new_only:
            return [(self.insert_all(stage, target, schema, synced_at=synced_at, run_id=run_id), "inserted")]
        q = self.quote
        ref = q("record_ref")
        cols = self._written_column_list()
        sets = ", ".join(f"{q(c)} = EXCLUDED.{q(c)}" for c in self.updated_columns)
        target_ref = self.table_ref(target, schema)
        # Only new rows and rows the guard lets through reach the INSERT (the table lock keeps this
        # equal to the classification); unchanged rows cost one join probe, no write, no JSONB cast.
        # The ON CONFLICT guard stays as the authoritative check.
        join = (
            f" LEFT JOIN {target_ref} o ON o.{ref} = s.{ref} WHERE {self._decoded('s')} AND "
            f"(o.{ref} IS NULL OR ({self._write_allowed('o', 's')} AND {self._changed('o', 's')}))"
        )
        if self.document_staging:
            select = f"SELECT {self._select_stage_row('x')} FROM {self._documents(stage, schema, join)}"
        else:
            select = f"SELECT {self._select_stage_row('s')} FROM {self.stage_ref(stage, schema)} s{join}"
        sql = (
            f"INSERT INTO {target_ref} AS t ({cols}) {select} "
            f"ON CONFLICT ({ref}) DO UPDATE SET {sets} "
            f"WHERE {self._write_allowed('t', 'EXCLUDED')} AND {self._changed('t', 'EXCLUDED')}"
        )
        return [(Statement(sql, (synced_at, run_id)), "inserted+updated")]


class SqliteDialect(WarehouseDialect):
    """SQLite: executemany staging, one ON CONFLICT merge, BEGIN IMMEDIATE as the writer lock."""

    name = "sqlite"

    def __init__(self, sa_dialect: sa.Dialect, *, busy_timeout_s: float = 30.0) -> None:
        super().__init__(sa_dialect)
        self.busy_timeout_s = busy_timeout_s
        version = sqlite3.sqlite_version_info
        if version < (3, 25, 0):
            raise BosWarehouseError(
                f"SQLite {sqlite3.sqlite_version} is too old: upserts and window functions need 3.25 or newer."
            )
        # SQLITE_MAX_VARIABLE_NUMBER defaults to 999 before 3.32.0 and 32766 from it on.
        self.max_bind_params = 32766 if version >= (3, 32, 0) else 999

    def stage_ref(self, stage: str, schema: str | None) -> str:
        return f"temp.{self.quote(stage)}"

    def _temp_prefix(self) -> str:
        return "CREATE TEMP TABLE"

    def bind_timestamp(self, value: datetime) -> Any:
        # The text form SQLAlchemy's SQLite DateTime reads back; fixed width, so text order == time order.
        value = value.astimezone(UTC)
        return (
            f"{value.year:04d}-{value.month:02d}-{value.day:02d} "
            f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}.{value.microsecond:06d}"
        )

    def begin(self) -> list[Statement]:
        # Take the write lock up front: counts and merge then see the same table.
        return [
            Statement(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}"),
            Statement("BEGIN IMMEDIATE"),
        ]

    def _hash_differs(self, old: str, new: str) -> str:
        return f"{old} IS NOT {new}"

    def merge(self, stage, target, schema, *, synced_at, run_id, new_only=False):
        if new_only:
            return [(self.insert_all(stage, target, schema, synced_at=synced_at, run_id=run_id), "inserted")]
        q = self.quote
        cols = self._written_column_list()
        sets = ", ".join(f"{q(c)} = excluded.{q(c)}" for c in self.updated_columns)
        # The WHERE (known rows are never written) also keeps the parser from reading ON CONFLICT
        # as a join constraint.
        sql = (
            f"INSERT INTO {self.table_ref(target, schema)} AS t ({cols}) "
            f"SELECT {self._select_stage_row('s')} FROM {self.stage_ref(stage, schema)} s WHERE {self._decoded('s')} "
            f"ON CONFLICT ({q('record_ref')}) DO UPDATE SET {sets} "
            f"WHERE {self._write_allowed('t', 'excluded')} AND {self._changed('t', 'excluded')}"
        )
        return [(Statement(sql, (self.bind_timestamp(synced_at), run_id)), "inserted+updated")]


class MySqlDialect(WarehouseDialect):
    """MySQL/MariaDB: executemany staging, UPDATE ... JOIN + INSERT ... LEFT JOIN, GET_LOCK."""

    name = "mysql"
    max_bind_params = 65535
    # InnoDB REPEATABLE READ fixes the snapshot at the first read (counting the stage): take the
    # lock before it, so the snapshot includes the previous writer's commit and the counts match what
    # the merge's locking reads see.
    lock_before_staging = True

    def stage_ref(self, stage: str, schema: str | None) -> str:
        # Qualified like the target: without a default database an unqualified name has no home.
        return self.table_ref(stage, schema)

    def _temp_suffix(self) -> str:
        # CREATE/DROP TEMPORARY TABLE do not commit implicitly (plain CREATE TABLE would).
        return " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"

    def drop_staging(self, stage: str, schema: str | None) -> Statement:
        return Statement(f"DROP TEMPORARY TABLE IF EXISTS {self.stage_ref(stage, schema)}")

    def bind_timestamp(self, value: datetime) -> Any:
        return value.astimezone(UTC).replace(tzinfo=None)  # DATETIME(6) holds UTC

    def _hash_differs(self, old: str, new: str) -> str:
        return f"NOT ({old} <=> {new})"

    def _lock_name(self, target: str) -> str:
        # GET_LOCK names are server-wide and at most 64 characters.
        return "bos:" + hashlib.sha256(target.encode("utf-8")).hexdigest()[:48]

    def lock(self, target: str, *, timeout_s: float) -> list[Statement]:
        # LOCK TABLES would commit the transaction; a named lock serialises our writers instead.
        p = self.placeholder
        return [Statement(f"SELECT GET_LOCK({p}, {p})", (self._lock_name(target), int(max(timeout_s, 0))))]

    def lock_is_flag(self) -> bool:
        return True

    def _index_hint(self, index: str | None) -> str:
        return f" FORCE INDEX ({self.quote(index)})" if index else ""

    def unlock(self, target: str) -> Statement | None:
        return Statement(f"SELECT RELEASE_LOCK({self.placeholder})", (self._lock_name(target),))

    def merge(self, stage, target, schema, *, synced_at, run_id, new_only=False):
        if new_only:
            return [(self.insert_all(stage, target, schema, synced_at=synced_at, run_id=run_id), "inserted")]
        q = self.quote
        ref = q("record_ref")
        target_ref, stage_ref = self.table_ref(target, schema), self.stage_ref(stage, schema)
        # Multi-table UPDATE evaluates WHERE before any assignment, so the guard sees the old row.
        sets = []
        params: list[Any] = []
        for col in self.updated_columns:
            if col == "_bos_synced_at":
                sets.append(f"t.{q(col)} = {self.placeholder}")
                params.append(self.bind_timestamp(synced_at))
            elif col == "_bos_run_id":
                sets.append(f"t.{q(col)} = {self.placeholder}")
                params.append(run_id)
            else:
                sets.append(f"t.{q(col)} = s.{q(col)}")
        update = Statement(
            f"UPDATE {target_ref} t JOIN {stage_ref} s ON t.{ref} = s.{ref} SET {', '.join(sets)} "
            f"WHERE {self._decoded('s')} AND {self._write_allowed('t', 's')} AND {self._changed('t', 's')}",
            tuple(params),
        )
        cols = self._written_column_list()
        insert = Statement(
            f"INSERT INTO {target_ref} ({cols}) SELECT {self._select_stage_row('s')} FROM {stage_ref} s "
            f"LEFT JOIN {target_ref} t ON t.{ref} = s.{ref} WHERE t.{ref} IS NULL AND {self._decoded('s')}",
            (self.bind_timestamp(synced_at), run_id),
        )
        return [(update, "updated"), (insert, "inserted")]


_COPY_SPECIAL = re.compile(rb"[\\\t\n\r]")


def _copy_text(value: bytes) -> bytes:
    """A value in COPY text format: backslash, tab, newline and carriage return escaped."""
    if _COPY_SPECIAL.search(value) is None:
        return value
    return value.replace(b"\\", b"\\\\").replace(b"\t", b"\\t").replace(b"\n", b"\\n").replace(b"\r", b"\\r")


def _stamp(stamps: dict[datetime, bytes], observed: datetime) -> bytes:
    """``observed`` as COPY text, remembered in ``stamps`` (a result shares a few thousand at most)."""
    stamp = observed.isoformat().encode("ascii")
    if len(stamps) < 4096:
        stamps[observed] = stamp
    return stamp


def copy_document_lines(rows: Iterable[tuple[Any, ...]]) -> Iterator[bytes]:
    """COPY text-format lines of document-staged rows (:data:`DOCUMENT_STAGE_COLUMNS` order).

    The document is JSON from a serialiser: it never holds a raw tab, newline or carriage return
    (JSON escapes them), so only its backslashes need doubling. A known row (no document) has
    ``\\N`` (NULL) for the document, observed_at and hash.
    """
    stamps: dict[datetime, bytes] = {}
    for ref, document, observed, record_hash, wire_hash, seq in rows:
        wire = b"\\N" if wire_hash is None else wire_hash.encode("ascii")
        if document is None:
            yield b"%b\t\\N\t\\N\t\\N\t%b\t%d\n" % (_copy_text(ref.encode("utf-8")), wire, seq)
            continue
        stamp = stamps.get(observed) or _stamp(stamps, observed)
        if b"\\" in document:
            document = document.replace(b"\\", b"\\\\")
        yield b"%b\t%b\t%b\t%b\t%b\t%d\n" % (
            _copy_text(ref.encode("utf-8")), document, stamp, record_hash.encode("ascii"), wire, seq,
        )


_NULL = b"\\N"


def _copy_str(value: str | None) -> bytes:
    return _NULL if value is None else _copy_text(value.encode("utf-8"))


def _copy_json(value: bytes) -> bytes:
    # Serialised JSON never holds a raw tab, newline or carriage return: only backslashes double.
    if value == b"null":
        return _NULL
    return value.replace(b"\\", b"\\\\") if b"\\" in value else value


def _copy_json_str(value: bytes) -> bytes:
    """A JSON string (or null) as a COPY text value."""
    if value == b"null":
        return _NULL
    if b"\\" not in value:  # no escape: its text is what is between the quotes (see TargetCopyLines)
        return value[1:-1]
    return _copy_text(orjson.loads(value).encode("utf-8"))


class TargetCopyLines:
    """COPY text lines of the target's written columns, for one run (see ``copy_target``).

    :meth:`line` takes what :func:`~airflow_provider_bos.warehouse.records.json_column_values`
    gives: the content columns as canonical JSON bytes, and the document they make up. JSON never
    holds a raw tab, newline or carriage return, and a JSON string without a backslash is its text
    between the quotes: so a record whose document has no backslash (nearly all) needs no escaping
    at all, and its strings are sliced, not decoded. ``_bos_synced_at`` and ``_bos_run_id`` are the
    run's.
    """

    def __init__(self, *, synced_at: datetime, run_id: str, wire_hash: bool) -> None:
        self._run = b"%b\t%b" % (synced_at.isoformat().encode("ascii"), _copy_str(run_id))
        self._wire_hash = wire_hash
        self._stamps: dict[datetime, bytes] = {}

    def line(
        self, parts: tuple[bytes, ...], document: bytes, observed: datetime, record_hash: str, wire_hash: str | None,
    ) -> bytes:
        stamp = self._stamps.get(observed) or _stamp(self._stamps, observed)
        ref, display_name, email, phone, lifecycle, identity, attributes, sources = parts
        if b"\\" in document:  # some value has an escape: each one is checked
            fields: tuple[bytes, ...] = (
                _copy_json_str(ref), _copy_json_str(display_name), _copy_json_str(email), _copy_json_str(phone),
                _copy_json(lifecycle), _copy_json(identity), _copy_json(attributes), _copy_json(sources),
            )
        else:
            fields = (
                ref[1:-1],
                _NULL if display_name == b"null" else display_name[1:-1],
                _NULL if email == b"null" else email[1:-1],
                _NULL if phone == b"null" else phone[1:-1],
                _NULL if lifecycle == b"null" else lifecycle,
                _NULL if identity == b"null" else identity,
                attributes,
                sources,
            )
        # Joined, not %-formatted: twelve %b cost a third more per record.
        if not self._wire_hash:
            return b"\t".join((*fields, stamp, self._run, record_hash.encode("ascii"))) + b"\n"
        wire = _NULL if wire_hash is None else wire_hash.encode("ascii")
        return b"\t".join((*fields, stamp, self._run, record_hash.encode("ascii"), wire + b"\n"))


def dialect_for(engine_or_dialect: sa.Engine | sa.Dialect, **options: Any) -> WarehouseDialect:
    """The warehouse dialect for an engine; PostgreSQL, MySQL/MariaDB and SQLite are supported."""
    sa_dialect = engine_or_dialect.dialect if isinstance(engine_or_dialect, sa.Engine) else engine_or_dialect
    name = sa_dialect.name
    if name == "postgresql":
        return PostgresDialect(sa_dialect, **options)
    if name in ("mysql", "mariadb"):
        return MySqlDialect(sa_dialect)
    if name == "sqlite":
        return SqliteDialect(sa_dialect, **options)
    raise BosWarehouseError(
        f"Destination database {name!r} is not supported; use PostgreSQL, MySQL/MariaDB or SQLite."
    )

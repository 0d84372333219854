"""The base dialect: the warehouse SQL every database shares; subclasses override what differs.

Dialect objects BUILD the warehouse SQL; :mod:`..transaction` and :mod:`..loads` execute it.

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
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse.dialects.attribute_sql import AttributeSql
from airflow_provider_bos.warehouse.dialects.capabilities import DialectCapabilities
from airflow_provider_bos.warehouse.dialects.lifecycle import LifecycleSql, RunKeys
from airflow_provider_bos.warehouse.dialects.statement import Statement
from airflow_provider_bos.warehouse.tables.identifiers import validate_identifier, validate_schema
from airflow_provider_bos.warehouse.tables.schema import (
    DELETED_AT_COLUMN,
    LIFECYCLE_COLUMNS,
    RECORD_COLUMNS,
    RECORD_JSON_COLUMNS,
    WIRE_HASH_COLUMN,
    column_types,
)

__all__ = [
    "DOCUMENT_STAGE_COLUMNS",
    "STAGE_COLUMNS",
    "Statement",
    "WarehouseDialect",
    "staging_table_name",
]

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
# A known row's content columns (its key, observed_at, wire hash and _bos_seq are set).
_KNOWN_CONTENT_NULLS = (None,) * (STAGE_COLUMNS.index("_bos_observed_at") - 1)
# Document staging (PostgreSQL with COPY): the key, the guards and the hashed document; the content
# columns are derived from the document in SQL, and only for the rows actually written.
DOCUMENT_STAGE_COLUMNS = (
    "record_ref", "_bos_doc", "_bos_observed_at", "_bos_record_hash", WIRE_HASH_COLUMN, "_bos_seq",
)


#: The savepoint before a run's records are loaded (see :meth:`WarehouseDialect.savepoint`).
RECORDS_SAVEPOINT = "bos_records"


def staging_table_name(run_id: str, suffix: str = "") -> str:
    """The per-run staging table name (a valid identifier whatever the run id looks like)."""
    digest = hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:16]
    return validate_identifier(f"bos_stage_{digest}{suffix}")


class WarehouseDialect(LifecycleSql, AttributeSql, abc.ABC):
    """SQL builder for one database family. Subclasses override what differs.

    The lifecycle statements (supersede, retire, history, lineage, erasure) come from
    :class:`~.lifecycle.LifecycleSql`; the promoted attributes' from :class:`~.attribute_sql.AttributeSql`.
    """

    name = "generic"
    #: What this database can do (see :mod:`.capabilities`); PostgreSQL's depend on its driver.
    capabilities = DialectCapabilities()

    @classmethod
    def writer_options(cls, *, lock_timeout_s: float, sqlite_busy_timeout_s: float | None,
                       use_copy: bool | None) -> dict[str, Any]:
        """The constructor options this dialect takes from the writer's settings."""
        return {}

    @classmethod
    def _placeholder(cls, paramstyle: str) -> str:
        """The positional placeholder of the driver's paramstyle."""
        if paramstyle == "qmark":
            return "?"
        if paramstyle in ("format", "pyformat"):
            return "%s"
        raise BosWarehouseError(f"Unsupported DB-API paramstyle {paramstyle!r}.")

    @classmethod
    def prepare_engine(cls, engine: sa.Engine, *, lock_timeout_s: float) -> None:
        """Configure ``engine`` once before the writer uses it (e.g. how a connect waits for a lock)."""

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
        return DOCUMENT_STAGE_COLUMNS if self.capabilities.document_staging else STAGE_COLUMNS

    def __init__(self, sa_dialect: sa.Dialect, *, wire_hash_column: bool = True) -> None:
        self.sa_dialect = sa_dialect
        #: The target table has the _bos_wire_hash column (tables made before it existed sync
        #: without it, and without skipping known records): the writer says so once it has looked.
        self.wire_hash_column = wire_hash_column
        self._preparer = sa_dialect.identifier_preparer
        self.placeholder = self._placeholder(sa_dialect.paramstyle)
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

    @classmethod
    def columns_query(cls, table: str, schema: str | None) -> Statement | None:
        """The names of ``table``'s columns, one per row; None: SQLAlchemy's inspector reflects them."""
        return None

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

    def add_column(self, table: str, schema: str | None, column: str, type_sql: str, *,
                   timeout_s: float) -> list[Statement]:
        """Add a nullable column to a table made before it, waiting at most ``timeout_s`` for the table.

        Run in a transaction of its own; then :meth:`add_column_reset` on the same connection.
        SQLite waits its connection's busy timeout.
        """
        return [Statement(f"ALTER TABLE {self.table_ref(table, schema)} ADD COLUMN {self.quote(column)} {type_sql}")]

    def add_column_reset(self) -> list[Statement]:
        """What :meth:`add_column` changed on the connection, set back (it goes back to the pool)."""
        return []

    def process_lock(self, database: str, target: str) -> threading.Lock | None:
        """A lock this process's writers of ``target`` in ``database`` take besides :meth:`lock`
        (where the database has no SQL lock that waits); None: the SQL lock is enough."""
        return None

    def lock_is_flag(self) -> bool:
        """True when the last :meth:`lock` statement is a SELECT whose single value must be 1."""
        return False

    def unlock(self, target: str) -> Statement | None:
        return None

    def savepoint(self) -> Statement | None:
        """Mark where the run's records start loading (a restarted final frame rolls back to it);
        None where the database has no savepoints (:meth:`discard_records` then deletes instead)."""
        return Statement(f"SAVEPOINT {RECORDS_SAVEPOINT}")

    def discard_records(
        self, stages: tuple[str, ...], target: str, schema: str | None, run_id: str
    ) -> list[Statement]:
        """Undo every row loaded since :meth:`savepoint` (``stages``: the run's staging tables made so
        far, the first the one records load into; or loaded directly into ``target``)."""
        return [Statement(f"ROLLBACK TO SAVEPOINT {RECORDS_SAVEPOINT}")]

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

    def insert_target(self, target: str, schema: str | None) -> Statement:
        """Single-row INSERT of the target's written columns, for ``executemany`` (the direct load of an
        empty table by dialects without COPY)."""
        cols = self.written_columns
        marks = ", ".join(self.bind_json() if c in RECORD_JSON_COLUMNS else self.placeholder for c in cols)
        columns = self._written_column_list()
        return Statement(f"INSERT INTO {self.table_ref(target, schema)} ({columns}) VALUES ({marks})")

    def update_from_file(self, target: str, schema: str | None, path: str, *, key: Sequence[str],
                         columns: Sequence[str], longest_line: int, alike_in: str | None = None) -> Statement:
        """One ``UPDATE`` of ``target`` from a staged NDJSON file (dialects whose capabilities say
        ``updates_from_file``); with ``alike_in``, of the versions alike that table's rows."""
        raise NotImplementedError(f"{self.name} rewrites rows with bound values, not from a file")

    def adopt_later_copies(self, source: str, target: str, schema: str | None) -> Statement:
        """Give target rows the observation, ``sources`` and wire hash of a staged later copy with the
        same content (a direct load's later duplicate: the merge leaves identical content alone, but
        the later copy is the one a staged load would have kept)."""
        t_cols, later = self._later_copy_sets(), self._later_copy("t", "s")
        return Statement(
            f"UPDATE {self.table_ref(target, schema)} AS t SET {t_cols} FROM {self.stage_ref(source, schema)} s "
            f"WHERE t.{self.quote('record_ref')} = s.{self.quote('record_ref')} AND {later}"
        )

    def store_wire_hashes(self, source: str, target: str, schema: str | None) -> Statement:
        """Give each stored row without a wire hash (written without one, or cleared) the wire hash of
        its unchanged staged copy: the next re-run skips it undecoded. Only that empty column is
        written: the content, its observation and sync time stay. A stored hash that differs (a
        dropped field changed) is left as it is: a change of what is not stored rewrites nothing."""
        ref, w = self.quote("record_ref"), self.quote(WIRE_HASH_COLUMN)
        return Statement(
            f"UPDATE {self.table_ref(target, schema)} AS t SET {w} = s.{w} FROM {self.stage_ref(source, schema)} s "
            f"WHERE t.{ref} = s.{ref} AND {self._wire_hash_to_store('t', 's')}"
        )

    def _wire_hash_to_store(self, t: str, s: str) -> str:
        """Staged row ``s`` is an unchanged, current, not older copy of ``t``, which has no wire hash."""
        q = self.quote
        h, w = q("_bos_record_hash"), q(WIRE_HASH_COLUMN)
        if not self.wire_hash_column:
            return "1 = 0"
        return (f"{t}.{w} IS NULL AND {s}.{w} IS NOT NULL AND {t}.{h} = {s}.{h} "
                f"AND {t}.{q(DELETED_AT_COLUMN)} IS NULL AND {self._write_allowed(t, s)}")

    def _later_copy_sets(self, t: str = "", s: str = "s") -> str:
        q, prefix = self.quote, f"{t}." if t else ""
        return (f"{prefix}{q(WIRE_HASH_COLUMN)} = {s}.{q(WIRE_HASH_COLUMN)}, "
                f"{prefix}{q('_bos_observed_at')} = {s}.{q('_bos_observed_at')}, "
                f"{prefix}{q('sources')} = {self._staged_value(s, 'sources')}")

    def _later_copy(self, t: str, s: str) -> str:
        """Staged row ``s`` is a later copy of ``t``'s content: observed later, or as late with other bytes."""
        q = self.quote
        h, w, obs = q("_bos_record_hash"), q(WIRE_HASH_COLUMN), q("_bos_observed_at")
        return (f"{t}.{h} = {s}.{h} AND ({s}.{obs} > {t}.{obs} OR ({s}.{obs} = {t}.{obs} AND "
                f"{self._hash_differs(f'{t}.{w}', f'{s}.{w}')}))")

    @staticmethod
    def known_value(record_ref: str, wire_hash: str, seq: int, observed_at: Any = None) -> tuple[Any, ...]:
        """The column-staged tuple of a known row (:data:`STAGE_COLUMNS` order); ``observed_at``: its
        claim's own stamp, bound (None: the stored row's, see :meth:`dedupe`)."""
        return (record_ref, *_KNOWN_CONTENT_NULLS, observed_at, None, wire_hash, seq)

    # --- known records -----------------------------------------------------------------------

    def wire_hash_prefixes(self, target: str, schema: str | None) -> Statement:
        """The first 16 hex digits of every current row's stored wire hash (one per row): a retired
        row's record is decoded when it comes back, so the merge can make it current again."""
        w = self.quote(WIRE_HASH_COLUMN)
        return Statement(f"SELECT SUBSTR({w}, 1, 16) FROM {self.table_ref(target, schema)} t "
                         f"WHERE {w} IS NOT NULL AND {self._current('t')}")

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
            f"JOIN {self.table_ref(target, schema)} t ON t.{ref} = s.{ref} "
            f"WHERE t.{w} IS NOT NULL AND {self._current('t')}"
        )

    def stored_wire_state(self, target: str, schema: str | None) -> Statement | None:
        """One row: a token of every stored (record_ref, wire hash) pair, as :meth:`wire_hash_prefixes`
        also returns it in its second and third columns; None if the database has no such digest
        (claims are then always staged and verified row by row)."""
        return None

    def stage_claims(
        self, stage: str, target: str, schema: str | None, prefixes: Sequence[str], seqs: Sequence[int],
        observed: Sequence[datetime | None],
    ) -> Statement | None:
        """Stage, as known rows, the stored rows whose wire hash starts with one of ``prefixes``
        (``seqs`` and ``observed``: the position in the read of each one's claim and its own stamp,
        None for the stored row's, see :meth:`dedupe`); None where
        :meth:`stored_wire_state` is None (claims are never kept out of staging there)."""
        return None

    def dedupe(self, src: str, dst: str, schema: str | None, target: str) -> Statement:
        """Copy the winner of each ``record_ref`` from ``src`` into ``dst``.

        Winner: latest ``_bos_observed_at``; on a tie, the last occurrence (highest ``_bos_seq``).
        A known row carries its claim's own stamp (the wire hash leaves stamps out, so the stored
        row's may be older); where it has none, the stored row's (the same bytes, stamps included).
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
        """The staged row ``s`` differs from the target row ``t``, or ``t`` was retired (it comes back)."""
        h = self.quote("_bos_record_hash")
        return f"({self._hash_differs(f'{t}.{h}', f'{s}.{h}')} OR {t}.{self.quote(DELETED_AT_COLUMN)} IS NOT NULL)"

    def lifecycle_resets(self) -> tuple[str, ...]:
        """The target's columns an update sets back to NULL: a written row is current again."""
        return LIFECYCLE_COLUMNS

    def _decoded(self, s: str) -> str:
        """True for a staged row that carries its content (false for a known row)."""
        return f"{s}.{self.quote('_bos_record_hash')} IS NOT NULL"

    def _index_hint(self, index: str | None) -> str:
        """Text after the target's alias forcing ``index`` for the change test ("" where unsupported)."""
        return ""

    def classify(self, stage: str, target: str, schema: str | None, *, index: str | None = None) -> Statement:
        """One row: inserted, updated, unchanged, skipped_stale (over a duplicate-free stage), unverified,
        wire hashes to store.

        A known row counts as unchanged; ``unverified`` counts the known rows whose stored row is
        gone or has another wire hash (the writer refuses to commit those: their content is not
        staged); the last value counts the unchanged decoded rows stored without a wire hash
        (:meth:`store_wire_hashes`). ``index``: a covering index of the target for the join (see
        :meth:`_index_hint`).
        """
        ref = self.quote("record_ref")
        known = f"NOT ({self._decoded('s')})"
        new = f"t.{ref} IS NULL"
        stale, changed = self._stale("t", "s"), self._changed("t", "s")
        if self.wire_hash_column:
            w = self.quote(WIRE_HASH_COLUMN)
            unverified = (f"{known} AND ({new} OR {self._hash_differs(f't.{w}', f's.{w}')} "
                          f"OR t.{self.quote(DELETED_AT_COLUMN)} IS NOT NULL)")
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
            f"COALESCE(SUM(CASE WHEN {unverified} THEN 1 ELSE 0 END), 0), "
            f"COALESCE(SUM(CASE WHEN {known} THEN 0 WHEN {new} THEN 0 WHEN {self._wire_hash_to_store('t', 's')} THEN 1 "
            "ELSE 0 END), 0) "
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

    def set_audit_json(self, audit: str, schema: str | None, column: str, run_id: str, text: str) -> Statement:
        """Set one audit row's JSON ``column`` to the JSON ``text``."""
        return Statement(f"UPDATE {self.table_ref(audit, schema)} SET {self.quote(column)} = {self.bind_json()} "
                         f"WHERE {self.quote('run_id')} = {self.placeholder}", (text, run_id))

    # --- coverage -----------------------------------------------------------------------------

    def count_coverage(self, target: str, schema: str | None, columns: Mapping[str, bool],
                       keys: RunKeys | None, *, written_by: str | None = None) -> Statement:
        """One row: the current rows the run returned (``keys``; None: every current row; or, with
        ``written_by``, the current rows that run wrote), then for each of ``columns`` how many of them
        have a value (see :meth:`_has_value`; ``columns`` maps a name to True when the column holds
        text, False for a column of another or unknown type)."""
        counted = ["COUNT(*)"]
        for name, text in columns.items():
            counted.append(f"COUNT(CASE WHEN {self._has_value(f't.{self.quote(name)}', text=text)} THEN 1 END)")
        where = self._current("t") + ("" if keys is None else f" AND {self._returned(keys, schema)}")
        params: tuple[str, ...] = ()
        if written_by is not None:
            where += f" AND t.{self.quote('_bos_run_id')} = {self.placeholder}"
            params = (written_by,)
        return Statement(f"SELECT {', '.join(counted)} FROM {self.table_ref(target, schema)} t WHERE {where}", params)

    def _has_value(self, column: str, *, text: bool) -> str:
        """True where ``column`` has a value: not NULL, nor the empty string (a column of another type
        compared as its text)."""
        value = column if text else f"CAST({column} AS {self.type_sql('text')})"
        return f"{column} IS NOT NULL AND {value} <> ''"

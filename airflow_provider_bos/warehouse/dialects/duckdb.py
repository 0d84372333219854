"""DuckDB: rows staged through a newline-delimited JSON file (``read_json``), one ON CONFLICT merge.

DuckDB is columnar and embedded: one ``INSERT`` per row costs it about 2 ms (``executemany`` of
200k rows: ~400 s; multi-row ``VALUES`` batches ~80 s), while ``read_json`` over a file of the same
rows loads them in ~3 s (bench/README.md "DuckDB"). So rows are written to a temporary file and
loaded in blocks (:mod:`..file_load`), and everything after staging is the shared SQL.

A DuckDB database file has ONE writer process at a time: the process that opens it read-write
holds a lock on the file until its last connection closes. A second process waits for the lock
(:func:`wait_for_file_lock`, up to the writer's ``lock_timeout_s``), then fails with a
:class:`~airflow_provider_bos.exceptions.BosWarehouseError`. Within one process, transactions are
optimistic: two writers of the same rows conflict at commit and the second rolls back.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse.dialects.attribute_sql import Expression, expand
from airflow_provider_bos.warehouse.dialects.base import STAGE_COLUMNS, Statement, WarehouseDialect
from airflow_provider_bos.warehouse.dialects.capabilities import DialectCapabilities, LoadMethod
from airflow_provider_bos.warehouse.dialects.lifecycle import ENTRY_TEXT_COLUMNS
from airflow_provider_bos.warehouse.dialects.upkeep_sql import same_stored_content
from airflow_provider_bos.warehouse.tables.attribute_columns import TIMESTAMP_PATTERN, AttributeColumn
from airflow_provider_bos.warehouse.tables.identifiers import validate_identifier, validate_schema
from airflow_provider_bos.warehouse.tables.schema import RECORD_JSON_COLUMNS, WIRE_HASH_COLUMN

__all__ = ["DuckDbDialect", "wait_for_file_lock"]

log = logging.getLogger(__name__)

#: DuckDB's own default ``maximum_object_size`` for ``read_json`` (16 MiB): the least it reads with.
READ_JSON_OBJECT_SIZE = 16 * 1024 * 1024
# How often a process waiting for another's file lock tries again.
_LOCK_RETRY_S = 0.2
# The DuckDB types of the staged file's columns, by staging role.
_FILE_TYPES = {"key": "VARCHAR", "text": "VARCHAR", "json": "JSON", "ts": "TIMESTAMPTZ", "hash": "VARCHAR"}
_STAGE_ROLES = {
    "record_ref": "key", "display_name": "text", "email": "text", "phone": "text",
    **dict.fromkeys(RECORD_JSON_COLUMNS, "json"),
    "_bos_observed_at": "ts", "_bos_record_hash": "hash", WIRE_HASH_COLUMN: "hash",
}
# ... and of a file of rewritten rows (update_from_file): the staged columns and the history's key.
_UPDATE_ROLES = {**_STAGE_ROLES, "_bos_valid_from": "ts"}


class DuckDbDialect(WarehouseDialect):
    """DuckDB: a staged NDJSON file read by ``read_json``, one ON CONFLICT merge, no SQL lock."""

    name = "duckdb"
    reject_row_id_sql = "sha256({record})"
    # The staged file: an empty table is loaded from it straight into the table (one pass over the
    # rows inside DuckDB, and no temporary table holding the whole result in memory); a table with
    # rows stages it into a keyless temporary table merged by one INSERT ... SELECT. The snapshot is
    # taken at the transaction's first statement: this process's lock of the table
    # (:meth:`process_lock`) is taken before it, so the counts see the previous writer's commit.
    capabilities = DialectCapabilities(load_method=LoadMethod.FILE, lock_before_staging=True, updates_from_file=True,
                                       reads_in_one_pass=True, wire_hash_prefixes_aggregated=True,
                                       wire_state_counts_current=True)

    @classmethod
    def _placeholder(cls, paramstyle: str) -> str:
        # duckdb-engine declares numeric_dollar ($1); DuckDB takes ? as well, positionally.
        return "?"

    @classmethod
    def prepare_engine(cls, engine: sa.Engine, *, lock_timeout_s: float) -> None:
        wait_for_file_lock(engine, lock_timeout_s)

    def stage_ref(self, stage: str, schema: str | None) -> str:
        return f"temp.main.{self.quote(stage)}"

    def process_lock(self, database: str, target: str) -> threading.Lock | None:
        # DuckDB has no lock statement (a conflicting transaction fails at once, it never waits):
        # this process's writers of one table queue here; other processes wait at the file.
        with _prepared_lock:
            return _table_locks.setdefault((database, target), threading.Lock())

    @classmethod
    def columns_query(cls, table: str, schema: str | None) -> Statement | None:
        # duckdb-engine reflects through PostgreSQL catalog tables DuckDB lacks (pg_collation): ask
        # DuckDB's own catalog.
        p = cls._placeholder("qmark")
        return Statement(
            "SELECT column_name FROM information_schema.columns WHERE table_catalog = current_database() "
            f"AND table_schema = COALESCE({p}, current_schema()) AND table_name = {p} ORDER BY ordinal_position",
            (validate_schema(schema, cls.name), validate_identifier(table)),
        )

    # --- the records' restart point: DuckDB has no SAVEPOINT --------------------------------------

    def savepoint(self) -> Statement | None:
        return None

    def discard_records(
        self, stages: tuple[str, ...], target: str, schema: str | None, run_id: str
    ) -> list[Statement]:
        # Everything loaded since the records started: the staged rows and the rows this run loaded
        # into the target directly (it was empty under the lock: all of its rows are this run's; the
        # deduped table is made after the load).
        return [Statement(f"DELETE FROM {self.stage_ref(stages[0], schema)}"),
                Statement(f"DELETE FROM {self.table_ref(target, schema)} WHERE {self.quote('_bos_run_id')} = "
                          f"{self.placeholder}", (run_id,))]

    # --- the staged file ---------------------------------------------------------------------

    def _file_rows(self, longest_line: int) -> str:
        """``read_json`` of the NDJSON file bound as the next parameter (keys = :data:`STAGE_COLUMNS`),
        whose longest line is ``longest_line`` bytes."""
        types = {**{c: _FILE_TYPES[r] for c, r in _STAGE_ROLES.items()}, "_bos_seq": "BIGINT"}
        return self._read_json({c: types[c] for c in STAGE_COLUMNS}, longest_line)

    def _read_json(self, types: Mapping[str, str], longest_line: int) -> str:
        """``read_json`` of the NDJSON file bound as the next parameter, its keys typed by ``types``."""
        spec = ", ".join(f"{self.quote(c)}: '{kind}'" for c, kind in types.items())
        # One line is one record. read_json holds a buffer of twice this size per thread, inside the
        # database's memory_limit: ask for more than DuckDB's default only when a line needs it.
        object_size = max(int(longest_line) + 1, READ_JSON_OBJECT_SIZE)
        return (f"read_json({self.placeholder}, format = 'newline_delimited', columns = {{{spec}}}, "
                f"maximum_object_size = {object_size})")

    def update_from_file(self, target: str, schema: str | None, path: str, *, key: Sequence[str],
                         columns: Sequence[str], longest_line: int, alike_in: str | None = None) -> Statement:
        """``UPDATE`` the rows of ``target`` that a line of the NDJSON file at ``path`` names by its
        ``key`` columns (the line's fields ``k_<column>``), setting ``columns`` from the line's fields
        of the same names.

        ``alike_in``: the records table whose rows the file rewrites (its key, the ref); then ``target``
        is its history, and the rows updated are the versions of those refs that store the same
        content as the records table's row does (not updated yet)."""
        q = self.quote
        types = {**{f"k_{name}": _FILE_TYPES[_UPDATE_ROLES[name]] for name in key},
                 **{name: _FILE_TYPES[_UPDATE_ROLES[name]] for name in columns}}
        sets = ", ".join(f"{q(name)} = p.{q(name)}" for name in columns)
        match = [f"t.{q(name)} = p.{q(f'k_{name}')}" for name in key]
        source = f"{self._read_json(types, longest_line)} p"
        if alike_in is not None:
            source += f", {self.table_ref(alike_in, schema)} m"
            match += [f"m.{q(key[0])} = p.{q(f'k_{key[0]}')}", same_stored_content(self, "t", "m")]
        return Statement(
            f"UPDATE {self.table_ref(target, schema)} AS t SET {sets} FROM {source} WHERE {' AND '.join(match)}",
            (path,),
        )

    def load_file(self, stage: str, schema: str | None, path: str, *, longest_line: int) -> Statement:
        """``INSERT`` every row of the NDJSON file at ``path`` into ``stage``."""
        cols = ", ".join(self.quote(c) for c in STAGE_COLUMNS)
        return Statement(
            f"INSERT INTO {self.stage_ref(stage, schema)} ({cols}) SELECT {cols} FROM {self._file_rows(longest_line)}",
            (path,),
        )

    def load_file_target(self, target: str, schema: str | None, path: str, *, longest_line: int,
                         synced_at: datetime, run_id: str) -> Statement:
        """``INSERT`` every row of the staged-format NDJSON file at ``path`` into the (empty, locked)
        ``target`` itself, with the run's ``_bos_synced_at`` and ``_bos_run_id`` (the direct load)."""
        values = ", ".join(self.bind_ts() if c == "_bos_synced_at" else self.bind_id() if c == "_bos_run_id"
                           else self.quote(c) for c in self.written_columns)
        return Statement(
            f"INSERT INTO {self.table_ref(target, schema)} ({self._written_column_list()}) SELECT {values} "
            f"FROM {self._file_rows(longest_line)}",
            (self.bind_timestamp(synced_at), run_id, path),
        )

    # --- known records --------------------------------------------------------------------------

    def _wire_state_columns(self) -> str:
        ref, w = self.quote("record_ref"), self.quote(WIRE_HASH_COLUMN)
        # hash() is a 64-bit hash of the pair: any row's wire hash added, removed or changed moves it.
        # Over the current rows, with their number last (as PostgreSQL: see wire_state_counts_current).
        return (f"COUNT({w}), COALESCE(SUM(CAST(HASH({ref}, {w}) AS HUGEINT)) FILTER (WHERE {w} IS NOT NULL), 0), "
                "COUNT(*)")

    def wire_hash_prefixes(self, target: str, schema: str | None) -> Statement:
        w = self.quote(WIRE_HASH_COLUMN)
        prefix = f"SUBSTR({w}, 1, 16)"
        return Statement(
            f"SELECT STRING_AGG({prefix}, '' ORDER BY {prefix}) FILTER (WHERE LENGTH({w}) = 64), "
            f"{self._wire_state_columns()} FROM {self.table_ref(target, schema)} t WHERE {self._current('t')}"
        )

    def stored_wire_state(self, target: str, schema: str | None) -> Statement | None:
        return Statement(f"SELECT {self._wire_state_columns()} FROM {self.table_ref(target, schema)} t "
                         f"WHERE {self._current('t')}")

    def stage_claims(self, stage: str, target: str, schema: str | None, prefixes: Sequence[str],
                     seqs: Sequence[int], observed: Sequence[datetime | None]) -> Statement | None:
        q, p = self.quote, self.placeholder
        ref, w, obs = q("record_ref"), q(WIRE_HASH_COLUMN), q("_bos_observed_at")
        return Statement(
            f"INSERT INTO {self.stage_ref(stage, schema)} ({ref}, {w}, {q('_bos_seq')}, {obs}) "
            f"SELECT t.{ref}, t.{w}, c.seq, c.observed FROM {self.table_ref(target, schema)} t "
            f"JOIN (SELECT UNNEST(CAST({p} AS VARCHAR[])) AS prefix, UNNEST(CAST({p} AS BIGINT[])) AS seq, "
            f"UNNEST(CAST({p} AS TIMESTAMPTZ[])) AS observed) c "
            f"ON SUBSTR(t.{w}, 1, 16) = c.prefix WHERE t.{w} IS NOT NULL AND {self._current('t')}",
            (list(prefixes), list(seqs), list(observed)),
        )

    def collect_unreturned(
        self, missing: str, stage: str, target: str, schema: str | None, unclaimed: Sequence[str],
    ) -> Statement | None:
        return self._unreturned(missing, stage, target, schema, unclaimed, hash_length="LENGTH({w})",
                                prefix="SUBSTR({w}, 1, 16)",
                                prefixes=f"SELECT UNNEST(CAST({self.placeholder} AS VARCHAR[]))")

    # --- lifecycle ----------------------------------------------------------------------------

    def provenance_entries(self, alias: str) -> tuple[str, dict[str, str]]:
        # No JSON_TABLE: the sources array unnested as JSON values, beside their positions.
        array = f"CAST({alias}.{self.quote('sources')} AS JSON[])"
        join = f" CROSS JOIN (SELECT UNNEST({array}) AS v, GENERATE_SUBSCRIPTS({array}, 1) - 1 AS n) p"
        return join, {"entry_index": "p.n", "capabilities": "p.v->'capabilities'",
                      **{c: f"p.v->>'{c}'" for c in ENTRY_TEXT_COLUMNS}}

    # --- merge ------------------------------------------------------------------------------

    def bind_ts(self) -> str:
        return f"CAST({self.placeholder} AS TIMESTAMPTZ)"

    def bind_id(self) -> str:
        return f"CAST({self.placeholder} AS VARCHAR)"

    def merge(self, stage: str, target: str, schema: str | None, *, synced_at: datetime, run_id: str,
              new_only: bool = False) -> list[tuple[Statement, str]]:
        if new_only:
            return [(self.insert_all(stage, target, schema, synced_at=synced_at, run_id=run_id), "inserted")]
        q = self.quote
        ref = q("record_ref")
        cols = self._written_column_list()
        sets = ", ".join([*(f"{q(c)} = excluded.{q(c)}" for c in self.updated_columns),
                          *(f"{q(c)} = NULL" for c in self.lifecycle_resets())])
        target_ref = self.table_ref(target, schema)
        # Only new rows and rows the guard lets through reach the INSERT (as on PostgreSQL): DuckDB
        # rewrites a row an ON CONFLICT touches, so unchanged rows must not get there at all.
        sql = (
            f"INSERT INTO {target_ref} AS t ({cols}) SELECT {self._select_stage_row('s')} "
            f"FROM {self.stage_ref(stage, schema)} s LEFT JOIN {target_ref} o ON o.{ref} = s.{ref} "
            f"WHERE {self._decoded('s')} AND (o.{ref} IS NULL OR "
            f"({self._write_allowed('o', 's')} AND {self._changed('o', 's')})) "
            f"ON CONFLICT ({ref}) DO UPDATE SET {sets} "
            f"WHERE {self._write_allowed('t', 'excluded')} AND {self._changed('t', 'excluded')}"
        )
        return [(Statement(sql, (synced_at, run_id)), "inserted+updated")]


    # --- promoted attributes (see .attribute_sql) ------------------------------------------------

    def _attribute_value(self, column: AttributeColumn) -> Expression:
        a, p = self.quote("attributes"), (column.json_path,)
        kind = (f"json_type({a}, ?)", p)
        value = (f"json_extract({a}, ?)", p)
        text = (f"json_extract_string({a}, ?)", p)
        templates = {
            "text": "CASE WHEN {k} = 'VARCHAR' THEN {t} END",
            "integer": ("CASE WHEN {k} IN ('BIGINT', 'UBIGINT') AND regexp_full_match({t}, '-?[0-9]{1,18}') "
                        "THEN TRY_CAST({t} AS BIGINT) END"),
            "number": "CASE WHEN {k} IN ('BIGINT', 'UBIGINT', 'HUGEINT', 'DOUBLE') THEN TRY_CAST({t} AS DOUBLE) END",
            "boolean": "CASE WHEN {k} = 'BOOLEAN' THEN TRY_CAST({t} AS BOOLEAN) END",
            "json": "CASE WHEN {k} <> 'NULL' THEN {v} END",
            # TRY_CAST refuses a date that does not exist; no offset means UTC.
            "timestamp": (f"CASE WHEN {{k}} = 'VARCHAR' AND regexp_full_match({{t}}, '{TIMESTAMP_PATTERN}') THEN "
                          "TRY_CAST(CASE WHEN regexp_matches({t}, '(Z|[+-][0-9]{2}:[0-9]{2})$') THEN {t} "
                          "ELSE {t} || '+00:00' END AS TIMESTAMPTZ) END"),
        }
        return expand(templates[column.type], k=kind, v=value, t=text)

    def _attribute_present(self, column: AttributeColumn) -> Expression:
        return f"COALESCE(json_type({self.quote('attributes')}, ?), 'NULL') <> 'NULL'", (column.json_path,)


# --- one writer process per file ----------------------------------------------------------------

#: engine -> how long its connects wait for another process's lock on the file.
_lock_waits: weakref.WeakKeyDictionary[sa.Engine, float] = weakref.WeakKeyDictionary()
_prepared_lock = threading.Lock()
#: (database, table) -> the lock this process's writers of that table take in turn.
_table_locks: dict[tuple[str, str], threading.Lock] = {}


def _is_lock_conflict(exc: BaseException) -> bool:
    # duckdb.IOException: 'Could not set lock on file "...": Conflicting lock is held in ... (PID n)'
    return "Could not set lock on file" in str(exc)


def wait_for_file_lock(engine: sa.Engine, timeout_s: float) -> None:
    """Make ``engine``'s connects wait up to ``timeout_s`` for another process's lock on the file.

    DuckDB refuses a second process at ``connect`` (there is no lock wait of its own): retried
    every :data:`_LOCK_RETRY_S` until the deadline, then a :class:`BosWarehouseError` saying what
    happened and what to do. Installed once per engine; called again, it changes the wait.
    """
    with _prepared_lock:
        installed = engine in _lock_waits
        _lock_waits[engine] = timeout_s  # the latest setting wins (the writer's lock_timeout_s)
        if installed:
            return

    @sa.event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, conn_rec: Any, cargs: Any, cparams: Any) -> Any:
        timeout_s = _lock_waits.get(engine, 0.0)
        deadline = time.monotonic() + max(timeout_s, 0.0)
        waited = False
        while True:
            try:
                return dialect.connect(*cargs, **cparams)
            except Exception as exc:
                if not _is_lock_conflict(exc):
                    raise
                if not waited:
                    waited = True
                    log.info("Another process holds the DuckDB database; waiting up to %.0fs for it.", timeout_s)
                if time.monotonic() >= deadline:
                    database = str(cparams.get("database") or "")
                    database = database if database and not database.startswith("md:") else "file"
                    raise BosWarehouseError(
                        f"Another process held the DuckDB database {database} for {timeout_s:.0f}s "
                        "(a DuckDB file has one writer process at a time); retry the task when that "
                        "process is done, or give each writer a file of its own."
                    ) from None
                time.sleep(_LOCK_RETRY_S)

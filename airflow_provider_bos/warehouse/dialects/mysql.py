"""MySQL/MariaDB: executemany staging, UPDATE ... JOIN + INSERT ... LEFT JOIN, GET_LOCK."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from airflow_provider_bos.warehouse.dialects.attribute_sql import Expression, expand
from airflow_provider_bos.warehouse.dialects.base import Statement, WarehouseDialect
from airflow_provider_bos.warehouse.dialects.capabilities import DialectCapabilities
from airflow_provider_bos.warehouse.dialects.lifecycle import PROVENANCE_KEY
from airflow_provider_bos.warehouse.tables.attribute_columns import TIMESTAMP_PATTERN, AttributeColumn
from airflow_provider_bos.warehouse.tables.schema import (
    DELETED_AT_COLUMN,
    SUPERSEDED_BY_COLUMN,
    WIRE_HASH_COLUMN,
)

__all__ = ["MySqlDialect"]


class MySqlDialect(WarehouseDialect):
    """MySQL/MariaDB: executemany staging, UPDATE ... JOIN + INSERT ... LEFT JOIN, GET_LOCK."""

    name = "mysql"
    reject_row_id_sql = "SHA2({record}, 256)"
    # InnoDB REPEATABLE READ fixes the snapshot at the first read (counting the stage): the lock is
    # taken before it, so the snapshot includes the previous writer's commit and the counts match what
    # the merge's locking reads see.
    capabilities = DialectCapabilities(lock_before_staging=True, uses_guard_index=True,
                                       temp_tables_survive_rollback=True, keyed_run_keys=True,
                                       keys_ignore_trailing_spaces=True, max_json_depth=31)

    def stage_ref(self, stage: str, schema: str | None) -> str:
        # Qualified like the target: without a default database an unqualified name has no home.
        return self.table_ref(stage, schema)

    def _temp_suffix(self) -> str:
        # CREATE/DROP TEMPORARY TABLE do not commit implicitly (plain CREATE TABLE would).
        return " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"

    def _keys_equal(self, a: str, b: str) -> str:
        # Exact, as delete_refs: under PAD SPACE a source's id '4711 ' = '4711', which would merge two people.
        # Equal under PAD SPACE and of one length: the same text, whatever the connection's charset.
        same_length = "".join(f" AND CHAR_LENGTH({a}.{c}) = CHAR_LENGTH({b}.{c})" for c in PROVENANCE_KEY)
        return self._entries_match(a, b) + same_length

    def _current_entries_held_by(self, others: str, sources: str) -> str:
        # A join, not the base's EXISTS: with the exact test in a correlated EXISTS, MariaDB 10.11's
        # INSERT ... SELECT inserted no row where the same SELECT alone returned one.
        entry = ", ".join(f"r.{c}" for c in (self.quote("record_ref"), *PROVENANCE_KEY))
        return (f"SELECT DISTINCT {entry} FROM {sources} r JOIN {others} o ON {self._keys_equal('o', 'r')} "
                f"WHERE r.is_current")

    def delete_refs(self, table: str, schema: str | None, column: str, refs: Sequence[str]) -> Statement:
        # Exact: under utf8mb4_bin (PAD SPACE) 'r:7 ' = 'r:7'; equal and of one length, they are the
        # same text. The plain test keeps the key's index.
        p = self.placeholder
        marks, pairs = ", ".join([p] * len(refs)), ", ".join([f"({p}, {p})"] * len(refs))
        column = self.quote(column)
        return Statement(f"DELETE FROM {self.table_ref(table, schema)} WHERE {column} IN ({marks}) "
                         f"AND ({column}, CHAR_LENGTH({column})) IN ({pairs})",
                         (*refs, *(v for ref in refs for v in (ref, len(ref)))))

    def _texts_exactly_in(self, expression: str, values: Sequence[str]) -> tuple[str, tuple[str | int, ...]]:
        # An entry expanded by JSON_TABLE is compared under the connection's default collation, which
        # ignores case (utf8mb4_general_ci: 'CRM-EU' = 'crm-eu') and trailing spaces: in utf8mb4_bin, and
        # of one length (as delete_refs), the same text.
        exact = f"CONVERT({expression} USING utf8mb4) COLLATE utf8mb4_bin"
        pairs = ", ".join([f"({self.placeholder}, {self.placeholder})"] * len(values))
        return (f"({exact}, CHAR_LENGTH({expression})) IN ({pairs})",
                tuple(v for value in values for v in (value, len(value))))

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

    def add_column(self, table: str, schema: str | None, column: str, type_sql: str, *,
                   timeout_s: float) -> list[Statement]:
        # The metadata lock an ALTER waits for: the session's lock_wait_timeout (a year by default).
        return [Statement(f"SET SESSION lock_wait_timeout = {max(1, int(timeout_s))}"),
                *super().add_column(table, schema, column, type_sql, timeout_s=timeout_s)]

    def add_column_reset(self) -> list[Statement]:
        return [Statement("SET SESSION lock_wait_timeout = DEFAULT")]

    def lock_is_flag(self) -> bool:
        return True

    def _index_hint(self, index: str | None) -> str:
        return f" FORCE INDEX ({self.quote(index)})" if index else ""

    def unlock(self, target: str) -> Statement | None:
        return Statement(f"SELECT RELEASE_LOCK({self.placeholder})", (self._lock_name(target),))

    def store_wire_hashes(self, source: str, target: str, schema: str | None) -> Statement:
        ref, w = self.quote("record_ref"), self.quote(WIRE_HASH_COLUMN)
        return Statement(
            f"UPDATE {self.table_ref(target, schema)} t JOIN {self.stage_ref(source, schema)} s "
            f"ON t.{ref} = s.{ref} SET t.{w} = s.{w} WHERE {self._wire_hash_to_store('t', 's')}"
        )

    def adopt_later_copies(self, source: str, target: str, schema: str | None) -> Statement:
        # MySQL cannot read the table an UPDATE writes in a subquery: a multi-table UPDATE instead.
        ref = self.quote("record_ref")
        return Statement(
            f"UPDATE {self.table_ref(target, schema)} t JOIN {self.stage_ref(source, schema)} s "
            f"ON t.{ref} = s.{ref} SET {self._later_copy_sets('t')} WHERE {self._later_copy('t', 's')}"
        )

    def mark_retired(
        self, target: str, keys: str, schema: str | None, *, successor: bool, retired_at: datetime,
        synced_at: datetime, run_id: str,
    ) -> Statement:
        # One UPDATE ... JOIN: a correlated subquery would name the temporary table twice.
        q = self.quote
        ref = q("record_ref")
        sets = [f"t.{q(DELETED_AT_COLUMN)} = {self.placeholder}"]
        if successor:
            sets.append(f"t.{q(SUPERSEDED_BY_COLUMN)} = k.successor_ref")
        sets += [f"t.{q('_bos_run_id')} = {self.placeholder}", f"t.{q('_bos_synced_at')} = {self.placeholder}"]
        return Statement(
            f"UPDATE {self.table_ref(target, schema)} t JOIN {self.stage_ref(keys, schema)} k ON k.{ref} = t.{ref} "
            f"SET {', '.join(sets)}",
            (self.bind_timestamp(retired_at), run_id, self.bind_timestamp(synced_at)),
        )

    def merge(
        self, stage: str, target: str, schema: str | None, *, synced_at: datetime, run_id: str, new_only: bool = False
    ) -> list[tuple[Statement, str]]:
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
        sets += [f"t.{q(col)} = NULL" for col in self.lifecycle_resets()]
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

    # --- promoted attributes (see .attribute_sql) ------------------------------------------------

    def _attribute_value(self, column: AttributeColumn) -> Expression:
        a, p = self.quote("attributes"), (column.json_path,)
        kind = (f"JSON_TYPE(JSON_EXTRACT({a}, {self.placeholder}))", p)
        value = (f"JSON_EXTRACT({a}, {self.placeholder})", p)
        text = (f"JSON_UNQUOTE(JSON_EXTRACT({a}, {self.placeholder}))", p)
        templates = {
            "text": "CASE WHEN {k} = 'STRING' THEN {t} END",
            "integer": "CASE WHEN {k} = 'INTEGER' AND {t} REGEXP '^-?[0-9]{1,18}$' THEN CAST({t} AS SIGNED) END",
            "number": "CASE WHEN {k} IN ('INTEGER', 'DOUBLE') THEN CAST({t} AS DOUBLE) END",
            "boolean": "CASE WHEN {k} = 'BOOLEAN' THEN {t} = 'true' END",
            "json": "CASE WHEN {k} <> 'NULL' THEN {v} END",
            # The shape, a date that exists, then the offset (none: UTC) converted away.
            "timestamp": (
                "CASE WHEN {k} IS NULL OR {k} <> 'STRING' THEN NULL "
                f"WHEN NOT ({{t}} REGEXP '{TIMESTAMP_PATTERN}') THEN NULL "
                "WHEN CAST(SUBSTRING({t}, 9, 2) AS UNSIGNED) > DAY(LAST_DAY(CONCAT(SUBSTRING({t}, 1, 7), '-01'))) "
                "THEN NULL "
                "WHEN RIGHT({t}, 1) = 'Z' THEN "
                "CAST(REPLACE(SUBSTRING({t}, 1, CHAR_LENGTH({t}) - 1), 'T', ' ') AS DATETIME(6)) "
                "WHEN {t} REGEXP '[+-][0-9]{2}:[0-9]{2}$' THEN CONVERT_TZ(CAST(REPLACE(SUBSTRING({t}, 1, "
                "CHAR_LENGTH({t}) - 6), 'T', ' ') AS DATETIME(6)), RIGHT({t}, 6), '+00:00') "
                "ELSE CAST(REPLACE({t}, 'T', ' ') AS DATETIME(6)) END"),
        }
        return expand(templates[column.type], k=kind, v=value, t=text)

    def _attribute_present(self, column: AttributeColumn) -> Expression:
        value = f"JSON_TYPE(JSON_EXTRACT({self.quote('attributes')}, {self.placeholder}))"
        return f"COALESCE({value}, 'NULL') <> 'NULL'", (column.json_path,)

    def _has_value(self, column: str, *, text: bool) -> str:
        # The length, not `<> ''`: a PAD SPACE collation makes '  ' equal to '' (whitespace is a value
        # on every other database), and CHAR_LENGTH reads any type as its text (no CAST to LONGTEXT).
        return f"{column} IS NOT NULL AND CHAR_LENGTH({column}) > 0"

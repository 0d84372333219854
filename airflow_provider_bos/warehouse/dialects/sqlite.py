"""SQLite: executemany staging, one ON CONFLICT merge, BEGIN IMMEDIATE as the writer lock."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosWarehouseError
from airflow_provider_bos.warehouse.dialects.attribute_sql import Expression, expand
from airflow_provider_bos.warehouse.dialects.base import Statement, WarehouseDialect
from airflow_provider_bos.warehouse.dialects.capabilities import DialectCapabilities
from airflow_provider_bos.warehouse.dialects.lifecycle import ENTRY_TEXT_COLUMNS
from airflow_provider_bos.warehouse.tables.attribute_columns import AttributeColumn

__all__ = ["SqliteDialect"]


_INT18 = "999999999999999999"
# The shape of a timestamp (the fraction and offset are left to strftime, which refuses others).
_TS_GLOB = "'[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9][T ][0-9][0-9]:[0-9][0-9]:[0-9][0-9]*'"


class SqliteDialect(WarehouseDialect):
    """SQLite: executemany staging, one ON CONFLICT merge, BEGIN IMMEDIATE as the writer lock."""

    name = "sqlite"
    reject_row_id_sql = "rowid"  # no hash function built in; a row keeps its rowid in the transaction
    capabilities = DialectCapabilities()

    @classmethod
    def writer_options(cls, *, lock_timeout_s: float, sqlite_busy_timeout_s: float | None,
                       use_copy: bool | None) -> dict[str, Any]:
        # A SQLite writer holds the whole file for its run: waiting for it IS the lock wait.
        return {"busy_timeout_s": lock_timeout_s if sqlite_busy_timeout_s is None else sqlite_busy_timeout_s}

    def __init__(self, sa_dialect: sa.Dialect, *, busy_timeout_s: float = 30.0, wire_hash_column: bool = True) -> None:
        super().__init__(sa_dialect, wire_hash_column=wire_hash_column)
        self.busy_timeout_s = busy_timeout_s
        version = sqlite3.sqlite_version_info
        if version < (3, 25, 0):
            raise BosWarehouseError(
                f"SQLite {sqlite3.sqlite_version} is too old: upserts and window functions need 3.25 or newer."
            )

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

    def provenance_entries(self, alias: str) -> tuple[str, dict[str, str]]:
        join = f" CROSS JOIN JSON_EACH({alias}.{self.quote('sources')}) AS p"
        return join, {"entry_index": "p.key", "capabilities": "JSON_EXTRACT(p.value, '$.capabilities')",
                      **{c: f"JSON_EXTRACT(p.value, '$.{c}')" for c in ENTRY_TEXT_COLUMNS}}

    def begin(self) -> list[Statement]:
        # Take the write lock up front: counts and merge then see the same table.
        return [
            Statement(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}"),
            Statement("BEGIN IMMEDIATE"),
        ]

    def _hash_differs(self, old: str, new: str) -> str:
        return f"{old} IS NOT {new}"

    def merge(
        self, stage: str, target: str, schema: str | None, *, synced_at: datetime, run_id: str, new_only: bool = False
    ) -> list[tuple[Statement, str]]:
        if new_only:
            return [(self.insert_all(stage, target, schema, synced_at=synced_at, run_id=run_id), "inserted")]
        q = self.quote
        cols = self._written_column_list()
        sets = ", ".join([*(f"{q(c)} = excluded.{q(c)}" for c in self.updated_columns),
                          *(f"{q(c)} = NULL" for c in self.lifecycle_resets())])
        # The WHERE (known rows are never written) also keeps the parser from reading ON CONFLICT
        # as a join constraint.
        sql = (
            f"INSERT INTO {self.table_ref(target, schema)} AS t ({cols}) "
            f"SELECT {self._select_stage_row('s')} FROM {self.stage_ref(stage, schema)} s WHERE {self._decoded('s')} "
            f"ON CONFLICT ({q('record_ref')}) DO UPDATE SET {sets} "
            f"WHERE {self._write_allowed('t', 'excluded')} AND {self._changed('t', 'excluded')}"
        )
        return [(Statement(sql, (self.bind_timestamp(synced_at), run_id)), "inserted+updated")]

    # --- promoted attributes (see .attribute_sql) ------------------------------------------------

    def _attribute_value(self, column: AttributeColumn) -> Expression:
        a, p = self.quote("attributes"), (column.json_path,)
        kind = (f"json_type({a}, ?)", p)
        value = (f"json_extract({a}, ?)", p)
        templates = {
            "text": "CASE WHEN {k} = 'text' THEN {v} END",
            "integer": (f"CASE WHEN {{k}} = 'integer' AND {{v}} BETWEEN -{_INT18} AND {_INT18} THEN {{v}} END"),
            "number": "CASE WHEN {k} IN ('integer', 'real') THEN CAST({v} AS REAL) END",
            "boolean": "CASE {k} WHEN 'true' THEN 1 WHEN 'false' THEN 0 END",
            "json": "CASE WHEN {k} <> 'null' THEN {j} END",
            # The date must exist (a julian day rolls 02-30 over), then strftime gives UTC; SQLAlchemy
            # reads six fraction digits, SQLite keeps three.
            "timestamp": ("CASE WHEN {k} = 'text' AND {v} GLOB " + _TS_GLOB + " AND "
                          "date(julianday(substr({v}, 1, 10))) = substr({v}, 1, 10) "
                          "THEN strftime('%Y-%m-%d %H:%M:%f', {v}) || '000' END"),
        }
        return expand(templates[column.type], k=kind, v=value, j=(f"({a} -> ?)", p))

    def _attribute_present(self, column: AttributeColumn) -> Expression:
        return f"COALESCE(json_type({self.quote('attributes')}, ?), 'null') <> 'null'", (column.json_path,)

"""Snowflake: multi-row INSERT staging, one MERGE, VARIANT by PARSE_JSON, TIMESTAMP_TZ.

What differs from the other dialects, and why:

- **Identifiers.** snowflake-sqlalchemy's preparer leaves an all-lower-case name unquoted, so
  Snowflake folds it to upper case: ``destination_table="bos_records"`` is the table
  ``BOS_RECORDS``, which any unquoted reference (``select * from bos_records``) finds. A name with
  an upper-case letter is quoted as given and is case-sensitive (``"Bos_Records"``).
- **Staging.** Rows go into a TEMPORARY table by ``executemany``: with the connector's client-side
  binding (pyformat) one chunk is ONE multi-row ``INSERT ... VALUES (...), (...)`` statement, so a
  run sends O(chunks) statements, not one per record. A chunk is at most ``capabilities.max_batch_rows``
  rows, which keeps a statement of ~1.3 KB records under Snowflake's statement-size limit.
  JSON is staged as text and parsed (``PARSE_JSON``) only for the rows the MERGE writes.
- **VALUES takes no PARSE_JSON.** Snowflake refuses expressions like ``PARSE_JSON(?)`` in a
  ``VALUES`` list, so every insert that parses JSON is ``INSERT ... SELECT`` instead.
- **DDL commits.** Any DDL (temporary tables included) commits the open transaction, so the
  staging tables are made before the run's first write and dropped after its commit
  (``capabilities.ddl_commits``); the records, the audit row and the rejects commit together.
- **No savepoints.** A restarted final frame empties the staging tables instead
  (:meth:`discard_records`): nothing reaches the target before the MERGE.
- **No LOCK TABLE.** Snowflake serialises concurrent MERGEs into one table itself; a writer that
  slips between classification and MERGE changes the MERGE's row count, which the writer checks,
  so the run rolls back instead of reporting wrong counts.
- **Primary keys are not enforced.** The MERGE's ON clause keeps ``record_ref`` unique, the
  dedupe step makes the source one row per key.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from airflow_provider_bos.warehouse.dialects.attribute_sql import Expression, expand
from airflow_provider_bos.warehouse.dialects.base import Statement, WarehouseDialect
from airflow_provider_bos.warehouse.dialects.capabilities import DialectCapabilities
from airflow_provider_bos.warehouse.dialects.lifecycle import ENTRY_TEXT_COLUMNS
from airflow_provider_bos.warehouse.tables.attribute_columns import TIMESTAMP_PATTERN, AttributeColumn
from airflow_provider_bos.warehouse.tables.schema import (
    DELETED_AT_COLUMN,
    RECORD_JSON_COLUMNS,
    SUPERSEDED_BY_COLUMN,
)

__all__ = ["SnowflakeDialect"]


class SnowflakeDialect(WarehouseDialect):
    """Snowflake through snowflake-sqlalchemy: multi-row INSERT staging and one MERGE."""

    name = "snowflake"
    reject_row_id_sql = "SHA2(TO_VARCHAR({record}, 'HEX'), 256)"  # SHA2 is documented for text
    # No direct load: no cheaper path into an empty table to pay for a second load path (no COPY from
    # the client; PUT + COPY INTO needs a stage and a file). 500 rows per multi-row INSERT: ~1.3 KB
    # records make ~0.65 MB of statement text.
    capabilities = DialectCapabilities(direct_load=False, ddl_commits=True, max_batch_rows=500)

    # --- identifiers and values -----------------------------------------------------------------

    def stage_ref(self, stage: str, schema: str | None) -> str:
        # Qualified like the target: a connection without a current schema has no home for it.
        return self.table_ref(stage, schema)

    def bind_timestamp(self, value: datetime) -> Any:
        # ISO 8601 with its offset: TIMESTAMP_TZ keeps the offset, and the text form needs no
        # session time zone to be read back as the same instant.
        return value.astimezone(UTC).isoformat()

    def bind_ts(self) -> str:
        return f"CAST({self.placeholder} AS TIMESTAMP_TZ)"

    def bind_id(self) -> str:
        return f"CAST({self.placeholder} AS VARCHAR(64))"

    def bind_json(self) -> str:
        return f"PARSE_JSON({self.placeholder})"

    # --- transaction framing --------------------------------------------------------------------

    def savepoint(self) -> Statement | None:
        return None

    def discard_records(
        self, stages: tuple[str, ...], target: str, schema: str | None, run_id: str
    ) -> list[Statement]:
        return [Statement(f"DELETE FROM {self.stage_ref(s, schema)}") for s in stages]

    # --- staging --------------------------------------------------------------------------------

    def _stage_column_defs(self, *, with_seq: bool, parse_json: bool = False) -> list[str]:
        # JSON stays text in staging: an unchanged re-run parses none of it.
        variant = self.type_sql("json")
        return [d.replace(f" {variant}", " VARCHAR", 1) for d in super()._stage_column_defs(with_seq=with_seq)]

    def create_deduped(self, stage: str, schema: str | None, *, parse_json: bool = False) -> Statement:
        # No PRIMARY KEY (Snowflake would not enforce it): dedupe makes the rows distinct.
        cols = ", ".join(self._stage_column_defs(with_seq=False))
        return Statement(f"CREATE TEMPORARY TABLE IF NOT EXISTS {self.stage_ref(stage, schema)} ({cols})")

    def dedupe(self, src: str, dst: str, schema: str | None, target: str) -> Statement:
        # A known row without its claim's own stamp takes the stored row's: a join, not a correlated
        # subquery (which Snowflake does not evaluate inside a window's ORDER BY).
        q = self.quote
        cols = [c for c in self.stage_columns if c != "_bos_seq"]
        col_list = ", ".join(q(c) for c in cols)
        ref, obs = q("record_ref"), q("_bos_observed_at")
        return Statement(
            f"INSERT INTO {self.stage_ref(dst, schema)} ({col_list}) "
            f"SELECT {', '.join(f's.{q(c)}' for c in cols)} FROM {self.stage_ref(src, schema)} s "
            f"LEFT JOIN {self.table_ref(target, schema)} t ON t.{ref} = s.{ref} "
            f"QUALIFY ROW_NUMBER() OVER (PARTITION BY s.{ref} ORDER BY COALESCE(s.{obs}, t.{obs}) DESC, "
            f"s.{q('_bos_seq')} DESC) = 1"
        )

    def _staged_value(self, s: str, col: str) -> str:
        if col in RECORD_JSON_COLUMNS:
            return f"PARSE_JSON({s}.{self.quote(col)})"
        return f"{s}.{self.quote(col)}"

    # --- the merge ------------------------------------------------------------------------------

    def _source(self, stage: str, schema: str | None) -> str:
        """The MERGE's source: the staged rows that carry content, as target rows (JSON parsed,
        the run's columns added), so every SET and INSERT value is a plain column of it."""
        q = self.quote
        values = ", ".join(f"{v} AS {q(c)}" for c, v in zip(self.written_columns, self._select_list(), strict=True))
        return f"(SELECT {values} FROM {self.stage_ref(stage, schema)} s WHERE {self._decoded('s')}) s"

    def _select_list(self) -> list[str]:
        parts = []
        for col in self.written_columns:
            if col == "_bos_synced_at":
                parts.append(self.bind_ts())
            elif col == "_bos_run_id":
                parts.append(self.bind_id())
            else:
                parts.append(self._staged_value("s", col))
        return parts

    def merge(
        self, stage: str, target: str, schema: str | None, *, synced_at: datetime, run_id: str, new_only: bool = False
    ) -> list[tuple[Statement, str]]:
        if new_only:
            return [(self.insert_all(stage, target, schema, synced_at=synced_at, run_id=run_id), "inserted")]
        q = self.quote
        ref = q("record_ref")
        # A written row is current again: its lifecycle columns go back to NULL.
        sets = ", ".join([*(f"{q(c)} = s.{q(c)}" for c in self.updated_columns),
                          *(f"{q(c)} = NULL" for c in self.lifecycle_resets())])
        cols = self._written_column_list()
        values = ", ".join(f"s.{q(c)}" for c in self.written_columns)
        sql = (
            f"MERGE INTO {self.table_ref(target, schema)} t USING {self._source(stage, schema)} "
            f"ON t.{ref} = s.{ref} "
            f"WHEN MATCHED AND {self._write_allowed('t', 's')} AND {self._changed('t', 's')} THEN UPDATE SET {sets} "
            f"WHEN NOT MATCHED THEN INSERT ({cols}) VALUES ({values})"
        )
        return [(Statement(sql, (self.bind_timestamp(synced_at), run_id)), "inserted+updated")]

    def adopt_later_copies(self, source: str, target: str, schema: str | None) -> Statement:
        ref = self.quote("record_ref")
        return Statement(
            f"UPDATE {self.table_ref(target, schema)} t SET {self._later_copy_sets()} "
            f"FROM {self.stage_ref(source, schema)} s WHERE t.{ref} = s.{ref} AND {self._later_copy('t', 's')}"
        )

    # --- lifecycle (supersede, retire, history) ------------------------------------------------------

    def provenance_entries(self, alias: str) -> tuple[str, dict[str, str]]:
        # FLATTEN: one row per element of the VARIANT array, with its INDEX.
        join = f", LATERAL FLATTEN(INPUT => {alias}.{self.quote('sources')}) p"
        return join, {"entry_index": "p.index", "capabilities": "p.value:capabilities",
                      **{c: f"p.value:{c}::VARCHAR" for c in ENTRY_TEXT_COLUMNS}}

    def mark_retired(
        self, target: str, keys: str, schema: str | None, *, successor: bool, retired_at: datetime,
        synced_at: datetime, run_id: str,
    ) -> Statement:
        if not successor:
            return super().mark_retired(target, keys, schema, successor=False, retired_at=retired_at,
                                        synced_at=synced_at, run_id=run_id)
        # UPDATE ... FROM: Snowflake evaluates no correlated subquery in a SET clause.
        q = self.quote
        ref = q("record_ref")
        p = self.placeholder
        return Statement(
            f"UPDATE {self.table_ref(target, schema)} t SET {q(DELETED_AT_COLUMN)} = {p}, "
            f"{q(SUPERSEDED_BY_COLUMN)} = k.successor_ref, {q('_bos_run_id')} = {p}, {q('_bos_synced_at')} = {p} "
            f"FROM {self.stage_ref(keys, schema)} k WHERE t.{ref} = k.{ref}",
            (self.bind_timestamp(retired_at), run_id, self.bind_timestamp(synced_at)),
        )

    # --- audit ----------------------------------------------------------------------------------

    def insert_audit(self, audit: str, schema: str | None, columns: list[str], json_columns: set[str]) -> Statement:
        # INSERT ... SELECT: PARSE_JSON is not allowed in a VALUES list.
        cols = ", ".join(self.quote(c) for c in columns)
        marks = ", ".join(self.bind_json() if c in json_columns else self.placeholder for c in columns)
        return Statement(f"INSERT INTO {self.table_ref(audit, schema)} ({cols}) SELECT {marks}")

    def insert_target(self, target: str, schema: str | None) -> Statement:
        cols = self.written_columns
        marks = ", ".join(self.bind_json() if c in RECORD_JSON_COLUMNS else self.placeholder for c in cols)
        return Statement(f"INSERT INTO {self.table_ref(target, schema)} ({self._written_column_list()}) SELECT {marks}")

    # --- promoted attributes (see .attribute_sql) ------------------------------------------------

    def _attribute_value(self, column: AttributeColumn) -> Expression:
        # The JSON type is read from the value's JSON text (TO_JSON): a string starts with a quote,
        # a number is a number's text. (TYPEOF would say the same on Snowflake, not on fakesnow.)
        a, p = self.quote("attributes"), (column.json_path[2:],)
        value = (f"GET_PATH({a}, {self.placeholder})", p)
        text = (f"GET_PATH({a}, {self.placeholder})::VARCHAR", p)
        json = (f"TO_JSON(GET_PATH({a}, {self.placeholder}))", p)
        templates = {
            "text": "CASE WHEN LEFT({j}, 1) = '\"' THEN {t} END",
            "integer": "CASE WHEN REGEXP_LIKE({j}, '^-?[0-9]{1,18}$') THEN CAST({j} AS BIGINT) END",
            "number": ("CASE WHEN REGEXP_LIKE({j}, '^-?[0-9]+([.][0-9]+)?([eE][+-]?[0-9]+)?$') "
                       "THEN CAST({j} AS DOUBLE) END"),
            "boolean": "CASE {j} WHEN 'true' THEN TRUE WHEN 'false' THEN FALSE END",
            "json": "CASE WHEN {j} <> 'null' THEN {v} END",
            # The shape; TRY_CAST refuses a date that does not exist; no offset means UTC.
            "timestamp": (f"CASE WHEN LEFT({{j}}, 1) = '\"' AND REGEXP_LIKE({{t}}, '{TIMESTAMP_PATTERN}') THEN "
                          "TRY_CAST(CASE WHEN RIGHT({t}, 1) = 'Z' THEN LEFT({t}, LEN({t}) - 1) || '+00:00' "
                          "WHEN REGEXP_LIKE({t}, '.*[+-][0-9]{2}:[0-9]{2}$') THEN {t} ELSE {t} || '+00:00' END "
                          "AS TIMESTAMP_TZ) END"),
        }
        return expand(templates[column.type], v=value, t=text, j=json)

    def _attribute_present(self, column: AttributeColumn) -> Expression:
        return (f"COALESCE(TO_JSON(GET_PATH({self.quote('attributes')}, {self.placeholder})), 'null') <> 'null'",
                (column.json_path[2:],))

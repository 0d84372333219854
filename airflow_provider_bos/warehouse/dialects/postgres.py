"""PostgreSQL: COPY (psycopg 3) into document staging or straight into an empty target, one merge."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.warehouse.dialects.attribute_sql import Expression, expand
from airflow_provider_bos.warehouse.dialects.base import Statement, WarehouseDialect
from airflow_provider_bos.warehouse.dialects.capabilities import DialectCapabilities, LoadMethod
from airflow_provider_bos.warehouse.dialects.lifecycle import ENTRY_TEXT_COLUMNS
from airflow_provider_bos.warehouse.tables.attribute_columns import TIMESTAMP_PATTERN, AttributeColumn
from airflow_provider_bos.warehouse.tables.copy_format import TargetCopyLines, copy_document_lines
from airflow_provider_bos.warehouse.tables.schema import RECORD_JSON_COLUMNS, WIRE_HASH_COLUMN

__all__ = ["PostgresDialect"]


class PostgresDialect(WarehouseDialect):
    """PostgreSQL: COPY into a temp table (psycopg 3), one ON CONFLICT merge, table lock."""

    name = "postgresql"

    @classmethod
    def writer_options(cls, *, lock_timeout_s: float, sqlite_busy_timeout_s: float | None,
                       use_copy: bool | None) -> dict[str, Any]:
        return {"use_copy": use_copy}

    def __init__(self, sa_dialect: sa.Dialect, *, use_copy: bool | None = None, wire_hash_column: bool = True) -> None:
        super().__init__(sa_dialect, wire_hash_column=wire_hash_column)
        # COPY needs psycopg 3; ``use_copy=False`` turns it off (executemany staging).
        copy = sa_dialect.driver == "psycopg" and use_copy is not False
        # READ COMMITTED: each statement sees every commit made before it; with the table lock, counts
        # stay exact.
        self.capabilities = DialectCapabilities(
            load_method=LoadMethod.COPY if copy else LoadMethod.ROWS, isolation_level="READ COMMITTED",
            wire_hash_prefixes_aggregated=True, wire_state_counts_current=True, reads_beside_writes=True)

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
        if self.capabilities.document_staging:
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

    def adopt_later_copies(self, source: str, target: str, schema: str | None) -> Statement:
        if not self.capabilities.document_staging:
            return super().adopt_later_copies(source, target, schema)
        ref = self.quote("record_ref")
        return Statement(
            f"UPDATE {self.table_ref(target, schema)} t SET {self._later_copy_sets(s='x')} "
            f"FROM {self._documents(source, schema)} WHERE t.{ref} = x.{ref} AND {self._later_copy('t', 'x')}"
        )

    def insert_all(self, stage: str, target: str, schema: str | None, *, synced_at: datetime, run_id: str) -> Statement:
        if not self.capabilities.document_staging:
            return super().insert_all(stage, target, schema, synced_at=synced_at, run_id=run_id)
        cols = self._written_column_list()
        return Statement(
            f"INSERT INTO {self.table_ref(target, schema)} ({cols}) "
            f"SELECT {self._select_stage_row('x')} FROM {self._documents(stage, schema)}",
            (self.bind_timestamp(synced_at), run_id),
        )

    def _staged_value(self, s: str, col: str) -> str:
        if self.capabilities.document_staging:  # ``s`` is :meth:`_documents`'s row: the document as JSONB in s.bos_doc
            if col in ("display_name", "email", "phone"):
                return f"{s}.bos_doc->>'{col}'"  # JSON null -> NULL
            if col in ("lifecycle", "identity_match"):
                return f"NULLIF({s}.bos_doc->'{col}', 'null'::jsonb)"  # JSON null is stored as NULL
            if col in ("attributes", "sources"):
                return f"{s}.bos_doc->'{col}'"
        elif col in RECORD_JSON_COLUMNS:
            return f"CAST({s}.{self.quote(col)} AS JSONB)"  # staged as text unless parse_json
        return f"{s}.{self.quote(col)}"

    def wire_hash_prefixes(self, target: str, schema: str | None) -> Statement:
        # One text value, sorted bytewise (COLLATE "C"), instead of a row per stored record:
        # 200k rows through the driver cost ~0.3 s, this ~0.1 s (measured). With the table's
        # state token (see stored_wire_state), taken in the same scan and snapshot.
        w = self.quote(WIRE_HASH_COLUMN)
        prefix = f'SUBSTR({w}, 1, 16) COLLATE "C"'
        # OCTET_LENGTH: LENGTH counts characters, which costs a third of the scan.
        return Statement(
            f"SELECT STRING_AGG({prefix}, '' ORDER BY {prefix}) FILTER (WHERE OCTET_LENGTH({w}) = 64), "
            f"{self._wire_state_columns()} FROM {self.table_ref(target, schema)} t WHERE {self._current('t')}"
        )

    def _wire_state_columns(self) -> str:
        # How many rows have a wire hash, and the sum of a 64-bit hash of each (record_ref, wire
        # hash) pair: any row with a wire hash added, removed or changed changes it. A full scan of
        # the table but no join: ~40 ms per 200k rows, where joining 200k staged claims took ~200 ms.
        # Over the current rows only (a retired row's hash is not offered to the read), with their
        # number last: equal tokens also mean the same number of current rows (see reconcile.py).
        ref, w = self.quote("record_ref"), self.quote(WIRE_HASH_COLUMN)
        return f"COUNT({w}), COALESCE(SUM(HASHTEXTEXTENDED({w}, HASHTEXT({ref}))), 0), COUNT(*)"

    def stored_wire_state(self, target: str, schema: str | None) -> Statement | None:
        return Statement(f"SELECT {self._wire_state_columns()} FROM {self.table_ref(target, schema)} t "
                         f"WHERE {self._current('t')}")

    def stage_claims(
        self, stage: str, target: str, schema: str | None, prefixes: Sequence[str], seqs: Sequence[int],
        observed: Sequence[datetime | None],
    ) -> Statement | None:
        q, p = self.quote, self.placeholder
        ref, w, obs = q("record_ref"), q(WIRE_HASH_COLUMN), q("_bos_observed_at")
        return Statement(
            f"INSERT INTO {self.stage_ref(stage, schema)} ({ref}, {w}, {q('_bos_seq')}, {obs}) "
            f"SELECT t.{ref}, t.{w}, c.seq, c.observed FROM {self.table_ref(target, schema)} t "
            f"JOIN UNNEST(CAST({p} AS TEXT[]), CAST({p} AS BIGINT[]), CAST({p} AS TIMESTAMPTZ[])) "
            "AS c(prefix, seq, observed) "
            f'ON SUBSTR(t.{w}, 1, 16) COLLATE "C" = c.prefix '  # bytewise: cheap to sort
            f"WHERE t.{w} IS NOT NULL AND {self._current('t')}",
            (list(prefixes), list(seqs), list(observed)),
        )

    def collect_unreturned(
        self, missing: str, stage: str, target: str, schema: str | None, unclaimed: Sequence[str],
    ) -> Statement | None:
        listed = f"SELECT u.prefix FROM UNNEST(CAST({self.placeholder} AS TEXT[])) AS u(prefix)"
        return self._unreturned(missing, stage, target, schema, unclaimed, hash_length="OCTET_LENGTH({w})",
                                prefix='SUBSTR({w}, 1, 16) COLLATE "C"', prefixes=listed)

    def unreturned_settings(self, missing: str, schema: str | None) -> list[Statement]:
        # The rows the run did not return are usually few: with their number known (ANALYZE of
        # the work table) the steps reading them look rows up by key instead of scanning the table.
        return [Statement(f"ANALYZE {self.stage_ref(missing, schema)}"), Statement("SET LOCAL enable_nestloop = on")]

    def count_distinct(self, stage: str, schema: str | None) -> Statement:
        # A hashed DISTINCT beats COUNT(DISTINCT ...)'s sort (~30% at 200k rows).
        ref = self.quote("record_ref")
        return Statement(f"SELECT COUNT(*) FROM (SELECT DISTINCT {ref} FROM {self.stage_ref(stage, schema)}) d")

    def reconcile_settings(self) -> list[Statement]:
        # The table may have been loaded in this very transaction (no statistics yet): a nested-loop
        # anti-join chosen on a guess of a few rows costs rows x rows. Hash joins either way.
        return [Statement("SET LOCAL enable_nestloop = off")]

    def entry_lookup_settings(self) -> list[Statement]:
        # The entries held twice are few: their rows looked up in the entry index, not a hash join
        # of every entry with every other (it reads no run table, so no guess about one misleads it).
        return [Statement("SET LOCAL enable_nestloop = on")]

    def _fence(self) -> str:
        return " OFFSET 0"  # keeps the planner from expanding JSON before the anti-join filters rows

    def provenance_entries(self, alias: str) -> tuple[str, dict[str, str]]:
        join = f" CROSS JOIN LATERAL JSONB_ARRAY_ELEMENTS({alias}.{self.quote('sources')}) WITH ORDINALITY AS p(v, n)"
        return join, {"entry_index": "p.n - 1", "capabilities": "p.v->'capabilities'",
                      **{c: f"p.v->>'{c}'" for c in ENTRY_TEXT_COLUMNS}}

    def copy_lines(self, rows: Iterable[tuple[Any, ...]]) -> Iterator[bytes]:
        """COPY lines of document-staged rows (for :meth:`copy_staging`)."""
        return copy_document_lines(rows)

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

    def add_column(self, table: str, schema: str | None, column: str, type_sql: str, *,
                   timeout_s: float) -> list[Statement]:
        # ALTER TABLE queues for ACCESS EXCLUSIVE behind any open reader of the table, and every
        # writer queues behind it: give up soon instead (the caller goes on without the column).
        return [Statement(f"SET LOCAL lock_timeout = '{int(timeout_s * 1000)}ms'"),
                *super().add_column(table, schema, column, type_sql, timeout_s=timeout_s)]

    def lock(self, target: str, *, timeout_s: float) -> list[Statement]:
        # SHARE ROW EXCLUSIVE conflicts with itself and with writers, not with readers.
        return [
            Statement(f"SET LOCAL lock_timeout = '{int(timeout_s * 1000)}ms'"),
            Statement(f"LOCK TABLE {target} IN SHARE ROW EXCLUSIVE MODE"),
        ]

    def merge(
        self, stage: str, target: str, schema: str | None, *, synced_at: datetime, run_id: str, new_only: bool = False
    ) -> list[tuple[Statement, str]]:
        if new_only:
            return [(self.insert_all(stage, target, schema, synced_at=synced_at, run_id=run_id), "inserted")]
        q = self.quote
        ref = q("record_ref")
        cols = self._written_column_list()
        sets = ", ".join([*(f"{q(c)} = EXCLUDED.{q(c)}" for c in self.updated_columns),
                          *(f"{q(c)} = NULL" for c in self.lifecycle_resets())])
        target_ref = self.table_ref(target, schema)
        # Only new rows and rows the guard lets through reach the INSERT (the table lock keeps this
        # equal to the classification); unchanged rows cost one join probe, no write, no JSONB cast.
        # The ON CONFLICT guard stays as the authoritative check.
        join = (
            f" LEFT JOIN {target_ref} o ON o.{ref} = s.{ref} WHERE {self._decoded('s')} AND "
            f"(o.{ref} IS NULL OR ({self._write_allowed('o', 's')} AND {self._changed('o', 's')}))"
        )
        if self.capabilities.document_staging:
            select = f"SELECT {self._select_stage_row('x')} FROM {self._documents(stage, schema, join)}"
        else:
            select = f"SELECT {self._select_stage_row('s')} FROM {self.stage_ref(stage, schema)} s{join}"
        sql = (
            f"INSERT INTO {target_ref} AS t ({cols}) {select} "
            f"ON CONFLICT ({ref}) DO UPDATE SET {sets} "
            f"WHERE {self._write_allowed('t', 'EXCLUDED')} AND {self._changed('t', 'EXCLUDED')}"
        )
        return [(Statement(sql, (synced_at, run_id)), "inserted+updated")]

    # --- promoted attributes (see .attribute_sql) ------------------------------------------------

    def _attribute_value(self, column: AttributeColumn) -> Expression:
        a, keys = self.quote("attributes"), column.keys
        marks = ", ".join([self.placeholder] * len(keys))
        value = (f"jsonb_extract_path({a}, {marks})", keys)
        text = (f"jsonb_extract_path_text({a}, {marks})", keys)
        templates = {
            "text": "CASE WHEN jsonb_typeof({v}) = 'string' THEN {t} END",
            "integer": ("CASE WHEN jsonb_typeof({v}) = 'number' AND {t} ~ '^-?[0-9]{1,18}$' "
                        "THEN CAST({t} AS BIGINT) END"),
            "number": "CASE WHEN jsonb_typeof({v}) = 'number' THEN CAST({t} AS DOUBLE PRECISION) END",
            "boolean": "CASE WHEN jsonb_typeof({v}) = 'boolean' THEN CAST({t} AS BOOLEAN) END",
            "json": "NULLIF({v}, 'null'::jsonb)",
            # Each WHEN guards the next (CASE evaluates in order; AND does not): the shape, then a
            # date that exists (date arithmetic never raises), then the cast; no offset means UTC.
            "timestamp": (
                "CASE WHEN jsonb_typeof({v}) IS DISTINCT FROM 'string' THEN NULL "
                f"WHEN NOT ({{t}} ~ '{TIMESTAMP_PATTERN}') THEN NULL "
                "WHEN to_char(CAST(substr({t}, 1, 8) || '01' AS DATE) + (CAST(substr({t}, 9, 2) AS INTEGER) - 1), "
                "'YYYY-MM-DD') <> substr({t}, 1, 10) THEN NULL "
                "WHEN {t} ~ '(Z|[+-][0-9]{2}:[0-9]{2})$' THEN CAST({t} AS TIMESTAMPTZ) "
                "ELSE CAST({t} AS TIMESTAMP) AT TIME ZONE 'UTC' END"),
        }
        return expand(templates[column.type], v=value, t=text)

    def _attribute_present(self, column: AttributeColumn) -> Expression:
        marks = ", ".join([self.placeholder] * len(column.keys))
        return (f"COALESCE(jsonb_typeof(jsonb_extract_path({self.quote('attributes')}, {marks})), 'null') <> 'null'",
                column.keys)

"""SQLAlchemy Core definitions of the records table and the audit table, per dialect.

The same shapes are kept as plain DDL in ``sql/<dialect>.sql``; a test creates both and compares
them by inspection, so the two cannot drift apart.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.types import TypeEngine

__all__ = [
    "ADDED_AUDIT_COLUMNS",
    "AUDIT_COUNT_COLUMNS",
    "CONFIRMED_AT_COLUMN",
    "COVERAGE_COLUMN",
    "NOTES_COLUMN",
    "COVERED_COLUMNS",
    "AUDIT_JSON_COLUMNS",
    "DELETED_AT_COLUMN",
    "ERROR_MESSAGE_MAX",
    "GUARD_INDEX_COLUMNS",
    "HISTORY_CONTENT_COLUMNS",
    "LIFECYCLE_COLUMNS",
    "RECORD_COLUMNS",
    "RECORD_JSON_COLUMNS",
    "REJECTED_COLUMN",
    "RETIRED_COLUMN",
    "SCOPE_COLUMN",
    "SUPERSEDED_BY_COLUMN",
    "SUPERSEDED_COLUMN",
    "SUPPORTED_DIALECTS",
    "WIRE_HASH_COLUMN",
    "WITHHELD_COLUMN",
    "audit_index_name",
    "audit_table",
    "column_types",
    "companion_table_name",
    "guard_index_name",
    "history_table",
    "lineage_table",
    "policy_table",
    "promoted_table",
    "record_columns",
    "records_table",
    "rejects_table",
    "rejects_table_name",
    "sources_table",
    "column_type",
]

SUPPORTED_DIALECTS = ("postgresql", "mysql", "sqlite", "duckdb", "snowflake")

# Our columns, in insert order. Extra columns of an existing table are left alone.
RECORD_COLUMNS = (
    "record_ref",
    "display_name",
    "email",
    "phone",
    "lifecycle",
    "identity_match",
    "attributes",
    "sources",
    "_bos_observed_at",
    "_bos_synced_at",
    "_bos_run_id",
    "_bos_record_hash",
)
# SHA-256 of the record's exact bytes as received (see airflow_provider_bos.wire): lets the next run
# skip decoding records that arrive byte-identical. Optional: a table made before it existed syncs
# without it (add it with the ALTER TABLE in sql/ to get the fast re-runs).
WIRE_HASH_COLUMN = "_bos_wire_hash"
AUDIT_JSON_COLUMNS = ("source_errors", "source_summary")
# The records table's JSON columns (JSONB / JSON / JSON text by dialect).
RECORD_JSON_COLUMNS = ("lifecycle", "identity_match", "attributes", "sources")
AUDIT_COUNT_COLUMNS = ("inserted", "updated", "unchanged", "skipped_stale", "duplicates")
# Records quarantined in <table>_rejects. An audit table made before it gets it added by the writer
# (ALTER TABLE ... ADD COLUMN); one that cannot be altered is written and read without it.
REJECTED_COLUMN = "rejected"
# Rows this run retired (no longer returned by a complete full read) and superseded (merged into or
# split across other records of a complete result); the run's scope key (see warehouse/run/reconcile.py).
# Added in place to audit tables made before them, as REJECTED_COLUMN is.
RETIRED_COLUMN = "retired"
SUPERSEDED_COLUMN = "superseded"
SCOPE_COLUMN = "scope"
# Records a partial read returned under a ref that a complete read merged away (its successor still
# current): kept out, not revived. And the read time a complete full read confirmed every current row
# of its scope at (NULL for any other run): a row's last confirmation without rewriting the row.
WITHHELD_COLUMN = "withheld"
CONFIRMED_AT_COLUMN = "confirmed_at"
# How many of the rows a complete or partial run returned had a value in each watched column (JSON:
# {"records": N, "columns": {"email": n, ...}}; see warehouse/run/coverage.py). NULL for a failed run.
COVERAGE_COLUMN = "coverage"
# What a run says for information (a re-hash, the policy's report, what a guard held back and why):
# apart from error_message, which holds only why a run failed or is partial. NULL when there is none.
NOTES_COLUMN = "notes"
# The records table's columns coverage always counts (a writer option adds more).
COVERED_COLUMNS = ("display_name", "email", "phone")
ADDED_AUDIT_COLUMNS = (
    REJECTED_COLUMN, RETIRED_COLUMN, SUPERSEDED_COLUMN, SCOPE_COLUMN, WITHHELD_COLUMN, CONFIRMED_AT_COLUMN,
    COVERAGE_COLUMN, NOTES_COLUMN,
)
# The records table's lifecycle: NULL while the row is current; set when a run retires it, with the
# successor's record_ref when it was superseded. Added in place to records tables made before them.
DELETED_AT_COLUMN = "_bos_deleted_at"
SUPERSEDED_BY_COLUMN = "_bos_superseded_by"
LIFECYCLE_COLUMNS = (DELETED_AT_COLUMN, SUPERSEDED_BY_COLUMN)
# What <table>_history keeps of each version (with _bos_valid_from, _bos_valid_to, _bos_run_id).
HISTORY_CONTENT_COLUMNS = (
    "record_ref", "display_name", "email", "phone", "lifecycle", "identity_match", "attributes", "sources",
    "_bos_observed_at", "_bos_record_hash",
)
ERROR_MESSAGE_MAX = 4000


def column_types(dialect_name: str) -> dict[str, TypeEngine[Any]]:
    """The column types of the given dialect, by role: ``key``, ``text``, ``json``, ``ts``, ``id``, ``hash``."""
    if dialect_name == "postgresql":
        return {
            "key": sa.String(512),
            "text": sa.Text(),
            "json": postgresql.JSONB(),
            "ts": sa.DateTime(timezone=True),
            "id": sa.String(64),
            "hash": sa.String(64),
            "name": sa.String(250),
            "int": sa.BigInteger(),
        }
    if dialect_name == "mysql":
        return {
            "key": sa.String(512),
            "text": mysql.LONGTEXT(),
            "json": mysql.JSON(),
            "ts": mysql.DATETIME(fsp=6),  # UTC, microseconds
            "id": sa.String(64),
            "hash": sa.String(64),
            "name": sa.String(250),
            "int": sa.BigInteger(),
        }
    if dialect_name == "sqlite":
        return {
            "key": sa.String(512),
            "text": sa.Text(),
            "json": sa.Text(),  # JSON text
            "ts": sa.DateTime(),  # UTC as fixed-width 'YYYY-MM-DD HH:MM:SS.ffffff' text: sorts as time
            "id": sa.String(64),
            "hash": sa.String(64),
            "name": sa.String(250),
            "int": sa.BigInteger(),
        }
    if dialect_name == "snowflake":
        from airflow_provider_bos.warehouse.tables.snowflake_types import snowflake_column_types

        return snowflake_column_types()
    if dialect_name == "duckdb":
        return {
            "key": sa.String(),  # DuckDB ignores VARCHAR lengths
            "text": sa.String(),
            "json": sa.JSON(),  # DuckDB's JSON type (text, checked on the way in)
            "ts": sa.DateTime(timezone=True),  # TIMESTAMPTZ
            "id": sa.String(),
            "hash": sa.String(),
            "name": sa.String(),
            "int": sa.BigInteger(),
        }
    raise ValueError(f"unsupported dialect {dialect_name!r}")


def _table_kwargs(dialect_name: str) -> dict[str, Any]:
    if dialect_name == "mysql":
        # InnoDB: transactions. utf8mb4_bin: record_refs that differ only in case are different keys.
        return {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
    return {}


def records_table(
    metadata: sa.MetaData, dialect_name: str, name: str = "bos_records", schema: str | None = None
) -> sa.Table:
    """The records table keyed by ``record_ref``."""
    t = column_types(dialect_name)
    table = sa.Table(
        name,
        metadata,
        sa.Column("record_ref", t["key"], primary_key=True, nullable=False),
        sa.Column("display_name", t["text"], nullable=True),
        sa.Column("email", t["text"], nullable=True),
        sa.Column("phone", t["text"], nullable=True),
        sa.Column("lifecycle", t["json"], nullable=True),
        sa.Column("identity_match", t["json"], nullable=True),
        sa.Column("attributes", t["json"], nullable=False),
        sa.Column("sources", t["json"], nullable=False),
        sa.Column("_bos_observed_at", t["ts"], nullable=False),
        sa.Column("_bos_synced_at", t["ts"], nullable=False),
        sa.Column("_bos_run_id", t["id"], nullable=False),
        sa.Column("_bos_record_hash", t["hash"], nullable=False),
        sa.Column(WIRE_HASH_COLUMN, t["hash"], nullable=True),
        sa.Column(DELETED_AT_COLUMN, t["ts"], nullable=True),
        sa.Column(SUPERSEDED_BY_COLUMN, t["key"], nullable=True),
        schema=schema,
        **_table_kwargs(dialect_name),
    )
    if dialect_name == "mysql":
        # InnoDB's primary key holds the whole row; past the buffer pool, the change test's join
        # reads every stored row from disk. This index answers it alone (with FORCE INDEX: MariaDB
        # keeps choosing the primary key). 200k unchanged rows: 19 s -> 2.3 s. The wire hash is in it
        # too, so verifying known rows stays inside the index.
        sa.Index(guard_index_name(name), *(table.c[c] for c in (*GUARD_INDEX_COLUMNS, WIRE_HASH_COLUMN)))
    return table


def guard_index_name(table_name: str) -> str:
    """Name of the MySQL covering index of the change test; hashed past 63 characters."""
    name = f"ix_{table_name}_guard"
    if len(name) <= 63:
        return name
    return "ix_bos_guard_" + hashlib.sha256(table_name.encode()).hexdigest()[:40]


#: The columns of the covering index, in order.
GUARD_INDEX_COLUMNS = ("record_ref", "_bos_record_hash", "_bos_observed_at")


def audit_index_name(table_name: str) -> str:
    """Name of the lookup index; hashed when ``ix_<table>_lookup`` would pass 63 characters."""
    name = f"ix_{table_name}_lookup"
    if len(name) <= 63:
        return name
    return "ix_bos_audit_" + hashlib.sha256(table_name.encode()).hexdigest()[:40]


def audit_table(
    metadata: sa.MetaData, dialect_name: str, name: str = "bos_sync_runs", schema: str | None = None,
    *, omit: Collection[str] = (),
) -> sa.Table:
    """The audit table: one row per sync run (``complete``, ``partial`` or ``failed``).

    ``omit``: columns of :data:`ADDED_AUDIT_COLUMNS` an audit table made before them lacks (never
    created so).
    """
    t = column_types(dialect_name)
    table = sa.Table(
        name,
        metadata,
        sa.Column("run_id", t["id"], primary_key=True, nullable=False),
        sa.Column("dag_id", t["name"], nullable=True),
        sa.Column("task_id", t["name"], nullable=True),
        sa.Column("airflow_run_id", t["name"], nullable=True),
        sa.Column("conn_id", t["name"], nullable=True),
        sa.Column("context_handle", sa.String(255), nullable=True),
        sa.Column("tool_name", sa.String(255), nullable=True),
        sa.Column("arguments_hash", t["hash"], nullable=True),
        sa.Column("started_at", t["ts"], nullable=True),
        sa.Column("finished_at", t["ts"], nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("completeness", sa.String(32), nullable=True),
        sa.Column("result_count", t["int"], nullable=True),
        *(sa.Column(c, t["int"], nullable=True) for c in AUDIT_COUNT_COLUMNS),
        *(sa.Column(c, t["int"], nullable=True) for c in (REJECTED_COLUMN, RETIRED_COLUMN, SUPERSEDED_COLUMN)
          if c not in omit),
        *((sa.Column(SCOPE_COLUMN, t["hash"], nullable=True),) if SCOPE_COLUMN not in omit else ()),
        *((sa.Column(WITHHELD_COLUMN, t["int"], nullable=True),) if WITHHELD_COLUMN not in omit else ()),
        *((sa.Column(CONFIRMED_AT_COLUMN, t["ts"], nullable=True),) if CONFIRMED_AT_COLUMN not in omit else ()),
        *((sa.Column(COVERAGE_COLUMN, t["json"], nullable=True),) if COVERAGE_COLUMN not in omit else ()),
        *((sa.Column(NOTES_COLUMN, t["text"], nullable=True),) if NOTES_COLUMN not in omit else ()),
        sa.Column("provisional_records", t["int"], nullable=True),
        sa.Column("provisional_pages", t["int"], nullable=True),
        sa.Column("source_errors", t["json"], nullable=True),
        sa.Column("source_summary", t["json"], nullable=True),
        sa.Column("error_message", t["text"], nullable=True),
        sa.Column("destination_table", sa.String(200), nullable=True),
        schema=schema,
        **_table_kwargs(dialect_name),
    )
    _index(dialect_name, audit_index_name(name), table.c.conn_id, table.c.context_handle, table.c.tool_name,
           table.c.finished_at)
    return table


def companion_table_name(records_table_name: str, suffix: str) -> str:
    """``<table>_<suffix>``: a table kept beside the records table (rejects, history, lineage).

    A table name too long for the suffix keeps its first 38 characters and a hash of the whole
    name: ``<first 38>_<16 hex>_<suffix>``, at most 63 characters, one per table.
    """
    name = f"{records_table_name}_{suffix}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(records_table_name.encode()).hexdigest()[:16]
    return f"{records_table_name[:38]}_{digest}_{suffix}"


def rejects_table_name(records_table_name: str) -> str:
    """``<table>_rejects``: where ``invalid_records="quarantine"`` puts the records the table cannot store."""
    return companion_table_name(records_table_name, "rejects")


def history_table(metadata: sa.MetaData, dialect_name: str, name: str, schema: str | None = None) -> sa.Table:
    """``<table>_history`` (``history=True``): every version of every record, SCD2 style.

    A version is valid from ``_bos_valid_from`` until ``_bos_valid_to`` (NULL: the current one);
    ``_bos_run_id`` is the run that wrote it. The key is (record_ref, _bos_valid_from).
    """
    t = column_types(dialect_name)
    roles = {"record_ref": "key", "display_name": "text", "email": "text", "phone": "text", "lifecycle": "json",
             "identity_match": "json", "attributes": "json", "sources": "json", "_bos_observed_at": "ts",
             "_bos_record_hash": "hash"}
    required = {"record_ref", "attributes", "sources", "_bos_observed_at", "_bos_record_hash"}
    table = sa.Table(
        name,
        metadata,
        *(sa.Column(c, t[roles[c]], nullable=c not in required, primary_key=c == "record_ref")
          for c in HISTORY_CONTENT_COLUMNS),
        sa.Column("_bos_valid_from", t["ts"], primary_key=True, nullable=False),
        sa.Column("_bos_valid_to", t["ts"], nullable=True),
        sa.Column("_bos_run_id", t["id"], nullable=False),
        schema=schema,
        **_table_kwargs(dialect_name),
    )
    _index(dialect_name, _index_name(name, "run"), table.c._bos_run_id)
    return table


def lineage_table(metadata: sa.MetaData, dialect_name: str, name: str, schema: str | None = None) -> sa.Table:
    """``<table>_lineage``: which record_ref was superseded by which, in which run.

    One row per (superseded ref, successor ref) and run: a merge gives several rows with the same
    ``successor_ref``, a split several with the same ``record_ref``.
    """
    t = column_types(dialect_name)
    table = sa.Table(
        name,
        metadata,
        sa.Column("run_id", t["id"], nullable=False),
        sa.Column("record_ref", t["key"], nullable=False),
        sa.Column("successor_ref", t["key"], nullable=False),
        sa.Column("recorded_at", t["ts"], nullable=False),
        schema=schema,
        **_table_kwargs(dialect_name),
    )
    # No primary key: (run, ref, successor) would pass InnoDB's 3072-byte key limit.
    _index(dialect_name, _index_name(name, "ref"), table.c.record_ref)
    _index(dialect_name, _index_name(name, "successor"), table.c.successor_ref)
    return table


def sources_table(metadata: sa.MetaData, dialect_name: str, name: str, schema: str | None = None) -> sa.Table:
    """``<table>_sources``: one row per provenance entry of every row of the records table.

    Keyed by (record_ref, entry_index), the entry's place in the record's ``sources`` array (as
    dlt's child tables carry ``_dlt_list_idx``); the entry index on (source_type, source_identity,
    external_id) makes "the current record holding this entry" one look-up (not on DuckDB, below).
    ``is_current`` follows the record (false once it is retired or superseded). Observation times
    stay out: an entry re-stamped by a later read is the same entry. Maintained by :mod:`.provenance`.
    """
    t = column_types(dialect_name)
    # DuckDB: no key. Its unique indexes refuse a key deleted and inserted again in one transaction,
    # which is how a changed record's entries are rewritten.
    keyed = dialect_name != "duckdb"
    table = sa.Table(
        name,
        metadata,
        sa.Column("record_ref", t["key"], nullable=False, primary_key=keyed),
        sa.Column("entry_index", t["int"], nullable=False, primary_key=keyed),
        *(sa.Column(c, t["key"], nullable=True)
          for c in ("source_type", "source_identity", "external_id", "record_type", "version")),
        sa.Column("capabilities", t["json"], nullable=True),
        sa.Column("is_current", sa.Boolean(), nullable=False),
        schema=schema,
        **_table_kwargs(dialect_name),
    )
    entry = (table.c.source_type, table.c.source_identity, table.c.external_id)
    if dialect_name == "mysql":
        # InnoDB keys hold at most 3072 bytes (768 utf8mb4 characters): a prefix of each column
        # finds the entry; the rest is compared on the row.
        sa.Index(_index_name(name, "entry"), *entry,
                 mysql_length={"source_type": 128, "source_identity": 256, "external_id": 384})
    elif dialect_name != "duckdb":
        # Not on DuckDB: its planner uses an index only for a predicate on that index's one column,
        # never for this entry's three, nor in supersession's joins; its zone maps answer the look-up
        # (2.3 ms at 1M entries, with that index or without), and the index cost every write.
        _index(dialect_name, _index_name(name, "entry"), *entry)
    return table


def policy_table(metadata: sa.MetaData, dialect_name: str, name: str, schema: str | None = None) -> sa.Table:
    """``<table>_policy``: the personal-data policy the records table was written with, one row (see
    :mod:`.policy_store`): its fingerprint text, when it was set and by which run. Made by the first
    run with a policy; never holds the key."""
    t = column_types(dialect_name)
    return sa.Table(
        name,
        metadata,
        sa.Column("fingerprint", t["text"], nullable=False),
        sa.Column("set_at", t["ts"], nullable=False),
        sa.Column("run_id", t["id"], nullable=True),
        schema=schema,
        **_table_kwargs(dialect_name),
    )


def rejects_table(metadata: sa.MetaData, dialect_name: str, name: str, schema: str | None = None) -> sa.Table:
    """The rejects table: one row per quarantined record (see :mod:`.rejects`).

    ``record_ref`` is text (an over-long ref is one reason to be here), ``record`` the record's
    JSON bytes, cut at :data:`~.rejects.MAX_REJECT_BYTES` with ``truncated`` set.
    """
    t = column_types(dialect_name)
    blob = {"postgresql": postgresql.BYTEA(), "mysql": mysql.LONGBLOB()}.get(dialect_name, sa.LargeBinary())
    table = sa.Table(
        name,
        metadata,
        sa.Column("run_id", t["id"], nullable=False),
        sa.Column("record_ref", t["text"], nullable=True),
        sa.Column("reason", t["text"], nullable=False),
        sa.Column("record", blob, nullable=False),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.Column("rejected_at", t["ts"], nullable=False),
        schema=schema,
        **_table_kwargs(dialect_name),
    )
    _index(dialect_name, _index_name(name, "run"), table.c.run_id)
    return table


def _index(dialect_name: str, name: str, *columns: sa.Column[Any]) -> None:
    """Index ``columns`` where the database has indexes: standard Snowflake tables do not (its
    micro-partitions are pruned by min/max instead; a clustering key is the DBA's call)."""
    if dialect_name != "snowflake":
        sa.Index(name, *columns)


def _index_name(table_name: str, role: str) -> str:
    name = f"ix_{table_name}_{role}"
    return name if len(name) <= 63 else f"ix_bos_{role}_" + hashlib.sha256(table_name.encode()).hexdigest()[:40]


def column_type(dialect_name: str, kind: str) -> TypeEngine[Any]:
    """The SQL type of a promoted attribute column of ``kind`` on ``dialect_name`` (the DDL in sql/ shows
    each; the kinds: :data:`~.attribute_columns.ATTRIBUTE_TYPES`)."""
    roles = {"text": "text", "integer": "int", "timestamp": "ts", "json": "json"}
    if kind in roles:
        return column_types(dialect_name)[roles[kind]]
    if kind == "boolean":
        return sa.Boolean()
    if dialect_name == "mysql":
        return mysql.DOUBLE()
    if dialect_name in ("postgresql", "duckdb"):
        return postgresql.DOUBLE_PRECISION()
    return sa.Float()  # SQLite REAL; Snowflake FLOAT (both 64-bit)


def record_columns(dialect_name: str, promoted: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """``(column, SQL type)`` of the records table on ``dialect_name`` (e.g. for lineage schema facets),
    and then of its promoted attribute columns, ``promoted`` (``(name, kind)`` each, see
    :mod:`.attribute_columns`).

    ``dialect_name`` is a SQLAlchemy backend name; ``"mariadb"`` counts as ``"mysql"``.
    """
    name = "mysql" if dialect_name == "mariadb" else dialect_name
    if name == "snowflake":
        from airflow_provider_bos.warehouse.tables.snowflake_types import snowflake_sa_dialect

        compiler_dialect: sa.Dialect = snowflake_sa_dialect()
    else:
        compilers = {"postgresql": postgresql.dialect, "mysql": mysql.dialect, "sqlite": sqlite.dialect}
        compiler_dialect = compilers[name]() if name in compilers else sa.engine.URL.create(name).get_dialect()()
    table = records_table(sa.MetaData(), name)
    return [(c.name, c.type.compile(dialect=compiler_dialect)) for c in table.columns] + [
        (column, column_type(name, kind).compile(dialect=compiler_dialect)) for column, kind in promoted]


def promoted_table(metadata: sa.MetaData, dialect_name: str, name: str, schema: str | None = None) -> sa.Table:
    """``<table>_columns``: the promoted attribute columns the records table is filled for, one row
    each (see :mod:`.attribute_columns`): its path and type, the personal-data policy the stored
    ``attributes`` were under (SHA-256 of its fingerprint; NULL: none), when it was filled and by
    which run. A column without its matching row (new, re-mapped, mapped again after a run without
    it, or a policy applied since) is filled from the stored ``attributes`` by the next run that
    configures it."""
    t = column_types(dialect_name)
    return sa.Table(
        name,
        metadata,
        sa.Column("column_name", t["name"], primary_key=True, nullable=False),
        sa.Column("path", t["text"], nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("policy", t["hash"], nullable=True),
        sa.Column("filled_at", t["ts"], nullable=False),
        sa.Column("run_id", t["id"], nullable=True),
        schema=schema,
        **_table_kwargs(dialect_name),
    )

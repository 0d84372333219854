"""The warehouse room: where a sync's final records and its audit row land.

Knows nothing of HTTP, MCP or Airflow: it takes a SQLAlchemy engine and FederatedRecord objects
(or dicts with the same fields), and ``KnownRecord`` claims for records that arrived byte-identical
to stored ones. Its only contract with the read is :mod:`airflow_provider_bos.wire`.

One module per concept (one sync's write, top-down: ``upsert`` -> ``transaction`` -> ``loads`` /
``file_load`` -> ``settle`` -> ``reconcile`` -> ``audit``):

- ``upsert``: the writer: the tables, and one run's transaction skeleton.
- ``transaction``: one run's connection: lock, dedupe, classify, merge.
- ``loads``: staging (COPY or executemany), the direct load, the key filter; the ``Loader``s.
- ``file_load``: the staged-file loader (DuckDB).
- ``settle``: a load's typed outcome, and the one function that classifies and merges it.
- ``claims``: known records: stored wire hashes, kept claims, the state token.
- ``reconcile``: supersede, retire and history after the merge.
- ``coverage``: how many of the rows a run returned have a value per watched column (the audit row's).
- ``history``: every version of every record (``history=True``).
- ``provenance``: ``<table>_sources``, one row per provenance entry, kept in the run's transaction.
- ``rehash``: the one-time re-hash of rows hashed with their observation stamps.
- ``rejects``: quarantined records.
- ``audit``: the audit row and its reader.
- ``erase``: erasure on request; ``erase_finders``: the refs an email, phone or external id names.
- ``policy_store``: the personal-data policy a table was written with (``<table>_policy``).
- ``pii_apply``: a stricter personal-data policy re-applied to stored rows (``pii-apply``).
- ``scan``: every row of a table in batches (keyset pagination).
- ``reclaim``: the space an erasure freed, given back.
- ``dialects/``: the SQL text per database, and each database's capabilities.
- ``copy_format``: COPY text encoders.
- ``records``: record -> row and its hash.
- ``schema``: table definitions.
- ``catalog``: a table's columns, as the database says.
- ``identifiers``: name validation.
- ``stage_dir``: the private directory of a run's staged files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_bos.warehouse.audit import RUN_STATUSES, AuditReader, SyncRunInfo
from airflow_provider_bos.warehouse.dialects import WarehouseDialect, dialect_for
from airflow_provider_bos.warehouse.identifiers import validate_identifier, validate_schema
from airflow_provider_bos.warehouse.records import RecordRow, canonical_json, hash_arguments, record_to_row
from airflow_provider_bos.warehouse.schema import RECORD_COLUMNS, audit_table, record_columns, records_table
from airflow_provider_bos.warehouse.upsert import UpsertCounts, WarehouseWriter
from airflow_provider_bos.wire import WriteOptions

__all__ = [
    "RECORD_COLUMNS",
    "RUN_STATUSES",
    "AuditReader",
    "RecordRow",
    "SyncRunInfo",
    "UpsertCounts",
    "WarehouseDialect",
    "WarehouseWriter",
    "WriteOptions",
    "audit_table",
    "canonical_json",
    "dialect_for",
    "hash_arguments",
    "record_columns",
    "record_to_row",
    "records_table",
    "validate_identifier",
    "validate_schema",
]


if TYPE_CHECKING:
    from airflow_provider_bos.wire import RecordSink

    # Checked by mypy, never run: the writer is the RecordSink that run_sync is typed against.
    def _sink_for_run_sync(writer: WarehouseWriter) -> RecordSink:
        return writer

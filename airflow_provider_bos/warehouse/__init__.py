"""The warehouse room: where a sync's final records and its audit row land.

Knows nothing of HTTP, MCP or Airflow: it takes a SQLAlchemy engine and FederatedRecord objects
(or dicts with the same fields), and ``KnownRecord`` claims for records that arrived byte-identical
to stored ones. Its only contract with the read is :mod:`airflow_provider_bos.wire`.

Four rooms and the writer, read top-down as one sync's write; each room imports only the rooms
before it here (docs/architecture.md, "Inside warehouse/"):

- ``tables/``: what the tables are: definitions per dialect, record -> row and its hash, stored JSON
  read back, promoted attributes, and ``companions/``: each table beside the records table as an
  object the writer, erasure, ``pii-apply`` and reclaim iterate.
- ``dialects/``: the SQL text of each database and what it can do (its load method, as data).
- ``run/``: one run's transaction: lock, load (COPY, executemany, staged file), settle, reconcile
  (supersede, retire, history), coverage, the audit row and its reader.
- ``writer.py``: ``WarehouseWriter``: the tables ensured, one run's skeleton top-down in ``_write``.
- ``upkeep/``: on request: erasure and its finders, ``pii-apply``, reclaim, a table in batches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_bos.warehouse.dialects import WarehouseDialect, dialect_for
from airflow_provider_bos.warehouse.run.audit import RUN_STATUSES, AuditReader, SyncRunInfo
from airflow_provider_bos.warehouse.tables.identifiers import validate_identifier, validate_schema
from airflow_provider_bos.warehouse.tables.records import (
    RecordRow,
    canonical_json,
    hash_arguments,
    record_to_row,
)
from airflow_provider_bos.warehouse.tables.schema import (
    RECORD_COLUMNS,
    audit_table,
    record_columns,
    records_table,
)
from airflow_provider_bos.warehouse.writer import UpsertCounts, WarehouseWriter
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

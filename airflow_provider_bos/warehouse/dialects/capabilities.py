"""What one database can do, one frozen object per dialect (``dialect.capabilities``), as dlt's
``DestinationCapabilitiesContext``: read per run or per batch, never per record."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["DialectCapabilities", "LoadMethod"]


class LoadMethod(enum.StrEnum):
    """How a database's rows travel into it. Data, not a loader: a dialect describes its database and
    holds nothing of the run, which maps the method to its loader (:func:`~..load_methods.loader_for`)."""

    #: Chunked ``executemany`` of column-staged rows.
    ROWS = "rows"
    #: COPY from the client (PostgreSQL with psycopg 3): rows travel as hashed documents.
    COPY = "copy"
    #: A staged NDJSON file the database reads itself (DuckDB).
    FILE = "file"


@dataclass(frozen=True, slots=True)
class DialectCapabilities:
    """One database's capabilities; the defaults are a plain ``executemany`` database's."""

    #: How rows reach the database (COPY, chunked ``executemany`` or a staged file).
    load_method: LoadMethod = LoadMethod.ROWS
    #: An empty target (under the writers' lock) is loaded directly, not staged and merged.
    direct_load: bool = True
    #: Any DDL commits the open transaction (Snowflake): staging is made first and dropped after the commit.
    ddl_commits: bool = False
    #: Rows per staging/insert chunk at most (a statement-size limit); None: the writer's batch_size.
    max_batch_rows: int | None = None
    #: Isolation the run's connection is put in; None: the engine's.
    isolation_level: str | None = None
    #: The writers' lock is taken before staging: the snapshot starts at the first read (MySQL, DuckDB).
    lock_before_staging: bool = False
    #: Temporary tables outlive a rollback (MySQL): the writer drops them itself after one.
    temp_tables_survive_rollback: bool = False
    #: The records table has a covering index of the change test the merge should name (MySQL).
    uses_guard_index: bool = False
    #: The lifecycle anti-joins read the run's keys from a keyed copy of staging (MariaDB would scan
    #: keyless staging once per stored row).
    keyed_run_keys: bool = False
    #: ``wire_hash_prefixes`` returns ONE value (all prefixes, sorted, concatenated) and the state token.
    wire_hash_prefixes_aggregated: bool = False
    #: Rows rewritten in place (``pii-apply``) go back through a staged file and one ``UPDATE ... FROM``
    #: (DuckDB: one ``UPDATE`` per row costs it ~0.7 ms, which grows with the transaction's changes).
    updates_from_file: bool = False
    #: ``pii-apply`` reads a table and its versions in one query ordered by record_ref (DuckDB: a batch
    #: ordered by key is a scan of the whole table, having no index range scan: one sort of both
    #: tables cost a quarter of the batches at 200k rows). Only where nothing else runs on the
    #: connection until the last row is read (the staged file's updates).
    reads_in_one_pass: bool = False
    #: ``pii-apply`` reads the next rounds on a second connection that imports the transaction's
    #: snapshot, while the transaction updates the last round (PostgreSQL: ``pg_export_snapshot``;
    #: :mod:`..upkeep.snapshot_reader`).
    reads_beside_writes: bool = False
    #: Keys compare ignoring trailing spaces (MySQL/MariaDB's ``PAD SPACE`` collations): a record_ref
    #: ending in a space would be another ref's key, so it is refused and only ever quarantined.
    keys_ignore_trailing_spaces: bool = False
    #: The deepest JSON value the JSON columns accept (MariaDB's ``JSON_VALID``: 31 levels); a record
    #: holding a deeper one is refused like any record the table cannot store. None: no limit short of
    #: the read's own.
    max_json_depth: int | None = None
    #: ``stored_wire_state``'s last value is the number of current rows (an unchanged re-run proves
    #: it returned every current row without a join).
    wire_state_counts_current: bool = False

    @property
    def uses_copy(self) -> bool:
        """COPY from the client (PostgreSQL with psycopg 3): rows travel as hashed documents."""
        return self.load_method is LoadMethod.COPY

    @property
    def document_staging(self) -> bool:
        """Staging holds (record_ref, document, observed_at, hashes), not a column per field: with COPY,
        one serialisation per record instead of eight; the merge derives the columns."""
        return self.uses_copy
